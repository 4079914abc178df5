from __future__ import annotations

import math
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.utils import timezone

from compliance.selectors import allowed_regions
from portal.accounts.models import Organization
from portal.catalog.selectors import effective_price_per_hour
from portal.jobs.models import ServedModel, Trial, TuningJob
from portal.traffic.models import TrafficSample
from portal.traffic.services import workload_path
from serving.catalog.hardware import hardware_in_regions
from serving.catalog.models import UnknownModel, model_spec_from_dir
from serving.sim.api import LatencyTargets
from tuning.search import gates
from tuning.search.job import HARDWARE
from tuning.search.job import REFERENCE as REFERENCE_PHASE
from tuning.search.job import SEARCH as SEARCH_PHASE
from tuning.search.selection import Candidate, pareto_front
from tuning.search.space import LOSSLESS
from tuning.search.trial import describe
from tuning.whatif import MAX_REQUESTS, forecast


def job_work_dir(job: TuningJob) -> Path:
    """The job's own folder on the worker: its planned workloads, golden set and trial logs."""
    return Path(settings.TUNING_WORK_DIR) / str(job.id)


def job_workload_path(job: TuningJob) -> Path:
    """The requests the job replayed at its target rate (the workload a winner was tuned on,
    which the continual loop compares live traffic with)."""
    return job_work_dir(job) / "workload.jsonl"


def served_model_list(*, organization: Organization) -> QuerySet[ServedModel]:
    return ServedModel.objects.filter(organization=organization).order_by("name")


def tuning_job_list(*, organization: Organization) -> QuerySet[TuningJob]:
    return TuningJob.objects.filter(organization=organization).select_related(
        "traffic_sample", "served_model"
    )


def ready_samples(*, organization: Organization) -> QuerySet[TrafficSample]:
    return TrafficSample.objects.filter(organization=organization, status=TrafficSample.Status.READY).defer(
        "charts"
    )


def sample_facts(sample: TrafficSample) -> dict[str, Any]:
    """What the job form needs from a sample's profile: its busiest minute (the peak rate a job
    should hold) and the prompt/output percentiles its caps default from (p99)."""
    profile = sample.profile or {}
    lengths = {key: profile.get(key) or {} for key in ("input_tokens", "output_tokens")}
    return {
        "id": sample.id,
        "name": sample.name,
        "peak_rps": (profile.get("arrival") or {}).get("peak_rps_60s"),
        "input_p50": lengths["input_tokens"].get("p50"),
        "input_p99": lengths["input_tokens"].get("p99"),
        "output_p50": lengths["output_tokens"].get("p50"),
        "output_p99": lengths["output_tokens"].get("p99"),
    }


def job_form_initial(*, organization: Organization, sample_id: str | None) -> dict[str, Any]:
    """The job form's starting values: the sample asked for (or the organization's only one)
    and its busiest minute's rate as the peak to hold."""
    samples = ready_samples(organization=organization)
    sample = None
    if sample_id:
        try:
            sample = samples.filter(id=sample_id).first()
        except (ValueError, DjangoValidationError):
            sample = None  # a mistyped link: the form starts empty, as without one
    elif len(only := list(samples[:2])) == 1:
        sample = only[0]
    if sample is None:
        return {}
    peak = sample_facts(sample)["peak_rps"]
    initial: dict[str, Any] = {"traffic_sample": sample.id}
    if peak:
        initial["peak_rps"] = max(round(float(peak), 3), 0.001)
    return initial


# --- Job report -------------------------------------------------------------------------------
# Plain data (dicts and lists, JSON-ready) for the report page, its HTML download and its PDF;
# `portal.jobs.charts` draws the figures from it.


def _slo_limits(job: TuningJob) -> dict[str, float | None]:
    # Jobs are validated when created; an unreadable SLO only means no lines on the charts.
    slo = job.slo_or_none()
    return {name: slo.limit(name) if slo else None for name in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms")}


def requests_at_target(result: dict[str, Any]) -> int | None:
    """What a trial's percentiles at the target rate rest on (the endpoint page's history)."""
    return _requests_at_target(result)


def _requests_at_target(result: dict[str, Any]) -> int | None:
    """The requests the trial's pooled percentiles and interval rest on: every repeat at the
    target rate (None for results recorded without their load steps)."""
    counts = [
        int(point.get("num_requests") or 0)
        for point in result.get("load") or []
        if float(point.get("rate_multiple") or 1.0) == 1.0
    ]
    return sum(counts) if counts else None


def _load_curve(result: dict[str, Any], target_rps: float) -> list[dict[str, Any]]:
    """One point per load level: the target rate pooled over its repeats (as the trial judged
    it), then each capacity step, up to the first that broke the SLO (saturation); each with
    the number of requests its percentiles rest on."""
    points: list[dict[str, Any]] = []
    if result.get("ttft_p50_ms") is not None:
        points.append(
            {
                "rate_multiple": 1.0,
                "rate_rps": target_rps,
                "ttft_p50_ms": result["ttft_p50_ms"],
                "ttft_p95_ms": result.get("ttft_p95_ms"),
                "slo_met": bool(result.get("slo_met")),
                "num_requests": _requests_at_target(result),
            }
        )
    for point in result.get("load") or []:
        multiple = float(point.get("rate_multiple") or 1.0)
        if multiple == 1.0:
            continue
        points.append(
            {
                "rate_multiple": multiple,
                "rate_rps": multiple * target_rps,
                "ttft_p50_ms": point.get("ttft_p50_ms"),
                "ttft_p95_ms": point.get("ttft_p95_ms"),
                "slo_met": bool(point.get("slo_met")),
                "num_requests": point.get("num_requests"),
            }
        )
    return sorted(points, key=lambda p: p["rate_multiple"])


def _gate_row(result: dict[str, Any]) -> dict[str, Any]:
    correctness = result.get("correctness") or {}
    reliability = result.get("reliability") or {}
    stored = result.get("gate_thresholds")
    # Results recorded before trials stored their thresholds were held to the defaults.
    thresholds = stored or asdict(gates.Thresholds())
    lossless = correctness.get("change_type") == LOSSLESS
    return {
        "change_type": correctness.get("change_type"),
        "top1_agreement": correctness.get("top1_agreement"),
        "min_top1_agreement": thresholds["lossless_min_top1_agreement" if lossless else "min_top1_agreement"],
        "mean_kl": correctness.get("mean_kl"),
        # A lossless change is held to exact greedy output, not to a KL bound.
        "max_mean_kl": None if lossless else thresholds["max_mean_kl"],
        "greedy_exact": correctness.get("greedy_exact"),
        "positions": correctness.get("positions"),
        "correctness_passed": bool(correctness.get("passed")),
        "correctness_reasons": list(correctness.get("reasons") or ()),
        "num_errors": reliability.get("num_errors"),
        "engine_survived": reliability.get("engine_survived"),
        "preemptions": reliability.get("preemptions"),
        "p50_cv": reliability.get("p50_cv"),
        "reliability_passed": bool(reliability.get("passed")),
        "reliability_reasons": list(reliability.get("reasons") or ()),
        "thresholds_assumed": stored is None,
    }


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _pareto(rows: list[dict[str, Any]]) -> set[int]:
    """The same frontier selection reports, computed from the trials so a running job has one."""
    candidates = [
        Candidate(
            trial=row["number"],
            label=row["label"],
            num_changed_knobs=0,  # not used by the frontier
            slo_met=row["slo_met"],
            slo_violations=tuple(row["slo_violations"]),
            gates_passed=row["gates"]["correctness_passed"] and row["gates"]["reliability_passed"],
            gate_reasons=(),
            cost_per_mtok_usd=row["cost_per_mtok_usd"],
            ttft_p50_ms=_num(row["ttft_p50_ms"]),
            ttft_p95_ms=_num(row["ttft_p95_ms"]),
            ttft_p95_ci_ms=(math.nan, math.nan),
        )
        for row in rows
        if row["ok"]
    ]
    return set(pareto_front(candidates))


def _ttft_split(result: dict[str, Any], predicted: Any) -> dict[str, dict[str, float | None]] | None:
    """Where the trial's TTFT went (means, ms), predicted by the simulator and measured by the
    engine's own histograms: waiting to be scheduled, scheduled to first token, and outside the
    engine (the client's mean TTFT minus the engine's). None when neither side has it."""
    split = predicted.get("ttft_split_ms") if isinstance(predicted, dict) else None
    client, engine = result.get("ttft_mean_ms"), result.get("engine_ttft_mean_ms")
    measured = {
        "queueing": result.get("engine_queue_mean_ms"),
        "prefill": result.get("engine_prefill_mean_ms"),
        "outside_engine": client - engine if client is not None and engine is not None else None,
    }
    if not isinstance(split, dict) and all(v is None for v in measured.values()):
        return None
    parts = ("queueing", "prefill", "outside_engine")
    return {
        part: {
            "predicted": split.get(part) if isinstance(split, dict) else None,
            "measured": measured[part],
        }
        for part in parts
    }


def job_report_data(*, job: TuningJob) -> dict[str, Any]:
    """Everything the job report shows, as plain data: the job, its SLO, one row per trial, which
    trial won and which is the baseline, and the selection's own words."""
    spec = job.spec or {}
    target_rps = float(spec.get("peak_rps", 0.0)) * float(spec.get("headroom", 1.0))
    selection = job.selection
    reasons: dict[str, str] = selection.get("reasons") or {}
    winner = job.winner_trial if job.winner_trial is not None else selection.get("winner")
    rows: list[dict[str, Any]] = []
    for trial in job.trials.order_by("number"):
        result = trial.result or {}
        phase = result.get("phase") or ("reference" if trial.number == 0 else "search")
        reference = phase == "reference" and result.get("ttft_p50_ms") is None
        # The reference is captured, not measured (results recorded before phases existed measured
        # it too): a capture-only trial is no candidate and has nothing to chart.
        ok = trial.status == Trial.Status.DONE and result.get("status") == "ok" and not reference
        predicted = result.get("predicted") if ok else None
        rows.append(
            {
                "number": trial.number,
                "label": trial.label,
                "assignment": trial.assignment,
                "changed": {k: v for k, v in (trial.assignment or {}).items() if v is not None},
                "state": "running"
                if trial.status == Trial.Status.RUNNING
                else ("ok" if ok else ("reference" if reference else "failed")),
                "ok": ok,
                "phase": phase,
                "subject": result.get("subject") or "",
                "contended": bool(result.get("contended")),
                "error": result.get("error")
                or (
                    "reference capture: the correctness gate's yardstick, not a candidate"
                    if reference
                    else None
                ),
                "ttft_p50_ms": result.get("ttft_p50_ms"),
                "ttft_p95_ms": result.get("ttft_p95_ms"),
                "ttft_p95_ci_ms": result.get("ttft_p95_ci_ms"),
                "num_requests": _requests_at_target(result) if ok else None,
                "ttft_sample_ms": list(result.get("ttft_sample_ms") or ()),
                "tpot_p50_ms": result.get("tpot_p50_ms"),
                "cost_per_mtok_usd": result.get("cost_per_mtok_usd"),
                "slo_met": bool(result.get("slo_met")),
                "slo_violations": list(result.get("slo_violations") or ()),
                "sustainable_multiple": result.get("sustainable_multiple"),
                "sustainable_rps": float(result.get("sustainable_multiple") or 0.0) * target_rps,
                "load_curve": _load_curve(result, target_rps) if ok else [],
                "predicted": predicted if isinstance(predicted, dict) else None,
                "ttft_split": _ttft_split(result, predicted) if ok else None,
                "gates": _gate_row(result),
                "reason": reasons.get(str(trial.number), ""),
                "is_winner": winner is not None and trial.number == winner,
                "is_pareto": False,
                "is_defaults": ok and not any(v is not None for v in (trial.assignment or {}).values()),
            }
        )
    frontier = _pareto(rows)
    for row in rows:
        row["is_pareto"] = row["number"] in frontier
    successful = [row for row in rows if row["ok"]]
    # The baseline the winner is compared with: the competent baseline (vLLM's defaults with the
    # host's fastest dtype) where the job recorded one, else vLLM started with no flags, else (jobs
    # recorded before either) the reference trial.
    competent = (job.report_section("baselines") or {}).get("competent")
    baseline = (
        next((row for row in successful if competent is not None and row["assignment"] == competent), None)
        or next((row for row in successful if row["is_defaults"]), None)
        or next((row for row in successful if row["number"] == 0), None)
    )
    best = selection.get("best_achievable")
    return {
        "job": {
            "id": str(job.id),
            "name": job.name,
            "status": job.status,
            "status_display": job.get_status_display(),
            "is_active": job.is_active,
            "error": job.error,
            "traffic_sample": job.traffic_sample.name,
            "model": job.served_model.name,
            "hardware": spec.get("hardware"),
            "strategy": spec.get("strategy"),
            "budget_trials": spec.get("budget_trials"),
            "created_at": job.created_at.isoformat(),
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        },
        "slo_text": job.slo_text,
        "slo": _slo_limits(job),
        "peak_rps": spec.get("peak_rps"),
        "headroom": spec.get("headroom"),
        "target_rps": target_rps,
        "trials": rows,
        "num_successful": len(successful),
        "winner": next((row for row in rows if row["is_winner"]), None),
        "best_achievable": next((row for row in rows if best is not None and row["number"] == best), None),
        "baseline": baseline,
        "baseline_kind": None
        if baseline is None
        else (
            "competent"
            if competent is not None and baseline["assignment"] == competent
            else ("defaults" if baseline["is_defaults"] else "reference")
        ),
        "caps": job.report_section("caps"),
        "golden_set": job.report_section("golden_set"),
        "confirmation": confirmation_rows(job=job),
        "outcome": selection.get("outcome", "unconfirmed"),
        "selection": {
            "summary": selection.get("summary", ""),
            "tie": bool(selection.get("tie")),
            "winner_reason": reasons.get(str(winner), "") if winner is not None else "",
        },
    }


def confirmation_rows(*, job: TuningJob) -> dict[str, Any] | None:
    """The confirmation as the job page shows it: one row per subject with each figure and its
    95% interval, the ratios to both baselines, the outcome line and the ablation."""
    data = job.report_section("confirmation")
    if not data:
        return None

    def fig(d: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
        return (d or {}).get(key)

    rows = []
    for name, subject in (data.get("subjects") or {}).items():
        figures = subject.get("figures") or {}
        rows.append(
            {
                "name": name,
                "label": describe(subject.get("assignment") or {}),
                "blocks": subject.get("blocks", 0),
                "excluded": subject.get("excluded") or [],
                "ttft_p50": fig(figures, "ttft_p50_ms"),
                "ttft_p95": fig(figures, "ttft_p95_ms"),
                "tpot_p50": fig(figures, "tpot_p50_ms"),
                "rate": fig(figures, "sustainable_multiple"),
                "ttft_vs_competent": fig(subject.get("vs_competent"), "ttft_p50_ms"),
                "rate_vs_competent": fig(subject.get("vs_competent"), "sustainable_multiple"),
                "ttft_vs_naive": fig(subject.get("vs_naive"), "ttft_p50_ms"),
                "winner": name == data.get("winner_subject"),
            }
        )
    ablation = data.get("ablation") or {}
    return {
        "line": data.get("line", ""),
        "outcome": data.get("outcome", ""),
        "complete": data.get("complete", False),
        "rounds": data.get("rounds"),
        "competent_why": data.get("competent_why", ""),
        "rows": rows,
        "ablation_note": ablation.get("note", ""),
        "ablation": [
            {
                "knob": knob,
                "share": share.get("share_of_gain"),
                "ratio": share.get("ttft_p50_ratio_vs_competent"),
            }
            for knob, share in (ablation.get("shares") or {}).items()
        ],
    }


def job_progress(*, job: TuningJob, now: datetime | None = None) -> dict[str, Any] | None:
    """How long a running job has run, how far its search is, and roughly how long the search
    has left at the pace of its finished search trials (the confirmation rounds, if any, come
    after and are not estimated). None before the job started or once it ended."""
    if not job.is_active or job.started_at is None:
        return None
    now = now or timezone.now()
    searched = [
        t
        for t in job.trials.all()
        if (t.result or {}).get("phase", REFERENCE_PHASE if t.number == 0 else SEARCH_PHASE) == SEARCH_PHASE
    ]
    done = [t for t in searched if t.finished_at is not None]
    budget = job.budget_trials
    per_trial_s = (
        sum((t.finished_at - t.started_at).total_seconds() for t in done if t.finished_at) / len(done)
        if done
        else None
    )
    left = max(budget - len(done), 0)
    return {
        "elapsed_s": max((now - job.started_at).total_seconds(), 0.0),
        "search_done": len(done),
        "budget": budget,
        "per_trial_s": per_trial_s,
        "search_left_s": None if per_trial_s is None else per_trial_s * left,
    }


def running_trial_engine_log(*, job: TuningJob) -> dict[str, Any] | None:
    """The running trial's last engine log lines as its step stored them (bounded, paths of the
    server shortened: `services.engine_log_for_customer`), or None when no trial runs or its
    engine has written nothing yet."""
    if not job.is_active:
        return None
    trial = job.trials.filter(status=Trial.Status.RUNNING).exclude(engine_log="").order_by("-number").first()
    if trial is None:
        return None
    return {"number": trial.number, "attempts": trial.attempts, "lines": trial.engine_log.splitlines()}


def job_is_priced(*, job: TuningJob) -> bool:
    """Whether the job's costs rest on a price: one above 0 it carries (an admin's override or its
    pool's; 0 is a pool without a price) or its hardware target's own. The operator's own machine
    has none (`local-cpu`): its trials have no cost, which the job page shows as "not priced".
    Jobs from before the local machine went unpriced measured costs at a default price; those
    keep their costs on their pages."""
    spec = job.spec or {}
    if spec.get("price_per_hour_usd") is not None:
        return float(spec["price_per_hour_usd"]) > 0
    target = HARDWARE.get(str(spec.get("hardware", "")))
    if target is None or target.price_per_hour_usd > 0:
        return True
    return job.trials.filter(result__cost_per_mtok_usd__gt=0).exists()


def what_if_forecasts(
    *,
    organization: Organization,
    sample: TrafficSample,
    served_model: ServedModel,
    ttft_p50_ms: float,
    ttft_p95_ms: float,
) -> dict[str, Any]:
    """The simulator's forecast of this sample and model on each catalog hardware the
    organization's residency allows, at the operator's prices; every figure is a prediction and
    names what it rests on, and hardware it cannot predict says why (`tuning.whatif`)."""
    if sample.organization_id != organization.id or served_model.organization_id != organization.id:
        raise DjangoValidationError("That sample or model belongs to another organization.")
    if sample.status != TrafficSample.Status.READY:
        raise DjangoValidationError("Choose a sample that finished validating.")
    trace = workload_path(sample)
    if not trace.exists():
        raise DjangoValidationError("This sample's workload is missing; upload it again.")
    try:
        model = model_spec_from_dir(served_model.path)
    except (UnknownModel, OSError, ValueError) as exc:
        raise DjangoValidationError(f"The simulator cannot describe this model: {exc}") from None
    profile = sample.profile or {}
    output_p99 = float((profile.get("output_tokens") or {}).get("p99") or 256)
    input_p99 = float((profile.get("input_tokens") or {}).get("p99") or 1024)
    max_output = max(1, min(math.ceil(output_p99), model.max_position_embeddings // 2))
    max_prompt = max(1, min(math.ceil(input_p99), model.max_position_embeddings - max_output))
    regions = set(allowed_regions(organization=organization))
    hardware = sorted(hardware_in_regions(regions), key=lambda hw: hw.name)
    forecasts = forecast(
        trace,
        model=model,
        hardware=hardware,
        targets=LatencyTargets(ttft_p50_ms=ttft_p50_ms, ttft_p95_ms=ttft_p95_ms),
        max_prompt_tokens=max_prompt,
        max_output_tokens=max_output,
        prices={hw.name: effective_price_per_hour(hw.name)[0] for hw in hardware},
    )
    return {
        "rows": [asdict(f) for f in forecasts],
        "model": model.name,
        "regions": sorted(regions),
        "max_prompt_tokens": max_prompt,
        "max_output_tokens": max_output,
        "requests": min(MAX_REQUESTS, int(profile.get("num_requests") or 0)) or MAX_REQUESTS,
    }
