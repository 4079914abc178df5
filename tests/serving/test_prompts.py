"""Prompt synthesis: exact token counts, identical blocks for identical block ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.loadgen import PromptSynthesizer, PromptTokenizer, TraceRequest


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> PromptTokenizer:
    return PromptTokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def synthesizer(tokenizer: PromptTokenizer) -> PromptSynthesizer:
    return PromptSynthesizer(tokenizer, seed=3)


@pytest.mark.parametrize("num_tokens", [1, 2, 3, 100, 511, 512, 513, 1024, 1537, 5000])
def test_completion_prompts_have_exact_token_counts(
    synthesizer: PromptSynthesizer, tokenizer: PromptTokenizer, num_tokens: int
) -> None:
    request = TraceRequest(arrival_s=0.0, num_prompt_tokens=num_tokens, num_output_tokens=1)
    prompt = synthesizer.synthesize(request, request_index=7)
    counted = len(tokenizer.encode(prompt.text, add_special_tokens=True))
    expected = max(num_tokens, 1 + synthesizer.overhead_tokens)  # never less than one content token
    assert counted == expected == prompt.num_prompt_tokens


@pytest.mark.parametrize("num_tokens", [40, 600, 2000])
def test_chat_prompts_have_exact_token_counts_with_the_template(
    tokenizer: PromptTokenizer, num_tokens: int
) -> None:
    synthesizer = PromptSynthesizer(tokenizer, seed=3, chat=True)
    prompt = synthesizer.synthesize(TraceRequest(0.0, num_tokens, 1), request_index=0)
    hf = tokenizer._hf
    rendered = hf.apply_chat_template(
        [{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=False
    )
    assert len(hf.encode(rendered, add_special_tokens=False)) == num_tokens == prompt.num_prompt_tokens


def test_identical_block_ids_give_identical_token_blocks(
    synthesizer: PromptSynthesizer, tokenizer: PromptTokenizer
) -> None:
    a = synthesizer.synthesize(TraceRequest(0.0, 3 * 512 + 1, 1, hash_ids=(10, 11, 12, 13)), request_index=0)
    b = synthesizer.synthesize(TraceRequest(1.0, 3 * 512 + 1, 1, hash_ids=(10, 11, 99, 13)), request_index=1)
    ids_a = tokenizer.encode(a.text, add_special_tokens=True)
    ids_b = tokenizer.encode(b.text, add_special_tokens=True)
    shared = 1 + 2 * 512  # BOS + two identical blocks
    assert ids_a[:shared] == ids_b[:shared]
    assert ids_a[shared : shared + 512] != ids_b[shared : shared + 512]
    assert a.num_shared_blocks == b.num_shared_blocks == 3  # 1536 content tokens: three blocks


def test_partial_last_block_is_the_start_of_its_block(
    synthesizer: PromptSynthesizer, tokenizer: PromptTokenizer
) -> None:
    full = synthesizer.synthesize(TraceRequest(0.0, 2 * 512 + 1, 1, hash_ids=(5, 6)), request_index=0)
    part = synthesizer.synthesize(TraceRequest(0.0, 512 + 101, 1, hash_ids=(5, 6)), request_index=1)
    assert full.text.startswith(part.text)
    assert len(tokenizer.encode(part.text, add_special_tokens=True)) == 512 + 101


def test_requests_without_block_ids_share_nothing(synthesizer: PromptSynthesizer) -> None:
    a = synthesizer.synthesize(TraceRequest(0.0, 600, 1), request_index=0)
    b = synthesizer.synthesize(TraceRequest(0.0, 600, 1), request_index=1)
    assert a.text[:200] != b.text[:200]
    assert a.num_shared_blocks == 0


def test_same_seed_same_text_other_seed_other_text(tokenizer: PromptTokenizer) -> None:
    request = TraceRequest(0.0, 300, 1, hash_ids=(1,))
    one = PromptSynthesizer(tokenizer, seed=1).synthesize(request, request_index=0)
    again = PromptSynthesizer(tokenizer, seed=1).synthesize(request, request_index=0)
    other = PromptSynthesizer(tokenizer, seed=2).synthesize(request, request_index=0)
    assert one.text == again.text
    assert one.text != other.text


def test_prompt_cap_keeps_leading_blocks(synthesizer: PromptSynthesizer) -> None:
    long = TraceRequest(0.0, 40_000, 1, hash_ids=tuple(range(100, 179)))
    capped = synthesizer.synthesize(long, request_index=0, max_prompt_tokens=1200)
    uncapped_start = synthesizer.synthesize(
        TraceRequest(0.0, 1200, 1, hash_ids=(100, 101, 102)), request_index=5
    )
    assert capped.num_prompt_tokens == 1200
    assert capped.text == uncapped_start.text


def test_repr_never_shows_prompt_text(synthesizer: PromptSynthesizer) -> None:
    prompt = synthesizer.synthesize(TraceRequest(0.0, 50, 1), request_index=0)
    assert prompt.text.strip()[:10] not in repr(prompt)
    assert "text" not in repr(prompt)


def test_a_tokenizer_is_loaded_once_per_process_while_its_files_are_unchanged(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    import shutil

    from serving.loadgen.runner import load_tokenizer
    from serving.loadgen.tokenizer import TokenizerUnavailable

    copy = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, copy)
    first = load_tokenizer(copy)
    assert load_tokenizer(copy) is first  # one request after another: not reloaded
    assert load_tokenizer(copy.parent / "." / "tok") is first  # the same files by another path
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text() + "\n")  # a file changed: loaded afresh
    second = load_tokenizer(copy)
    assert second is not first
    assert second.encode("hello world") == first.encode("hello world")
    with pytest.raises(TokenizerUnavailable, match="does not exist"):
        load_tokenizer(tmp_path / "missing")


def test_the_word_pool_is_built_once_per_tokenizer_and_seed(tokenizer: PromptTokenizer) -> None:
    """A replay per single request (sim_gpu_isolated.measure_lengths) builds a synthesizer each
    time; the pool, a pass over the whole vocabulary, is built once per (tokenizer, seed), and a
    synthesizer from the kept pool writes the same text as the first."""
    from serving.loadgen.prompts import word_pool

    first = PromptSynthesizer(tokenizer, seed=41)
    built = word_pool.cache_info().misses
    again = PromptSynthesizer(tokenizer, seed=41)
    assert word_pool.cache_info().misses == built
    assert again.pool_size == first.pool_size
    request = TraceRequest(0.0, 700, 1, hash_ids=(5, 6))
    assert again.synthesize(request, request_index=2).text == first.synthesize(request, request_index=2).text
    PromptSynthesizer(tokenizer, seed=42)
    assert word_pool.cache_info().misses == built + 1
