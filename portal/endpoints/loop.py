"""The continual loop: watch -> detect -> re-tune -> canary -> promote -> confirm or roll back.

`loop_tick` runs after every scrape of an endpoint (the `endpoints_watch` beat task). It either
advances the endpoint's iteration in flight or, when none is and the policy allows one, checks
the last `detect_window_s` of live traffic for drift from the workload the running
configuration was tuned on, and for SLO erosion.

Every step is a transition of one `LoopIteration` row taken under a row lock, so a tick
delivered twice, or re-run after a worker died mid-step, does the step at most once: creating
the re-tuning job and the promotion are each guarded by the row's status in the same
transaction. The re-tuning job is an ordinary tuning job (its trials survive killed workers on
their own); the loop only waits for it.

A worker killed in the middle of a step leaves nothing of it: the step's writes and audit events
commit together or not at all, and the next tick, on any worker, does the step again. A tick
that finds the row locked (a step under way elsewhere, or the session of a killed worker that
the database has not ended yet) skips it rather than waiting, so the watch of every endpoint
goes on meanwhile. What a step hands on after its commit is re-derived from the database: the
supervisor's config file by every watch round (`endpoint_config_sync`), the job's step by
`jobs_redispatch`.
"""

from __future__ import annotations

import logging
import math
import tempfile
from datetime import timedelta
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from compliance.services import audit_record
from portal.endpoints.models import Endpoint, EndpointRevision, LoopIteration, MetricSnapshot
from portal.endpoints.services import endpoint_switch
from portal.jobs import selectors as job_selectors
from portal.jobs.models import Trial, TuningJob
from portal.jobs.services import tuning_job_create_for_loop
from portal.traffic.services import traffic_sample_from_workload
from tuning.continual import (
    LiveWindow,
    canary,
    detect_drift,
    live_profile,
    regressed,
    slo_erosion,
    synthesize_live,
    tuned_for_profile,
)

logger = logging.getLogger(__name__)

RETUNE_SAMPLE_REQUESTS = 200  # requests in the synthesised live-like sample (at the live rate)


def loop_tick(*, endpoint_id: str) -> str:
    """Advance the endpoint's iteration in flight, or look for a reason to start one."""
    endpoint = Endpoint.objects.select_related("job", "organization", "served_model").get(id=endpoint_id)
    active = LoopIteration.objects.filter(endpoint=endpoint, status__in=LoopIteration.ACTIVE).first()
    if active is not None:
        return loop_advance(iteration_id=active.pk)
    if not endpoint.auto_retune or endpoint.status != Endpoint.Status.HEALTHY or endpoint.job is None:
        return "idle"
    now = timezone.now()
    last = LoopIteration.objects.filter(endpoint=endpoint).order_by("-number").first()
    if (
        last is not None
        and last.finished_at
        and now - last.finished_at < timedelta(seconds=endpoint.retune_cooldown_s)
    ):
        return "cooling down"
    if (
        LoopIteration.objects.filter(endpoint=endpoint, detected_at__gte=now - timedelta(days=1)).count()
        >= endpoint.retune_max_per_day
    ):
        return "daily limit reached"
    return loop_detect(endpoint=endpoint)


def _windows(endpoint: Endpoint, *, since: Any) -> tuple[list[LiveWindow], list[float | None]]:
    rows = MetricSnapshot.objects.filter(endpoint=endpoint, taken_at__gte=since, gap=False).order_by(
        "taken_at"
    )
    windows = [LiveWindow.from_dict(r.window) for r in rows if r.window]
    return windows, [r.ttft_p95_ms for r in rows]


def _slo_p95(job: TuningJob) -> float | None:
    slo = job.slo()
    return next((o.limit_ms for o in slo.objectives if o.metric == "ttft" and o.percentile == 95), None)


def _tuned_for(endpoint: Endpoint, windows: list[LiveWindow]) -> Any:
    """The workload the running configuration was chosen on (its job's target-rate requests)."""
    job = endpoint.job
    assert job is not None
    spec = job.job_spec()
    prompt_bounds = next(w.prompt_tokens.bounds for w in windows if w.prompt_tokens.bounds)
    output_bounds = next(w.output_tokens.bounds for w in windows if w.output_tokens.bounds)
    revision = endpoint.revisions.order_by("-generation").first()
    trial = (
        Trial.objects.filter(job=revision.job, number=revision.trial_number).first()
        if revision and revision.job_id and revision.trial_number is not None
        else None
    )
    hit = (trial.result or {}).get("prefix_cache_hit_rate") if trial else None
    # The running configuration may come from a later job than the endpoint's first.
    source = revision.job if revision and revision.job else job
    workload = job_selectors.job_workload_path(source)
    return tuned_for_profile(
        workload,
        prompt_bounds=prompt_bounds,
        output_bounds=output_bounds,
        max_prompt_tokens=spec.max_prompt_tokens,
        max_output_tokens=spec.max_output_tokens,
        prefix_hit_rate=float(hit) if isinstance(hit, (int, float)) and math.isfinite(hit) else None,
    )


def loop_detect(*, endpoint: Endpoint) -> str:
    """Compare the live window with the tuned-for workload; start an iteration on drift or erosion."""
    # The window is the endpoint's, but never shorter than the evidence the loop needs.
    span_s = max(endpoint.detect_window_s, settings.LOOP_MIN_LIVE_SPAN_S)
    since = timezone.now() - timedelta(seconds=span_s)
    windows, p95s = _windows(endpoint, since=since)
    live = live_profile(windows)
    if live is None or live.num_requests < settings.LOOP_MIN_LIVE_REQUESTS:
        found = 0 if live is None else live.num_requests
        return f"not enough live traffic ({found} of {settings.LOOP_MIN_LIVE_REQUESTS} requests)"
    observed_s = sum(w.interval_s for w in windows)
    # Scrapes are periodic: allow one missed interval's worth short of the span.
    if observed_s < 0.9 * settings.LOOP_MIN_LIVE_SPAN_S:
        return f"not enough observed time ({observed_s:,.0f} of {settings.LOOP_MIN_LIVE_SPAN_S:,} s)"
    try:
        baseline = _tuned_for(endpoint, windows)
    except (OSError, StopIteration, ValueError) as exc:
        logger.warning("endpoint %s: no tuned-for workload to compare with (%s)", endpoint.id, exc)
        return "no baseline"
    report = detect_drift(baseline, live)
    target = _slo_p95(endpoint.job) if endpoint.job else None
    erosion = slo_erosion(p95s, target) if target else None
    if not report.drifted and erosion is None:
        return "no drift"
    trigger = "; ".join(
        [d.explanation for d in report.dimensions if d.drifted]
        + ([f"SLO erosion: {erosion}"] if erosion else [])
    )
    number = (
        LoopIteration.objects.filter(endpoint=endpoint)
        .order_by("-number")
        .values_list("number", flat=True)
        .first()
        or 0
    ) + 1
    try:
        with transaction.atomic():
            iteration = LoopIteration.objects.create(
                organization=endpoint.organization,
                endpoint=endpoint,
                number=number,
                trigger=trigger,
                drift={"report": report.to_json_dict(), "erosion": erosion, "slo_p95_ms": target},
                live_windows=[w.to_dict() for w in windows],
                before_p95_ms=_median(p95s),
            )
            audit_record(
                actor=None,
                organization=endpoint.organization,
                action="endpoint.loop.detected",
                target=endpoint,
                data={"iteration": number, "trigger": trigger[:500]},
            )
    except IntegrityError:
        return "already in flight"  # a concurrent tick created it
    return loop_advance(iteration_id=iteration.pk)


def loop_advance(*, iteration_id: int) -> str:
    """Take the iteration one step further, if its state allows it now."""
    with transaction.atomic():
        it = (
            LoopIteration.objects.select_for_update(of=("self",), skip_locked=True)
            .select_related("endpoint", "job")
            .filter(pk=iteration_id)
            .first()
        )
        if it is None:
            return "busy"  # another tick holds it (see the module docstring)
        if it.status == LoopIteration.Status.DETECTED:
            return _start_retune(it)
        if it.status == LoopIteration.Status.TUNING:
            return _judge(it)
        if it.status == LoopIteration.Status.PROMOTED:
            return _confirm_or_roll_back(it)
    return it.status


def _fail(it: LoopIteration, error: str) -> str:
    LoopIteration.objects.filter(pk=it.pk).update(
        status=LoopIteration.Status.FAILED, error=error[:2000], finished_at=timezone.now()
    )
    audit_record(
        actor=None,
        organization=it.endpoint.organization,
        action="endpoint.loop.failed",
        target=it.endpoint,
        data={"iteration": it.number, "error": error[:500]},
    )
    return "failed"


def _running_assignment(endpoint: Endpoint) -> tuple[dict[str, Any], EndpointRevision | None]:
    revision = endpoint.revisions.order_by("-generation").first()
    if revision and revision.job_id is not None and revision.trial_number is not None:
        trial = Trial.objects.filter(job_id=revision.job_id, number=revision.trial_number).first()
        if trial is not None:
            return dict(trial.assignment), revision
    return {}, revision


def _start_retune(it: LoopIteration) -> str:
    """After one more window of the new traffic: synthesise it and start a re-tuning job.

    The window that revealed the drift straddles the change (part old traffic, part new); the
    job must tune on the new traffic alone, so it waits a full window after the detection and
    takes the windows observed since.
    """
    endpoint = it.endpoint
    base = endpoint.job
    if base is None:
        return _fail(it, "the endpoint has no tuning job to take the SLO and settings from")
    since = it.detected_at
    if timezone.now() < since + timedelta(seconds=endpoint.detect_window_s):
        return "confirming"
    if not settings.LOOP_RETUNE_ON_SERVING_HOST:
        return _fail(
            it,
            "re-tuning would measure engines on the host serving this endpoint (the live traffic and "
            "the trials would disturb each other); the operator can allow it with "
            "LOOP_RETUNE_ON_SERVING_HOST=true, or re-tune from the job page on another host",
        )
    windows, _ = _windows(endpoint, since=since)
    if sum(w.num_requests for w in windows) < settings.LOOP_MIN_LIVE_REQUESTS:
        if timezone.now() > since + timedelta(seconds=10 * endpoint.detect_window_s):
            return _fail(it, "the live traffic stopped after the detection: nothing to re-tune on")
        return "confirming"
    LoopIteration.objects.filter(pk=it.pk).update(live_windows=[w.to_dict() for w in windows])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "live.jsonl"
        try:
            seconds = sum(w.interval_s for w in windows)
            rate = sum(w.num_requests for w in windows) / seconds if seconds > 0 else 0.0
            duration = RETUNE_SAMPLE_REQUESTS / rate if rate > 0 else 1.0
            synthesize_live(windows, duration_s=duration, rng=np.random.default_rng(it.number), out=path)
        except ValueError as exc:
            return _fail(it, str(exc))
        sample = traffic_sample_from_workload(
            organization=endpoint.organization,
            name=f"live traffic of {endpoint.name} (iteration {it.number})",
            path=path,
        )
    assert sample.profile is not None  # traffic_sample_from_workload always stores the profile
    live_rps = float(sample.profile["arrival"]["mean_rps"])
    spec = base.job_spec()
    incumbent, _ = _running_assignment(endpoint)
    try:
        job = tuning_job_create_for_loop(
            base=base,
            traffic_sample=sample,
            peak_rps=live_rps / spec.headroom,  # trials run at the live rate
            budget_trials=endpoint.retune_budget_trials,
            incumbent=incumbent,
        )
    except Exception as exc:  # refused (billing, residency, ...): recorded, nothing half-done
        return _fail(it, f"the re-tuning job was refused: {exc}")
    LoopIteration.objects.filter(pk=it.pk).update(
        status=LoopIteration.Status.TUNING, traffic_sample=sample, job=job
    )
    audit_record(
        actor=None,
        organization=endpoint.organization,
        action="endpoint.loop.retune",
        target=endpoint,
        data={"iteration": it.number, "job": str(job.id), "live_rps": live_rps},
    )
    return "tuning"


def _judge(it: LoopIteration) -> str:
    """Once the re-tuning job ends: the canary decides; promote through the zero-failure switch."""
    job = it.job
    if job is None:
        return _fail(it, "the re-tuning job was deleted")
    job.refresh_from_db()
    if job.is_active:
        return "tuning"
    if job.status != TuningJob.Status.SUCCEEDED:
        return _fail(it, f"the re-tuning job ended {job.status}: {job.error}")
    trials = {t.number: t for t in job.trials.filter(status=Trial.Status.DONE)}
    incumbent_assignment, _ = _running_assignment(it.endpoint)
    incumbent = next(
        (t.result for t in trials.values() if t.assignment == incumbent_assignment and t.result), None
    )
    winner = trials.get(job.winner_trial) if job.winner_trial is not None else None
    if winner is not None and winner.assignment == incumbent_assignment:
        verdict_reason = "the running configuration is still the best on the new traffic"
        promote = False
        c50 = i50 = (winner.result or {}).get("ttft_p50_ms")
    else:
        verdict = canary(winner.result if winner else None, incumbent)
        verdict_reason, promote = verdict.reason, verdict.promote
        c50, i50 = verdict.candidate_ttft_p50_ms, verdict.incumbent_ttft_p50_ms
    fields: dict[str, Any] = {
        "verdict": verdict_reason,
        "candidate_ttft_p50_ms": c50,
        "incumbent_ttft_p50_ms": i50,
    }
    if not promote or winner is None or winner.result is None:  # canary never promotes a None result
        LoopIteration.objects.filter(pk=it.pk).update(
            status=LoopIteration.Status.KEPT, finished_at=timezone.now(), **fields
        )
        audit_record(
            actor=None,
            organization=it.endpoint.organization,
            action="endpoint.loop.kept",
            target=it.endpoint,
            data={"iteration": it.number, "reason": verdict_reason[:500]},
        )
        return "kept"
    before = MetricSnapshot.objects.filter(
        endpoint=it.endpoint,
        gap=False,
        taken_at__gte=timezone.now() - timedelta(seconds=it.endpoint.detect_window_s),
    ).values_list("ttft_p95_ms", flat=True)
    revision = endpoint_switch(
        endpoint=it.endpoint,
        config=dict(winner.result["config"]),
        job=job,
        trial_number=winner.number,
        result=winner.result,
        reason=f"continual loop iteration {it.number}: {it.trigger[:300]} -> {verdict_reason}",
        actor=None,
        action="endpoint.loop.promote",
    )
    LoopIteration.objects.filter(pk=it.pk).update(
        status=LoopIteration.Status.PROMOTED,
        promoted_at=timezone.now(),
        revision=revision,
        before_p95_ms=_median(list(before)) or it.before_p95_ms,
        **fields,
    )
    return "promoted"


def _confirm_or_roll_back(it: LoopIteration) -> str:
    """After a window of live traffic on the new configuration: keep it, or roll back."""
    endpoint = it.endpoint
    assert it.promoted_at is not None
    # The switch itself takes a while (new engine start, drain): judge what follows it.
    settle = it.promoted_at + timedelta(seconds=endpoint.detect_window_s)
    if timezone.now() < settle + timedelta(seconds=endpoint.detect_window_s):
        return "watching"
    after = list(
        MetricSnapshot.objects.filter(endpoint=endpoint, gap=False, taken_at__gte=settle).values_list(
            "ttft_p95_ms", flat=True
        )
    )
    after_p95 = _median(after)
    if after_p95 is None:
        return "watching"  # no traffic since: nothing to judge yet
    if not regressed([it.before_p95_ms], after):
        LoopIteration.objects.filter(pk=it.pk).update(
            status=LoopIteration.Status.CONFIRMED, after_p95_ms=after_p95, finished_at=timezone.now()
        )
        audit_record(
            actor=None,
            organization=endpoint.organization,
            action="endpoint.loop.confirmed",
            target=endpoint,
            data={"iteration": it.number, "after_p95_ms": after_p95},
        )
        return "confirmed"
    previous = (
        endpoint.revisions.filter(generation__lt=it.revision.generation).order_by("-generation").first()
        if it.revision
        else None
    )
    if previous is None:
        return _fail(it, "live p95 TTFT regressed and there is no earlier configuration to roll back to")
    endpoint_switch(
        endpoint=endpoint,
        config=dict(previous.config),
        job=previous.job,
        trial_number=previous.trial_number,
        result={
            "ttft_p50_ms": previous.measured_ttft_p50_ms,
            "ttft_p95_ms": previous.measured_ttft_p95_ms,
        },
        reason=(
            f"rolled back iteration {it.number}: live p95 TTFT {after_p95:,.0f} ms after the promotion "
            f"vs {it.before_p95_ms or math.nan:,.0f} ms before"
        ),
        actor=None,
        action="endpoint.loop.rollback",
    )
    LoopIteration.objects.filter(pk=it.pk).update(
        status=LoopIteration.Status.ROLLED_BACK, after_p95_ms=after_p95, finished_at=timezone.now()
    )
    return "rolled back"


def _median(values: list[float | None]) -> float | None:
    clean = [float(v) for v in values if v is not None and math.isfinite(v)]
    return float(median(clean)) if clean else None
