"""Format details: detection, OpenAI-style logs, BurstGPT failures, tokenizers, prefix hashing."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from tuning.workload import ApproxTokenizer, HuggingFaceTokenizer, IngestResult, TraceError, ingest
from tuning.workload.tokenizer import Tokenizer


def run(data: str, **options: Any) -> IngestResult:
    return ingest(io.BytesIO(data.encode()), **options)


class WordTokenizer:
    """One token per whitespace-separated word; ids from a growing vocabulary."""

    name = "test-words"

    def __init__(self) -> None:
        self.vocabulary: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocabulary.setdefault(word, len(self.vocabulary)) for word in text.split()]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "mooncake"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}', "mooncake"),
        ('{"timestamp": 0, "usage": {"prompt_tokens": 1, "completion_tokens": 1}}', "openai"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "azure"),
        ("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n", "azure"),
        ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n", "burstgpt"),
    ],
)
def test_detection(text: str, expected: str) -> None:
    from tuning.workload.formats import detect_format
    from tuning.workload.reader import LineReader

    reader = LineReader(io.BytesIO(text.encode()), max_bytes=1 << 20, max_line_bytes=1 << 20)
    assert detect_format(reader) == expected


def test_openai_reported_counts_win_and_no_tokenizer_is_named() -> None:
    lines = [
        {"created": 1_700_000_000 + i, "usage": {"prompt_tokens": 100 + i, "completion_tokens": 7}}
        for i in range(5)
    ]
    profile = run("\n".join(json.dumps(x) for x in lines)).profile
    assert profile.input_tokens.max == 104
    assert profile.output_tokens.mean == 7
    assert profile.tokenizer is None
    assert profile.prefix.reuse_ratio is None  # no prompt text: no prefix information
    assert profile.duration_s == 4.0


def test_openai_iso_times_nested_request_response_and_failures() -> None:
    lines = [
        {
            "created_at": "2024-11-30T07:00:00.250Z",
            "request": {"messages": [{"role": "user", "content": "hello there friend"}]},
            "response": {"choices": [{"message": {"content": "hi you"}}]},
        },
        {"created_at": "2024-11-30T07:00:01.250+00:00", "prompt": "a b c d", "completion": "x"},
        {"created_at": "2024-11-30T07:00:01.500", "prompt": "q", "status_code": 500},
        {"created_at": "2024-11-30T07:00:02.250", "prompt": "a b", "error": {"code": "overloaded"}},
        {"created_at": "2024-11-30T09:00:03.250+02:00", "prompt": "a b c d e", "completion": "y z"},
    ]
    profile = run("\n".join(json.dumps(x) for x in lines), tokenizer=WordTokenizer()).profile
    assert profile.num_requests == 3
    assert profile.num_failed_requests == 2
    assert profile.duration_s == 3.0
    assert profile.tokenizer == "test-words"
    assert profile.output_tokens.max == 2


def test_openai_shared_prefix_reuse_is_exact_with_small_blocks() -> None:
    system = " ".join(f"w{i}" for i in range(8))
    lines = [
        {"timestamp": 0, "prompt": system, "completion": "a"},  # 8 tokens, blocks [A, B]
        {"timestamp": 1, "prompt": system + " x1 x2 x3 x4", "completion": "a"},  # [A, B, C]: 8 reused
        {"timestamp": 2, "prompt": "other " + system, "completion": "a"},  # shifted: nothing reused
    ]
    result = run("\n".join(json.dumps(x) for x in lines), tokenizer=WordTokenizer(), block_size_tokens=4)
    assert result.profile.prefix.block_size_tokens == 4
    assert result.profile.prefix.reuse_ratio == pytest.approx(8 / (8 + 12 + 9))
    assert result.columns.prefix_hit_tokens is not None
    assert result.columns.prefix_hit_tokens.tolist() == [0, 8, 0]


def test_tokenizers_satisfy_the_protocol() -> None:
    assert isinstance(ApproxTokenizer(), Tokenizer)
    assert isinstance(WordTokenizer(), Tokenizer)

    class FakeHF:
        name_or_path = "local/tiny-llama"

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            assert add_special_tokens is False
            return [ord(c) for c in text]

    wrapped = HuggingFaceTokenizer(FakeHF())
    assert wrapped.name == "hf:local/tiny-llama"
    assert list(wrapped.encode("abc")) == [97, 98, 99]
    assert "abc" not in repr(wrapped)


def test_approx_tokenizer_is_deterministic_and_plausible() -> None:
    tokenizer = ApproxTokenizer()
    text = "The patient was admitted on 2023-11-16 with a temperature of 38.5 degrees."
    ids = tokenizer.encode(text)
    assert ids == ApproxTokenizer().encode(text)
    words = len(text.split())
    assert words <= len(ids) <= 3 * words
    assert tokenizer.encode("") == []
    assert len(tokenizer.encode("日本語")) == 3


def test_burstgpt_counts_failures_separately() -> None:
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
        "130.5,ChatGPT,100,20,120,API log\n"
    )
    profile = run(text).profile
    assert profile.trace_format == "burstgpt"
    assert profile.num_requests == 3
    assert profile.num_failed_requests == 1
    assert profile.duration_s == 125.5
    assert profile.input_tokens.max == 472


def test_burstgpt_bad_timestamp_names_the_line() -> None:
    text = "Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,1,1\nsoon,ChatGPT,1,1\n"
    with pytest.raises(TraceError, match=r"^line 3: `Timestamp` is not a number of seconds"):
        run(text)


def test_progress_is_reported() -> None:
    seen: list[int] = []
    lines = [json.dumps({"timestamp": i, "input_length": 1, "output_length": 1}) for i in range(100)]
    data = "\n".join(lines)
    run(data, progress=seen.append)
    assert seen and seen[-1] == len(data.encode())
