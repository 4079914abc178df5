"""One tuning job's case in a benchmark result: the compared subject, its ratios with intervals
to the competent baseline, the ablation and every trial (tuning_gain.py, gpu_tuning.py)."""

from __future__ import annotations

import math
from typing import Any

from tuning.search.job import TrialRecord, report


def fig(subject: dict[str, Any] | None, ratio_key: str, figure: str) -> dict[str, Any]:
    return ((subject or {}).get(ratio_key) or {}).get(figure) or {}


def trace_case(name: str, prepared: Any, history: list[TrialRecord]) -> dict[str, Any]:
    data = report(prepared, history)
    conf = data.get("confirmation") or {}
    subjects = conf.get("subjects") or {}
    finalist_names = [s for s in subjects if s.startswith("finalist-")]
    # The winner when there is one; otherwise the best-looking finalist, reported with its interval
    # (which then includes 1: "no significant gain").
    chosen = conf.get("winner_subject")
    if chosen in (None, "competent") and finalist_names:
        chosen = min(
            finalist_names,
            key=lambda s: fig(subjects[s], "vs_competent", "ttft_p50_ms").get("value") or math.inf,
        )
    subject = subjects.get(chosen or "", {})
    ttft = fig(subject, "vs_competent", "ttft_p50_ms")
    rate = fig(subject, "vs_competent", "sustainable_multiple")
    ttft_naive = fig(subject, "vs_naive", "ttft_p50_ms")
    competent = prepared.competent
    assignment = subject.get("assignment") or {}
    mine, base = dict(prepared.space.key(assignment)), dict(prepared.space.key(competent))
    knobs = {k: mine[k] for k in mine if mine[k] != base[k]}
    phases: dict[str, int] = {}
    for r in history:
        phases[r.phase] = phases.get(r.phase, 0) + 1
    loads = [
        (r.result.get("foreign_load") or {}).get("foreign_cores")
        for r in history
        if r.result.get("foreign_load")
    ]
    return {
        "trace": name,
        "outcome": conf.get("outcome", data["selection"].get("outcome")),
        "line": conf.get("line") or data["selection"]["summary"],
        "compared_subject": chosen,
        "compared_knobs_vs_competent": knobs,
        "ttft_p50_ratio_vs_competent": ttft,
        "sustainable_rate_ratio_vs_competent": rate,
        "ttft_p50_ratio_vs_naive": ttft_naive,
        "naive_differs_from_competent": "naive" in subjects,
        "competent": competent,
        "competent_why": prepared.competent_why,
        "reference": prepared.reference,
        "caps": prepared.caps,
        "target_rps": prepared.spec.target_rps,
        "space_size": prepared.space.size,
        "space": prepared.space.to_dict(),
        "trials_by_phase": phases,
        "contended_trials": sum(1 for r in history if r.result.get("contended")),
        "foreign_cores_max": max((x for x in loads if x is not None), default=None),
        "subjects": subjects,
        "ablation": conf.get("ablation"),
        "selection": data["selection"],
        "trials": [
            {
                "number": t["number"],
                "phase": t["phase"],
                "subject": t["subject"],
                "label": t["label"],
                **{
                    k: t["result"].get(k)
                    for k in (
                        "status",
                        "error",
                        "ttft_p50_ms",
                        "ttft_p95_ms",
                        "tpot_p50_ms",
                        "sustainable_multiple",
                        "slo_met",
                        "contended",
                        "foreign_load",
                        "host_wait_s",
                        "correctness",
                    )
                },
            }
            for t in data["trials"]
        ],
    }
