"""A finished tuning job's rows for the job report's tests: hand-made trial results (load points,
a failed trial, the simulator's predictions), the selection over them, and the job itself.

Used by `test_job_report` and the isolation sweep (`report_job_with`, `TRIALS`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from portal.accounts.models import Organization, User
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.traffic.models import TrafficSample
from tuning.search import gates
from tuning.search.selection import Candidate, select
from tuning.search.trial import LoadPoint, TrialResult, ttft_sample

SLO = "ttft_p50_ms<=600,ttft_p95_ms<=1500"
PEAK_RPS, HEADROOM = 2.0, 1.25  # target 2.5 req/s
TARGET_RPS = PEAK_RPS * HEADROOM


def load_point(multiple: float, p50: float, p95: float, *, met: bool, repeat: int = 0) -> LoadPoint:
    return LoadPoint(
        rate_multiple=multiple,
        repeat=repeat,
        num_requests=50,
        num_errors=0,
        ttft_p50_ms=p50,
        ttft_p95_ms=p95,
        tpot_p50_ms=30.0,
        tokens_per_s=900.0 * multiple,
        slo_met=met,
        violations=() if met else (f"ttft_p95_ms {p95:,.0f} > 1,500",),
        send_lateness_p99_ms=2.0,
    )


def trial_result(
    p50: float,
    p95: float,
    *,
    cost: float | None,
    sustainable: float,
    change_type: str = "lossless",
    correctness_ok: bool = True,
    sample: bool = True,
    predicted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A result in exactly the shape run_trial stores: built from its own dataclasses."""
    steps = [load_point(1.0, p50, p95, met=True, repeat=r) for r in (0, 1)]
    multiple = 1.0
    for multiple in (1.5, 2.0):
        met = multiple <= sustainable
        steps.append(load_point(multiple, p50 * multiple, p95 * multiple * (1 if met else 2), met=met))
        if not met:
            break
    # A spread of TTFTs whose p50/p95 sit near the stated ones.
    ttfts = [p50 * (0.5 + i / 100) for i in range(100)] + [p95] * 6
    correctness = gates.CorrectnessVerdict(
        passed=correctness_ok,
        change_type=change_type,
        top1_agreement=1.0 if correctness_ok else 0.81,
        mean_kl=0.0 if correctness_ok else 0.21,
        greedy_exact=correctness_ok,
        positions=376,
        reasons=() if correctness_ok else ("top-1 agreement 0.810 < 0.9", "mean KL 0.2100 nats > 0.05"),
    )
    reliability = gates.ReliabilityVerdict(
        passed=True, num_errors=0, engine_survived=True, preemptions=0.0, p50_cv=0.04, reasons=()
    )
    result = TrialResult(
        config={"dtype": "auto"},
        status="ok",
        error=None,
        load=tuple(steps),
        ttft_p50_ms=p50,
        ttft_p95_ms=p95,
        ttft_p95_ci_ms=(p95 * 0.9, p95 * 1.1),
        tpot_p50_ms=30.0,
        slo_met=True,
        slo_violations=(),
        sustainable_multiple=sustainable,
        cost_per_mtok_usd=cost,
        correctness=correctness.to_dict(),
        reliability=reliability.to_dict(),
        capture=None,
        ttft_sample_ms=ttft_sample(ttfts) if sample else (),
        gate_thresholds=asdict(gates.Thresholds()),
    ).to_dict()
    if not sample:
        # Recorded before trials stored a sample or their thresholds.
        del result["ttft_sample_ms"], result["gate_thresholds"]
    if predicted is not None:
        result["predicted"] = predicted
    return result


def failed_trial_result(error: str) -> dict[str, Any]:
    return {
        "config": {},
        "status": "failed",
        "error": error,
        "load": [],
        "ttft_p50_ms": None,
        "ttft_p95_ms": None,
        "ttft_p95_ci_ms": [None, None],
        "slo_met": False,
        "slo_violations": [],
        "sustainable_multiple": 0.0,
        "cost_per_mtok_usd": None,
        "correctness": None,
        "reliability": None,
    }


NONE = {"dtype": None, "max_num_seqs": None, "max_num_batched_tokens": None}
# number -> (assignment, label, result)
TRIALS: dict[int, tuple[dict[str, Any], str, dict[str, Any]]] = {
    0: ({**NONE, "dtype": "float32"}, "dtype=float32", trial_result(500, 1400, cost=2.0, sustainable=1.5)),
    1: (NONE, "vLLM defaults", trial_result(550, 1450, cost=1.5, sustainable=1.0, sample=False)),
    2: (
        {**NONE, "max_num_seqs": 8},
        "max_num_seqs=8",
        trial_result(
            400,
            900,
            cost=1.2,
            sustainable=2.0,
            predicted={
                "ttft_p50_ms": 420.0,
                "ttft_p95_ms": 1000.0,
                "tpot_mean_ms": None,
                "source": "calibrated",
            },
        ),
    ),
    3: (
        {**NONE, "max_num_batched_tokens": 512},
        "max_num_batched_tokens=512",
        trial_result(
            350,
            700,
            cost=1.8,
            sustainable=1.5,
            predicted={
                "ttft_p50_ms": 300.0,
                "ttft_p95_ms": 820.0,
                "tpot_mean_ms": 31.0,
                "source": "datasheet",
            },
        ),
    ),
    # Fast and cheap, but it changed the model's answers: never on the frontier, never the winner.
    4: (
        {**NONE, "dtype": "bfloat16"},
        "dtype=bfloat16",
        trial_result(300, 600, cost=0.9, sustainable=2.0, change_type="precision", correctness_ok=False),
    ),
    5: (
        {**NONE, "max_num_seqs": 64},
        "max_num_seqs=64",
        failed_trial_result("engine did not start: out of memory"),
    ),
}


def trials_selection() -> dict[str, Any]:
    candidates = []
    for number, (assignment, label, r) in TRIALS.items():
        ok = r["status"] == "ok"
        candidates.append(
            Candidate(
                trial=number,
                label=label,
                num_changed_knobs=sum(v is not None for v in assignment.values()),
                slo_met=bool(r["slo_met"]),
                slo_violations=tuple(r["slo_violations"]),
                gates_passed=ok and r["correctness"]["passed"] and r["reliability"]["passed"],
                gate_reasons=tuple(r["correctness"]["reasons"]) if ok else (),
                cost_per_mtok_usd=r["cost_per_mtok_usd"],
                ttft_p50_ms=r["ttft_p50_ms"] if ok else float("nan"),
                ttft_p95_ms=r["ttft_p95_ms"] if ok else float("nan"),
                ttft_p95_ci_ms=tuple(r["ttft_p95_ci_ms"]) if ok else (float("nan"), float("nan")),
                error=None if ok else r["error"],
            )
        )
    return select(candidates).to_dict()


def report_job_with(
    org: Organization, user: User, trials: dict[int, tuple[dict[str, Any], str, dict[str, Any]]]
) -> TuningJob:
    sample = TrafficSample.objects.create(
        organization=org, name="calls.jsonl", status=TrafficSample.Status.READY, created_by=user
    )
    model = ServedModel.objects.get_or_create(
        organization=org, name="llama-xs", defaults={"path": "/models/llama-xs"}
    )[0]
    selection = trials_selection() if trials is TRIALS else None
    job = TuningJob.objects.create(
        organization=org,
        name="voice agent tuning",
        traffic_sample=sample,
        served_model=model,
        spec={
            "slo": SLO,
            "peak_rps": PEAK_RPS,
            "headroom": HEADROOM,
            "hardware": "local-cpu",
            "strategy": "tpe",
            "budget_trials": 6,
        },
        status=TuningJob.Status.SUCCEEDED,
        report={"selection": selection} if selection else None,
        winner_trial=selection["winner"] if selection else None,
        created_by=user,
    )
    for number, (assignment, label, result) in trials.items():
        Trial.objects.create(
            organization=org,
            job=job,
            number=number,
            assignment=assignment,
            label=label,
            status=Trial.Status.DONE,
            result=result,
        )
    return job
