"""Issue 19 items 5 and 6 without an engine.

The gate's golden set drawn from the customer's own prompts (an OpenAI-style log, the model's
own tokenizer), kept in the job's work dir only and judged by the real gate on teacher-forced
log-probabilities of the real (random-weight) model; and lengths scaled by a stated factor
instead of clipped, with the factor and the share shortened in the caps line and the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.models import build_tiny_model
from tuning.commands import tune
from tuning.search import gates
from tuning.search.job import JobSpec, JobSpecError, Prepared, plan_job, report, validate
from tuning.search.space import PRECISION
from tuning.workload import TraceError
from tuning.workload.prompts import draw_prompts, model_tokenizer
from tuning.workload.synth import SyntheticTrace, scale_lengths

MARK = "ACCT-"  # every successful prompt ends with its account reference
FAILED = "FAILEDREQ"  # only in prompts of failed requests, which are never drawn
WORDS = ("invoice", "refund", "account", "password", "shipping", "order", "delayed", "please", "help", "why")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "llama-xs"
    build_tiny_model(arch="llama", size="xs", out_dir=out, seed=0)
    return out


def _chat_log(path: Path, n: int = 240) -> list[str]:
    """A support team's chat log; returns the user messages of the successful requests."""
    rng = random.Random(7)
    texts, t = [], 1_700_000_000.0
    with path.open("w") as out:
        for i in range(n):
            t += rng.expovariate(2.0)
            words = int(rng.lognormvariate(3.3, 1.0)) + 1
            failed = i % 10 == 9
            text = " ".join(rng.choice(WORDS) for _ in range(words))
            text = f"{FAILED} {text}" if failed else f"{text} [{MARK}{i:04d}]"
            row: dict[str, Any] = {
                "timestamp": t,
                "request": {
                    "messages": [
                        {"role": "system", "content": "You are the support agent of Northwind."},
                        {"role": "user", "content": text},
                    ]
                },
                "usage": {"prompt_tokens": words + 14, "completion_tokens": rng.randint(4, 90)},
            }
            if failed:
                row["error"] = {"message": "upstream timeout"}
            else:
                texts.append(text)
            out.write(json.dumps(row) + "\n")
    return texts


def _spec(trace: Path, model: Path, **changes: Any) -> JobSpec:
    # grid: no simulator ranking (seconds of CPU this test does not need)
    base = {"slo": "ttft_p50_ms<=600", "peak_rps": 2.0, "strategy": "grid", "duration_s": 10.0}
    return JobSpec(trace_path=str(trace), model_path=str(model), **{**base, **changes})


@pytest.fixture(scope="module")
def planned(model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Prepared, Path, list[str]]:
    root = tmp_path_factory.mktemp("customer")
    texts = _chat_log(root / "chats.jsonl")
    work = root / "work"
    return plan_job(_spec(root / "chats.jsonl", model), work), work, texts


def test_the_golden_set_is_a_stratified_draw_of_the_customers_prompts_kept_in_the_work_dir_only(
    planned: tuple[Prepared, Path, list[str]], model: Path
) -> None:
    prepared, work, texts = planned
    golden, about = prepared.plan.golden, prepared.golden
    assert about["source"] == gates.CUSTOMER
    assert about["prompts_with_text"] == len(texts) == 216  # failed requests are not drawn
    assert len(golden.prompts) == about["num_prompts"] == gates.GOLDEN_NUM_PROMPTS
    assert all(2 <= len(p) <= gates.GOLDEN_MAX_TOKENS for p in golden.prompts)
    assert about["prompt_tokens"] == [len(p) for p in golden.prompts]
    # One prompt per length stratum, shortest to longest: short and long ones both represented.
    full = about["full_prompt_tokens"]
    assert full == sorted(full) and full[-1] > 2 * full[0] and full[-1] > gates.GOLDEN_MAX_TOKENS
    assert about["prompts_bounded"] == sum(n > gates.GOLDEN_MAX_TOKENS for n in full) >= 1
    # Token ids of the customer's own text, by the model's own tokenizer (ids decode to it).
    tokenizer = model_tokenizer(model)
    assert tokenizer is not None
    decoded = [tokenizer._tokenizer.decode(list(p)) for p in golden.prompts]
    for text in decoded:
        assert MARK in text and FAILED not in text
        account = text.split(MARK)[1][:4]
        assert any(t.endswith(f"[{MARK}{account}]") for t in texts)
    # Kept in the work dir (owner-only); the report holds counts and lengths, never text or ids.
    stored = work / gates.GOLDEN_FILE
    assert stored.stat().st_mode & 0o777 == 0o600
    assert json.loads(stored.read_text())["golden"]["prompts"] == [list(p) for p in golden.prompts]
    data = json.dumps(report(prepared, []))
    assert MARK not in data and "Northwind" not in data
    assert not any(json.dumps(list(p))[1:-1] in data for p in golden.prompts)
    assert json.loads(data)["golden_set"]["source"] == gates.CUSTOMER


def test_a_resumed_job_judges_on_the_same_prompts_without_the_log(
    planned: tuple[Prepared, Path, list[str]], model: Path, tmp_path: Path
) -> None:
    prepared, work, _ = planned
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    gone = _spec(tmp_path / "deleted.jsonl", model)  # the log is no longer there
    again = plan_job(gone, copy)
    assert again.plan.golden == prepared.plan.golden and again.golden == prepared.golden


def test_without_prompt_text_the_golden_set_follows_the_length_mix(
    model: Path, shared_traces: Path, tmp_path: Path
) -> None:
    prepared = plan_job(_spec(shared_traces / "mooncake_synthetic.jsonl", model), tmp_path / "w")
    about = prepared.golden
    assert about["source"] == gates.SYNTHESISED and "token counts only" in about["why"]
    assert all(gates.GOLDEN_MIN_TOKENS <= n <= gates.GOLDEN_MAX_TOKENS for n in about["prompt_tokens"])


def _teacher_forced(model: Any, golden: gates.GoldenSet) -> gates.Capture:
    """What the engine's prompt_logprobs answer holds (top-k and the prompt's own token at every
    position after the first), computed by the model in transformers."""
    import torch

    positions: list[list[dict[str, float]]] = []
    with torch.no_grad():
        for prompt in golden.prompts:
            logp = torch.log_softmax(model(torch.tensor([list(prompt)])).logits[0].float(), -1)
            rows = []
            for i in range(1, len(prompt)):
                top = torch.topk(logp[i - 1], golden.top_k)
                row = {str(int(t)): float(v) for t, v in zip(top.indices, top.values, strict=True)}
                row[str(prompt[i])] = float(logp[i - 1, prompt[i]])
                rows.append(row)
            positions.append(rows)
    return gates.Capture(prompt_logprobs=positions, greedy=[[] for _ in golden.prompts])


def test_the_gate_judges_precision_changes_on_the_customers_prompts(
    planned: tuple[Prepared, Path, list[str]], model: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    golden = planned[0].plan.golden
    reference = _teacher_forced(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), golden)
    bf16 = _teacher_forced(AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16), golden)
    ternary_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():  # a crude weight format: each matrix row reduced to {-max, 0, +max}
        for weight in ternary_model.parameters():
            if weight.dim() == 2:
                scale = weight.abs().amax(dim=1, keepdim=True)
                weight.copy_(torch.round(weight / scale) * scale)
    ternary = _teacher_forced(ternary_model, golden)
    thresholds = gates.Thresholds()
    passed = gates.compare(reference, bf16, change_type=PRECISION, thresholds=thresholds)
    rejected = gates.compare(reference, ternary, change_type=PRECISION, thresholds=thresholds)
    positions = sum(len(p) - 1 for p in golden.prompts)
    assert passed.positions == rejected.positions == positions
    assert passed.passed and passed.top1_agreement >= thresholds.min_top1_agreement, passed
    assert not rejected.passed and rejected.top1_agreement < thresholds.min_top1_agreement, rejected
    assert (
        f"top-1 agreement {rejected.top1_agreement:.3f} < {thresholds.min_top1_agreement}" in rejected.reasons
    )


class _BrokenTokenizer:
    name = "broken"

    def encode(self, text: str) -> list[int]:
        raise ValueError(f"cannot encode {text!r}")


def test_a_tokenizer_failure_names_the_line_never_the_text(tmp_path: Path) -> None:
    _chat_log(tmp_path / "chats.jsonl", n=12)
    with pytest.raises(TraceError) as info:
        draw_prompts(tmp_path / "chats.jsonl", tokenizer=_BrokenTokenizer(), rng=np.random.default_rng(0))
    assert info.value.line == 1 and MARK not in str(info.value) and "Northwind" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None


def test_scaling_keeps_the_length_mix_and_scales_shared_prefixes() -> None:
    # Two 2048-token prompts sharing their first two 512-token blocks (1024 tokens).
    trace = SyntheticTrace(
        block_size_tokens=512,
        arrival_ms=np.array([0, 10]),
        input_tokens=np.array([2048, 2048]),
        output_tokens=np.array([100, 0]),
        block_ids=np.array([0, 1, 2, 3, 0, 1, 4, 5]),
        block_offsets=np.array([0, 4, 8]),
    )
    half = scale_lengths(trace, 0.5)
    assert half.input_tokens.tolist() == [1024, 1024] and half.output_tokens.tolist() == [50, 0]
    a, b = half.block_ids[:2].tolist(), half.block_ids[2:].tolist()
    assert half.block_offsets.tolist() == [0, 2, 4]
    assert a[0] == b[0] and a[1] != b[1]  # one shared block of two: 512 of 1024 tokens, as before
    assert half.sample_input_tokens is not None and half.sample_input_tokens.tolist() == [2048, 2048]
    assert scale_lengths(trace, 1.0) is trace
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="length scale"):
            scale_lengths(trace, bad)


def test_a_scaled_job_states_the_factor_and_the_share_it_shortened(
    model: Path, shared_traces: Path, tmp_path: Path
) -> None:
    trace = shared_traces / "azure2023_conv.csv"
    prepared = plan_job(_spec(trace, model, length_scale=0.25, max_prompt_tokens=512), tmp_path / "w")
    caps = prepared.caps
    assert caps["length_scale"] == 0.25 and caps["requests_scaled"] > 0.9 * caps["num_requests"]
    assert caps["requests_affected"] >= caps["requests_scaled"]
    assert "0.25x its sample length" in caps["line"]
    assert f"({caps['requests_scaled']:,} of {caps['num_requests']:,})" in caps["line"]
    rows = [json.loads(line) for line in (tmp_path / "w" / "workload.jsonl").read_text().splitlines()]
    assert all(r["input_length"] == max(1, round(r["sample_input_length"] * 0.25)) for r in rows)
    data = json.loads(json.dumps(report(prepared, [])))
    assert data["caps"]["length_scale"] == 0.25 and data["spec"]["length_scale"] == 0.25
    assert "--length-scale 0.25" in data["exports"]["reproduce"]
    # The same job at the real lengths: today's caps line, no factor named.
    plain = plan_job(_spec(trace, model, max_prompt_tokens=512), tmp_path / "real").caps
    assert plain["length_scale"] == 1.0 and plain["requests_scaled"] == 0
    assert plain["line"].startswith("Lengths capped for this hardware: prompts capped at 512 tokens")
    for bad in (0.0, 1.01, math.nan, True):
        with pytest.raises(JobSpecError) as info:
            validate(_spec(trace, model, length_scale=bad))
        assert info.value.field == "length_scale"


def test_tailguard_tune_takes_a_length_scale(
    model: Path, shared_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    tune.register(parser.add_subparsers())
    common = ["tune", "--trace", str(shared_traces / "azure2023_conv.csv"), "--model", str(model)]
    common += ["--slo", "ttft_p50_ms<=600", "--peak-rps", "1", "--strategy", "grid", "--print-space"]
    args = parser.parse_args([*common, "--length-scale", "2", "--json", str(tmp_path / "a.json")])
    assert args.func(args) == 1
    assert "--length-scale must be 0.01 to 1" in capsys.readouterr().err
    assert not (tmp_path / "a.json.work").exists()
    args = parser.parse_args([*common, "--length-scale", "0.5", "--json", str(tmp_path / "b.json")])
    assert args.func(args) == 0
    first = json.loads((tmp_path / "b.json.work" / "workload.jsonl").read_text().splitlines()[0])
    assert first["input_length"] == max(1, round(first["sample_input_length"] * 0.5))


def test_prompts_too_short_to_judge_on_are_not_used(model: Path, tmp_path: Path) -> None:
    log = tmp_path / "short.jsonl"
    row = {"prompt": "ok", "usage": {"prompt_tokens": 1, "completion_tokens": 3}}
    log.write_text("".join(json.dumps({**row, "timestamp": 1_700_000_000 + i}) + "\n" for i in range(30)))
    golden, about = gates.golden_for_job(
        work_dir=tmp_path / "w",
        vocab_size=2048,
        workload_lengths=[1] * 30,
        seed=0,
        model_path=str(model),
        trace_path=str(log),
    )
    assert about["source"] == gates.SYNTHESISED and "too short to judge on" in about["why"]
    assert all(len(p) == gates.GOLDEN_MIN_TOKENS for p in golden.prompts)


def test_the_simulator_ranks_once_per_job_and_later_steps_read_it_back(
    model: Path, shared_traces: Path, tmp_path: Path
) -> None:
    from serving.perf.feedback import Pair
    from tuning.search.job import RANKED_FILE

    spec = _spec(shared_traces / "azure2023_conv.csv", model, strategy="tpe", duration_s=8.0)
    work = tmp_path / "w"
    first = plan_job(spec, work)
    stored = json.loads((work / RANKED_FILE).read_text())
    assert first.sim_ranked and stored["points"] == list(first.sim_ranked)
    # A later step reads the stored ranking back instead of simulating again: planted in a
    # different order, it is what the step gets.
    planted = {**stored, "points": stored["points"][::-1]}
    (work / RANKED_FILE).write_text(json.dumps(planted))
    assert list(plan_job(spec, work).sim_ranked) == planted["points"]
    # Made from other inputs (here a calibration pair), damaged, or holding a point the space
    # no longer has: simulated again.
    pair = Pair(
        measured_tpot_ms=12.0, measured_ttft_p50_ms=90.0, predicted_tpot_ms=10.0, predicted_ttft_p50_ms=80.0
    )
    (work / RANKED_FILE).write_text(json.dumps(planted))
    assert list(plan_job(spec, work, calibration=[pair]).sim_ranked) != planted["points"]
    for damaged in ("{", json.dumps({**stored, "points": [{"max_num_seqs": -1}]})):
        (work / RANKED_FILE).write_text(damaged)
        assert plan_job(spec, work).sim_ranked == first.sim_ranked
