"""Writes of the jobs app: register models, create and cancel tuning jobs, run one job step.

A job advances one trial per Celery task (`tuning_job_step`). Each step claims the job with a
lease that it keeps fresh with a heartbeat while the trial runs; a duplicate delivery finds the
lease held and does nothing, and a step whose worker was killed loses the lease after
`TUNING_LEASE_S`, so the re-delivered task re-runs only the unfinished trial. Finished trials
are never repeated: they are rows, written as each trial ends.

The broker is not trusted to hold the only copy of "this job has a step to run": the transaction
that makes the step due sets the job's `dispatch` to PENDING and records the step's message in
the task outbox (`portal.outbox`, the one durable way to hand work to the broker), which sends it
after the commit. A broker that is down or hangs costs the user a few seconds at most and leaves
the job queued in the database; the outbox's beat sends it when the broker is back, and
`tuning_jobs_redispatch` (a recoverer of that beat) owes a new step where the broker lost its
copy, and replaces steps that died (worker killed, database restarted) once their lease runs out.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from compliance.holders import DataHolder
from compliance.selectors import allowed_regions
from compliance.services import audit_record
from portal import leases
from portal.accounts import rls
from portal.accounts.models import Organization, Role, User
from portal.accounts.services import require_role
from portal.catalog import model_folders
from portal.catalog.selectors import job_price_per_hour
from portal.jobs import admission, selectors
from portal.jobs.models import ServedModel, Trial, TuningJob, step_key_prefix, trial_key_prefix
from portal.outbox.selectors import outbox_lost
from portal.outbox.services import outbox_enqueue
from portal.pools import selectors as pool_selectors
from portal.pools.models import Pool
from portal.pools.services import pool_require_usable
from portal.traffic.models import TrafficSample
from portal.traffic.services import workload_path
from serving.engine import moe_tables
from serving.engine.launcher import read_log_tail
from tuning.search.job import (
    DEFAULT_CAPACITY_STEPS,
    HARDWARE,
    MIN_BUDGET_TRIALS,
    MIN_REQUESTS_FOR_P95,
    JobSpec,
    JobSpecError,
    PlannedTrial,
    ReferenceFailedError,
    TrialRecord,
    caps_for,
    execute,
    next_trials,
    plan_job,
    report,
    validate,
)
from tuning.search.prior import pairs_from_results
from tuning.search.space import ModelLoadError, model_info
from tuning.search.trial import describe
from tuning.workload.synth import MIN_LENGTH_SCALE

logger = logging.getLogger(__name__)
_HEARTBEAT_S = 5.0
# The tasks the outbox sends for a job: its steps, and the trials of a batch out on a pool's hosts.
STEP_TASK = "portal.jobs.tasks.tuning_job_step"
TRIAL_TASK = "portal.jobs.tasks.tuning_trial_run"

# The minimum budget and its message are the library's (tuning.search.job), which refuses less
# whoever asks; the form and the API say it before the job is built.
BUDGET_HELP = (
    f"Configurations the search measures ({MIN_BUDGET_TRIALS} or more): the first is the competent "
    "baseline (vLLM's defaults with this host's fastest dtype), the others are candidates. On top "
    "of these the job runs: one reference capture first (the correctness gate's yardstick, never a "
    "candidate); then, when a candidate passes, the confirmation rounds (each re-measures the "
    "finalists and both baselines on fresh engines); and, for a confirmed gain from several knobs, "
    "an ablation (one trial a round for each changed knob, reverted)."
)


def _model_paths_elsewhere(organization: Organization) -> list[str]:
    # Every tenant's registrations: a folder's claim is platform-wide, whatever the request's tenant.
    with rls.platform_transaction():
        return list(ServedModel.objects.exclude(organization=organization).values_list("path", flat=True))


def served_model_register(*, actor: User, organization: Organization, name: str, path: str) -> ServedModel:
    require_role(actor=actor, organization=organization, minimum=Role.ADMIN, doing="register models")
    name = (name or "").strip()
    errors: dict[str, str] = {}
    if not name:
        errors["name"] = "Name the model."
    elif ServedModel.objects.filter(organization=organization, name=name).exists():
        errors["name"] = f"A model named {name!r} is already registered."
    # Model folders belong to one organization (portal.catalog.model_folders).
    try:
        place = model_folders.model_folder_place(organization=organization, path=path)
    except ValidationError as exc:
        errors.update({field: messages[0] for field, messages in exc.message_dict.items()})
    if errors:
        raise ValidationError(errors)
    resolved = place.path
    try:
        info = model_info(resolved)
    except ModelLoadError as exc:
        # The loader's reason names what exists on the host: only inside the organization's own folder.
        raise ValidationError(
            {"path": str(exc) if place.own else model_folders.not_available(organization)}
        ) from None
    with transaction.atomic():
        model_folders.model_folder_claim(
            organization=organization,
            place=place,
            registered_elsewhere=lambda: _model_paths_elsewhere(organization),
        )
        model = ServedModel.objects.create(
            organization=organization,
            name=name,
            path=str(resolved),
            architecture=info.architecture,
            num_params=info.num_params,
            created_by=actor,
        )
        audit_record(
            actor=actor, organization=organization, action="model.register", target=model, data={"name": name}
        )
    return model


def tuning_job_create(
    *,
    actor: User,
    organization: Organization,
    name: str,
    traffic_sample: TrafficSample,
    served_model: ServedModel,
    slo: str,
    peak_rps: float,
    headroom: float = 1.25,
    hardware: str = "local-cpu",
    budget_trials: int = 6,
    strategy: str = "tpe",
    duration_s: float = 20.0,
    repeats: int = 2,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    max_model_len: int | None = None,
    capacity_steps: Sequence[float] = DEFAULT_CAPACITY_STEPS,
    confirm_repeats: int = 3,
    finalists: int = 2,
    pool: str | None = None,
    length_scale: float = 1.0,
) -> TuningJob:
    """Create a job. Caps left as None come from the sample's profile (its p99 lengths, times
    `length_scale`) within the hardware's replay limit and the model's context; `length_scale`
    below 1 replays every request shorter by that factor. The job page states both and the share
    of requests they change."""
    require_role(actor=actor, organization=organization, minimum=Role.MEMBER, doing="start tuning jobs")
    return _job_create(
        actor=actor,
        organization=organization,
        name=name,
        traffic_sample=traffic_sample,
        served_model=served_model,
        slo=slo,
        peak_rps=peak_rps,
        headroom=headroom,
        hardware=hardware,
        budget_trials=budget_trials,
        strategy=strategy,
        duration_s=duration_s,
        repeats=repeats,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        max_model_len=max_model_len,
        capacity_steps=capacity_steps,
        confirm_repeats=confirm_repeats,
        finalists=finalists,
        pool=pool,
        length_scale=length_scale,
    )


def tuning_job_create_for_loop(
    *,
    base: TuningJob,
    traffic_sample: TrafficSample,
    peak_rps: float,
    budget_trials: int,
    incumbent: dict[str, Any],
) -> TuningJob:
    """A re-tuning job started by the continual loop for `base`'s organization (no user acts).

    The same SLO, model, hardware and trial settings as the job the endpoint was tuned by, on
    traffic synthesised from the live workload, with the running configuration as a candidate.
    """
    spec = base.job_spec()
    return _job_create(
        actor=None,
        organization=base.organization,
        name=f"re-tune: {base.served_model.name} on live traffic",
        traffic_sample=traffic_sample,
        served_model=base.served_model,
        slo=spec.slo,
        peak_rps=peak_rps,
        headroom=spec.headroom,
        hardware=spec.hardware,
        budget_trials=budget_trials,
        strategy="tpe",
        duration_s=spec.duration_s,
        repeats=spec.repeats,
        max_prompt_tokens=spec.max_prompt_tokens,
        max_output_tokens=spec.max_output_tokens,
        max_model_len=spec.max_model_len,
        capacity_steps=spec.capacity_steps,
        confirm_repeats=spec.confirm_repeats,
        finalists=spec.finalists,
        incumbent=incumbent,
        pool=base.pool.name if base.pool is not None else None,
        length_scale=spec.length_scale,
    )


def _job_create(
    *,
    actor: User | None,
    organization: Organization,
    name: str,
    traffic_sample: TrafficSample,
    served_model: ServedModel,
    slo: str,
    peak_rps: float,
    headroom: float,
    hardware: str,
    budget_trials: int,
    strategy: str,
    duration_s: float,
    repeats: int,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    max_model_len: int | None,
    capacity_steps: Sequence[float],
    confirm_repeats: int = 3,
    finalists: int = 2,
    incumbent: dict[str, Any] | None = None,
    pool: str | None = None,
    length_scale: float = 1.0,
) -> TuningJob:
    # Billing (above jobs) refuses new jobs while the subscription is past due.
    admission.assert_can_start(organization=organization)
    chosen: Pool | None = None
    if pool:
        # The pool decides the hardware and its price; a pool outside the organization's
        # residency (or not its to use) is refused here, before anything is written.
        chosen = pool_require_usable(organization=organization, name=pool, doing="this tuning job")
        hardware = chosen.accelerator
    if traffic_sample.organization_id != organization.id or served_model.organization_id != organization.id:
        # Never reachable through the views (they look objects up in the organization); kept
        # as the last wall.
        raise PermissionDenied("That sample or model belongs to another organization.")
    name = (name or "").strip() or f"{served_model.name} on {traffic_sample.name}"
    if traffic_sample.status != TrafficSample.Status.READY:
        raise ValidationError({"traffic_sample": "Choose a sample that finished validating."})
    num_requests = int((traffic_sample.profile or {}).get("num_requests", 0))
    if num_requests < MIN_REQUESTS_FOR_P95:
        raise ValidationError(
            {
                "traffic_sample": f"The sample has {num_requests} requests; a p95 needs at least {MIN_REQUESTS_FOR_P95}."
            }
        )
    trace = workload_path(traffic_sample)
    if not trace.exists():
        raise ValidationError({"traffic_sample": "This sample's workload is missing; upload it again."})
    target = HARDWARE.get(hardware)
    if target is None:
        raise ValidationError({"hardware": f"Unknown hardware {hardware!r}; known: {', '.join(HARDWARE)}."})
    if (
        isinstance(length_scale, bool)
        or not isinstance(length_scale, int | float)
        or not MIN_LENGTH_SCALE <= length_scale <= 1.0
    ):
        raise ValidationError(
            {"length_scale": f"Use a factor from {MIN_LENGTH_SCALE:g} to 1 (1 replays the real lengths)."}
        )
    try:
        model_max_len = model_info(served_model.path).max_position_embeddings
    except ModelLoadError as exc:
        raise ValidationError({"served_model": str(exc)}) from None
    profile = traffic_sample.profile or {}
    caps = caps_for(
        input_p99=float((profile.get("input_tokens") or {}).get("p99") or 0),
        output_p99=float((profile.get("output_tokens") or {}).get("p99") or 0),
        model_max_len=model_max_len,
        hardware=target,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        max_model_len=max_model_len,
        length_scale=length_scale,
    )
    spec = JobSpec(
        trace_path=str(trace),
        trace_format="mooncake",
        model_path=served_model.path,
        slo=slo,
        peak_rps=peak_rps,
        headroom=headroom,
        hardware=hardware,
        budget_trials=budget_trials,
        strategy=strategy,
        duration_s=duration_s,
        repeats=repeats,
        max_prompt_tokens=caps.max_prompt_tokens,
        max_output_tokens=caps.max_output_tokens,
        max_model_len=caps.max_model_len,
        length_scale=length_scale,
        capacity_steps=tuple(capacity_steps),
        confirm_repeats=confirm_repeats,
        finalists=finalists,
        incumbent=incumbent,
        # A pool's price (0: the pool is not priced), else an admin's price override (catalog
        # pages); None: the target's own.
        price_per_hour_usd=(
            (chosen.price_per_host_hour_usd or 0.0) if chosen is not None else job_price_per_hour(hardware)
        ),
    )
    try:
        # The organization's data-residency rule decides which hardware regions are possible.
        validate(
            spec,
            allowed_regions=allowed_regions(organization=organization),
            # Where the trials run: the pool's region, else this machine's (validated at start-up).
            region=chosen.region if chosen is not None else settings.LOCAL_HARDWARE_REGION,
        )
    except JobSpecError as exc:
        field = {"model_path": "served_model", "trace": "traffic_sample"}.get(exc.field, exc.field)
        raise ValidationError({field: exc.message}) from None
    with transaction.atomic():
        job = TuningJob.objects.create(
            organization=organization,
            name=name[:120],
            traffic_sample=traffic_sample,
            served_model=served_model,
            pool=chosen,
            spec=spec.to_dict(),
            created_by=actor,
        )
        audit_record(
            actor=actor,
            organization=organization,
            action="tuning_job.create",
            target=job,
            data={
                "slo": slo,
                "peak_rps": peak_rps,
                "budget_trials": budget_trials,
                "strategy": strategy,
                **({"pool": chosen.name} if chosen else {}),
                **({"length_scale": length_scale} if length_scale != 1.0 else {}),
            },
        )
        # The job is durably queued (dispatch PENDING, its step in the outbox) once this commits,
        # whatever the broker does.
        _step_owe(job)
    return job


def _step_owe(job: TuningJob) -> None:
    """Records the job's next step in the task outbox, inside the caller's transaction (the one
    that made the step due and left `dispatch` PENDING); the outbox sends it after the commit, or
    its beat does once a broker that was away is back. A pool's job goes to the pool's queue (Celery
    routing on the `pool` argument), where only that pool's agents take it; with no live host there
    the job says so, never silent."""
    pool = job.pool
    outbox_enqueue(
        task=STEP_TASK,
        kwargs={"job_id": str(job.id), **({"pool": pool.name} if pool is not None else {})},
        # One message per step owed: a step owed again (lost, died) is a new message.
        key=step_key_prefix(job.id) + uuid.uuid4().hex,
    )
    if pool is not None:
        waiting = pool_selectors.pool_waiting_reason(pool=pool)
        if waiting:
            TuningJob.objects.filter(id=job.id).update(phase=waiting[:300])


def tuning_jobs_redispatch(*, now: datetime | None = None) -> dict[str, int]:
    """Owes again every step that the broker should hold but may not (a recoverer of the outbox's
    beat, which then sends what it recorded). Returns counts by case:

    - lost: the job's step is owed (PENDING), nothing in the outbox waits to send it, and the
      broker took its last message TUNING_REDISPATCH_AFTER_S ago or more with no step claiming the
      job since (a broker that lost its data; in a merely long queue the copy is a no-op, the lease
      sees to it);
    - died: a step claimed the job and stopped without finishing (worker killed, database lost)
      and its lease ran out. The job fails instead at its TUNING_MAX_INTERRUPTIONS-th death in a
      row, so a step that cannot finish is not retried for ever.
    Only jobs that no live step holds are touched.
    """
    now = now or timezone.now()
    unheld = TuningJob.objects.filter(status__in=[TuningJob.Status.QUEUED, TuningJob.Status.RUNNING]).filter(
        leases.free_or_stale(settings.TUNING_LEASE_S, now)
    )
    counts = {"lost": 0, "died": 0, "failed": 0}
    lost_before = now - timedelta(seconds=settings.TUNING_REDISPATCH_AFTER_S)
    for job_id in unheld.filter(dispatch=TuningJob.Dispatch.PENDING).values_list("id", flat=True):
        if not outbox_lost(key_prefix=step_key_prefix(job_id), sent_before=lost_before):
            continue
        with transaction.atomic():
            job = (
                unheld.select_for_update(skip_locked=True, of=("self",))
                .select_related("pool")
                .filter(id=job_id, dispatch=TuningJob.Dispatch.PENDING)
                .first()
            )
            # Seen again under the row's lock: a concurrent beat may have owed it meanwhile.
            if job is None or not outbox_lost(key_prefix=step_key_prefix(job_id), sent_before=lost_before):
                continue
            _step_owe(job)
            counts["lost"] += 1
    for job_id in unheld.filter(dispatch=TuningJob.Dispatch.TAKEN).values_list("id", flat=True):
        with transaction.atomic():
            job = (
                unheld.select_for_update(skip_locked=True, of=("self",))
                .select_related("organization", "pool")
                .filter(id=job_id, dispatch=TuningJob.Dispatch.TAKEN)
                .first()
            )
            if job is None:
                continue
            if job.interruptions + 1 >= settings.TUNING_MAX_INTERRUPTIONS:
                done = job.trials.filter(status=Trial.Status.DONE).count()
                _finish(
                    job,
                    TuningJob.Status.FAILED,
                    error=(
                        f"Stopped after {job.interruptions + 1} interrupted attempts in a row at the step "
                        f"after {done} finished trial(s): each time its worker stopped or lost the database "
                        "before the step ended"
                        + (f" (last: {job.phase})" if job.phase else "")
                        + ". Start the job again."
                    ),
                )
                counts["failed"] += 1
                continue
            TuningJob.objects.filter(id=job_id).update(
                dispatch=TuningJob.Dispatch.PENDING,
                interruptions=F("interruptions") + 1,
                **leases.FREE,
            )
            logger.warning("tuning job %s: its step stopped without finishing; sending it again", job_id)
            _step_owe(job)
            counts["died"] += 1
    counts.update(_trials_redispatch(now))
    return counts


def tuning_job_cancel(*, actor: User, job: TuningJob) -> TuningJob:
    require_role(actor=actor, organization=job.organization, minimum=Role.MEMBER, doing="cancel tuning jobs")
    if not job.is_active:
        raise ValidationError("This job has already ended.")
    with transaction.atomic():
        # A queued job stops at once; a running one after its current trial.
        stopped = TuningJob.objects.filter(id=job.id, status=TuningJob.Status.QUEUED).update(
            status=TuningJob.Status.CANCELLED, cancel_requested=True, finished_at=timezone.now()
        )
        if not stopped:
            TuningJob.objects.filter(id=job.id).update(cancel_requested=True)
        audit_record(actor=actor, organization=job.organization, action="tuning_job.cancel", target=job)
    job.refresh_from_db()
    return job


def _claim(job_id: str, owner: str) -> bool:
    """Take the job's lease if it is free or its holder stopped heartbeating (a dead worker).

    A duplicate delivery while the holder is alive finds the lease fresh and does nothing: the
    holder enqueues the next step itself. A holder killed mid-trial leaves its message unacked;
    the broker re-delivers it after the visibility timeout (longer than the lease), by when the
    heartbeat is stale and the re-delivered step takes over.
    """
    return leases.take(
        TuningJob.objects.filter(id=job_id, status__in=[TuningJob.Status.QUEUED, TuningJob.Status.RUNNING])
        # A job whose batch of trials is out waits for them: only the batch's last trial owes
        # its next step, so a stray copy of an earlier step's message does nothing.
        .exclude(dispatch=TuningJob.Dispatch.TRIALS),
        owner,
        lease_s=settings.TUNING_LEASE_S,
        dispatch=TuningJob.Dispatch.TAKEN,
    )


# --- The running trial's engine log, for the job page ------------------------------------------

ENGINE_LOG_LINES = 20
ENGINE_LOG_LINE_CHARS = 300
_ENGINE_LOG_POLL_S = 2.0  # the job page polls every 2 s
# Where `tuning.search.trial.run_trial` has the engine write, in the trial's folder.
ENGINE_LOG_NAME = "engine.log"
# An absolute path of two or more parts, not part of a URL ("http://host/v1/..."), where a
# token starts (after a space, a quote, "=", a bracket...).
_ABS_PATH = re.compile(r"(?<![\w.:/~\-])/[^\s'\"`,;:()\[\]{}<>=|]+(?:/[^\s'\"`,;:()\[\]{}<>=|]*)+")
# The engine's own HTTP routes, which vLLM logs at start-up: not server paths.
_ROUTE_PREFIXES = ("/v1/", "/v2/", "/metrics", "/health", "/ping", "/version", "/tokenize", "/detokenize")
_SECRET = re.compile(
    r"""(api[_-]?key['"]?(?:\s*[:=]\s*|\s+)['"]?)[^\s'",})]+|tgk_[A-Za-z0-9_]+""", re.IGNORECASE
)


def _path_hidden(match: re.Match[str]) -> str:
    path = match.group(0)
    if path.startswith(_ROUTE_PREFIXES):
        return path
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return f"…/{name}" if name else "…"


def engine_log_for_customer(lines: Sequence[str], *, replacements: Mapping[str, str]) -> list[str]:
    """Engine log lines as a customer may read them on their job's page.

    The engine prints server paths (the interpreter, site-packages in a traceback, the work
    folder, the model folder) and may print its API key. `replacements` turns this job's own
    folders into names the customer knows (its model folder into the model's name, its work
    folder into "job"); any other absolute path keeps only its last part, and keys are starred.
    Lines are cut to ENGINE_LOG_LINE_CHARS; at most ENGINE_LOG_LINES of the last are kept.
    """
    ordered = sorted(
        ((k.rstrip("/"), v) for k, v in replacements.items() if k.strip("/")), key=lambda kv: -len(kv[0])
    )
    out = []
    for line in list(lines)[-ENGINE_LOG_LINES:]:
        for folder, shown in ordered:
            line = line.replace(folder, shown)
        line = _SECRET.sub(lambda m: (m.group(1) or "") + "***", line)
        line = _ABS_PATH.sub(_path_hidden, line)
        if len(line) > ENGINE_LOG_LINE_CHARS:
            line = line[: ENGINE_LOG_LINE_CHARS - 1] + "…"
        out.append(line)
    return out


def _log_replacements(job: TuningJob) -> dict[str, str]:
    replacements = {str(selectors.job_work_dir(job)): "job"}
    model = job.served_model
    if model is not None and model.path:
        replacements[str(model.path)] = f"<model {model.name}>"
    return replacements


def trial_engine_log_record(*, trial: Trial, log_path: Path, replacements: Mapping[str, str]) -> bool:
    """Store the last lines of a running trial's engine log (see `engine_log_for_customer`).
    Returns whether they changed. A finished trial keeps what it had."""
    text = "\n".join(
        engine_log_for_customer(read_log_tail(log_path, ENGINE_LOG_LINES), replacements=replacements)
    )
    changed = (
        Trial.objects.filter(pk=trial.pk, status=Trial.Status.RUNNING)
        .exclude(engine_log=text)
        .update(engine_log=text)
    )
    return bool(changed)


class _EngineLogWatch:
    """Copies the running trial's engine log tail into its row every few seconds from a thread,
    for as long as the trial runs (its engine may be on a pool host the web server cannot read).
    Best effort: a database that is away costs lines on the page, never the trial."""

    def __init__(self, trial: Trial, log_path: Path, replacements: Mapping[str, str]) -> None:
        self.trial, self.log_path, self.replacements = trial, log_path, dict(replacements)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"engine-log-{trial.pk}")

    def _record(self) -> None:
        try:
            trial_engine_log_record(trial=self.trial, log_path=self.log_path, replacements=self.replacements)
        except DatabaseError as exc:
            logger.warning("trial %s: engine log not recorded (%s)", self.trial.pk, exc)
            connection.close()

    def _run(self) -> None:
        try:
            while not self.stop.wait(_ENGINE_LOG_POLL_S):
                self._record()
            self._record()
        finally:
            connection.close()

    def __enter__(self) -> _EngineLogWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def _history(job: TuningJob) -> list[TrialRecord]:
    return [
        TrialRecord(number=t.number, assignment=t.assignment, result=t.result or {})
        for t in job.trials.filter(status=Trial.Status.DONE).order_by("number")
    ]


def _calibration_pairs(job: TuningJob) -> list[Any]:
    """The organization's trials of the same model on the same hardware that finished before
    this job was created (a correction learnt on one model's step times does not carry to another).

    They calibrate the simulator for this job; later trials (this job's own included) do not, so
    every step of one job ranks and predicts with the same calibration.
    """
    hardware = job.hardware
    results = (
        Trial.objects.filter(
            organization=job.organization,
            status=Trial.Status.DONE,
            finished_at__lt=job.created_at,
            job__spec__hardware=hardware,
            job__served_model_id=job.served_model_id,
        )
        .order_by("-finished_at")
        .values_list("result", flat=True)[:200]
    )
    return pairs_from_results(r for r in results if r)


def _finish(job: TuningJob, status: str, *, prepared: Any = None, error: str = "") -> None:
    history = _history(job)
    data = report(prepared, history) if prepared is not None and history else None
    with transaction.atomic():
        TuningJob.objects.filter(id=job.id).update(
            status=status,
            report=data,
            error=error,
            finished_at=timezone.now(),
            winner_trial=((data or {}).get("selection") or {}).get("winner"),
            phase="",
            **leases.FREE,
        )
        audit_record(actor=None, organization=job.organization, action=f"tuning_job.{status}", target=job)


def _phase(job_id: str, text: str) -> None:
    """Say what the job is doing now (the job page shows it). Best effort: a database that is
    away only costs the line."""
    try:
        TuningJob.objects.filter(id=job_id).update(phase=text[:300])
    except DatabaseError as exc:
        logger.warning("tuning job %s: phase not recorded (%s)", job_id, exc)


MOE_TABLES_TIMEOUT_S = 900.0  # the step's own plan refuses one over 420 s of timings


def _moe_tables_step(job: TuningJob, prepared: Any, history: Sequence[TrialRecord]) -> None:
    """The job's last step (issue 25): on a GPU pool's host, tune vLLM's fused-MoE table for the
    winner's configuration and the job's traffic (`tailguard moe-tables tune`, run as a process:
    the portal imports no CLI); the tables ship with an endpoint deployed from the job. What it
    did, or why it tuned nothing (a dense model, a CPU pool, no GPU here), is the job's note.
    Run once: a step redelivered after it keeps what it recorded."""
    if job.moe_tables or job.moe_tables_note:
        return
    spec = job.job_spec()
    if spec.hardware not in moe_tables.CATALOG_DEVICE_NAMES:
        gpus = ", ".join(sorted(moe_tables.CATALOG_DEVICE_NAMES))
        note = f"not tuned: {spec.hardware} runs no fused-MoE Triton kernel (kernel tables are for {gpus})"
        TuningJob.objects.filter(id=job.id).update(moe_tables_note=note)
        return
    winner = (report(prepared, history).get("selection") or {}).get("winner")
    record = next((h for h in history if h.number == winner), None)
    config = record.result.get("config") if record is not None else None
    if not isinstance(config, dict):
        TuningJob.objects.filter(id=job.id).update(
            moe_tables_note="not tuned: the job has no winner to tune for"
        )
        return
    _phase(str(job.id), "tuning the fused-MoE kernel tables for the traffic on this host's GPU")
    tables: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tailguard-moe-") as tmp:
        config_file = Path(tmp) / "config.json"
        config_file.write_text(json.dumps(config))
        command = [
            sys.executable, "-m", "tailguard.cli", "moe-tables", "tune",
            "--model-dir", spec.model_path, "--config", str(config_file), "--trace", spec.trace_path,
            "--hardware", spec.hardware, "--out", str(Path(tmp) / "tables"),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=MOE_TABLES_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            note = f"not tuned: the step ran past {MOE_TABLES_TIMEOUT_S:.0f} s and was stopped"
        else:
            try:
                out = json.loads((done.stdout.strip().splitlines() or ["{}"])[-1])
                tables, note = dict(out["tables"]), str(out["note"])
            except (ValueError, KeyError, TypeError):
                note = f"not tuned: the step failed (exit {done.returncode}: {done.stderr.strip()[-500:]})"
    _reconnect_if_lost()
    TuningJob.objects.filter(id=job.id).update(moe_tables=tables, moe_tables_note=note[:2000])


def tuning_job_step(*, job_id: str, owner: str) -> str:
    """Run the job's next trial (or finish it). Returns what the step did."""
    if not _claim(job_id, owner):
        return "busy-or-done"
    # A step that raises gives the job back at once; one that lost the database (restart,
    # failover) leaves the lease to run out after TUNING_LEASE_S, when `jobs_redispatch` hands
    # the job to a new step.
    return leases.hold(
        TuningJob.objects.filter(id=job_id),
        owner,
        lambda: _step(job_id, owner),
        every_s=_HEARTBEAT_S,
        name=f"tuning job {job_id}",
    )


def _reconnect_if_lost() -> None:
    """Planning and trials run for a while without the database, which may have restarted
    meanwhile: a dead session is replaced before the step writes, rather than failing the step
    (and losing a measured trial). A database still away fails the step; its lease runs out."""
    if connection.connection is not None and not connection.in_atomic_block and not connection.is_usable():
        connection.close()


def _step(job_id: str, owner: str) -> str:
    job = TuningJob.objects.select_related("organization").get(id=job_id)
    if job.status == TuningJob.Status.QUEUED:
        TuningJob.objects.filter(id=job_id).update(status=TuningJob.Status.RUNNING, started_at=timezone.now())
    plan_error = ""
    try:
        prepared = plan_job(job.job_spec(), selectors.job_work_dir(job), calibration=_calibration_pairs(job))
    except JobSpecError as exc:
        plan_error = str(exc)
    _reconnect_if_lost()
    if plan_error:
        _finish(job, TuningJob.Status.FAILED, error=plan_error)
        return "failed"
    if job.cancel_requested:
        _finish(job, TuningJob.Status.CANCELLED, prepared=prepared)
        return "cancelled"
    history = _history(job)
    try:
        batch = next_trials(prepared, history, slots=_slots(job))
    except ReferenceFailedError as exc:
        _finish(job, TuningJob.Status.FAILED, prepared=prepared, error=f"{exc}. No candidate was judged.")
        return "failed"
    if not batch:
        _moe_tables_step(job, prepared, history)
        _reconnect_if_lost()
        _finish(job, TuningJob.Status.SUCCEEDED, prepared=prepared)
        return "finished"
    if len(batch) > 1:
        return _batch_send(job, history, batch, owner)
    planned = batch[0]
    assignment = planned.assignment
    number = len(history)
    trial, created = Trial.objects.get_or_create(
        job=job,
        number=number,
        defaults={
            "organization": job.organization,
            "assignment": assignment,
            "label": describe(assignment),
        },
    )
    if not created:
        # A worker died during this trial: run it again from the start.
        Trial.objects.filter(pk=trial.pk).update(
            attempts=trial.attempts + 1, assignment=assignment, label=describe(assignment)
        )
    # On a pool's host the trial records which host measured it, with its facts (the job page
    # shows them); a step that dies there leaves the host named in the job's phase.
    here = pool_selectors.host_here()
    where = f" on host {here.name}" if here is not None else ""
    _phase(job_id, f"trial {number}{where}: {planned.describe()}")
    trial_dir = selectors.job_work_dir(job) / f"trial-{number}"
    with _EngineLogWatch(trial, trial_dir / ENGINE_LOG_NAME, _log_replacements(job)):
        result = execute(
            prepared,
            planned,
            history,
            trial_dir,
            holder=f"tuning job {job_id} trial {number}",
            on_host_wait=lambda who: _phase(
                job_id,
                f"trial {number}{where}: waiting for the engine host ({who} holds it; one measurement at a time)",
            ),
        )
    if here is not None:
        result = {**result, "host": pool_selectors.host_summary(here)}
    live_report = report(prepared, [*history, TrialRecord(number, assignment, result)])
    _reconnect_if_lost()
    with transaction.atomic():
        # Fenced by the lease: a step that lost it (its heartbeats stopped reaching the database
        # for longer than the lease, and a new step took the job over) drops its late result.
        if not leases.held(TuningJob.objects.filter(id=job_id), owner):
            logger.warning("tuning job %s: step %s lost its lease during trial %s", job_id, owner, number)
            return "lease-lost"
        Trial.objects.filter(pk=trial.pk).update(
            status=Trial.Status.DONE, result=result, finished_at=timezone.now()
        )
        # The next step is owed from this commit on (the outbox), sent right after it. The report
        # is kept current as trials arrive (caps, confirmation progress, the running selection).
        TuningJob.objects.filter(id=job_id).update(
            **leases.FREE,
            dispatch=TuningJob.Dispatch.PENDING,
            interruptions=0,
            report=live_report,
            phase="",
        )
        _step_owe(job)
    return f"trial {number}"


# --- A batch of trials at once on a pool's hosts ------------------------------------------------
#
# With several idle hosts in its pool, the job's step plans a batch of search trials (the
# search's batch mode, `tuning.search.job.next_trials`) instead of measuring one itself: it
# writes one row per trial (what to measure, the batch it belongs to), owes one task per trial
# to the pool's queue and lets the job wait (`Dispatch.TRIALS`). Each trial task claims its row
# with its own lease, measures on the host that took it and records the result; the last of the
# batch to finish owes the job's next step (the outbox again), which then sees the whole batch in
# trial-number order, whichever host was faster. A trial whose host died is sent again (another
# host takes it) until TUNING_MAX_INTERRUPTIONS, then recorded as failed with the host named.


def _slots(job: TuningJob) -> int:
    """How many trials the job may measure at once: its pool's idle live hosts, this step's own
    host included (at most TUNING_MAX_PARALLEL_TRIALS); 1 without a pool."""
    if job.pool is None:
        return 1
    live = pool_selectors.hosts_live(pool=job.pool)
    idle = set(live.filter(current_task="").values_list("id", flat=True))
    here = pool_selectors.host_here()
    if here is not None and live.filter(id=here.id).exists():
        idle.add(here.id)
    return max(1, min(len(idle), settings.TUNING_MAX_PARALLEL_TRIALS))


def _batch_send(
    job: TuningJob, history: Sequence[TrialRecord], batch: Sequence[PlannedTrial], owner: str
) -> str:
    pool = job.pool
    assert pool is not None, "a batch of trials runs on a pool's hosts"  # _slots: 1 without a pool
    first = len(history)
    numbers = list(range(first, first + len(batch)))
    with transaction.atomic():
        if not leases.held(TuningJob.objects.filter(id=job.id), owner):
            return "lease-lost"
        for number, planned in zip(numbers, batch, strict=True):
            trial, _ = Trial.objects.update_or_create(
                job=job,
                number=number,
                defaults={
                    "organization": job.organization,
                    "assignment": planned.assignment,
                    "label": describe(planned.assignment),
                    "planned": asdict(planned),
                    "batch": first,
                    "status": Trial.Status.RUNNING,
                    "result": None,
                    "host": None,
                    **leases.FREE,
                },
            )
            _trial_owe(trial, pool)
        TuningJob.objects.filter(id=job.id).update(
            **leases.FREE,
            dispatch=TuningJob.Dispatch.TRIALS,
            interruptions=0,
            phase=f"trials {first}-{numbers[-1]} at once on the hosts of pool {pool.name}",
        )
    return f"trials {first}-{numbers[-1]}"


def _trial_owe(trial: Trial, pool: Pool) -> None:
    """Records one trial of a batch in the task outbox for its pool's queue, inside the caller's
    transaction (sent after the commit, or by the outbox's beat while the broker is away)."""
    outbox_enqueue(
        task=TRIAL_TASK,
        kwargs={"trial_id": str(trial.pk), "pool": pool.name},
        key=trial_key_prefix(trial.pk) + uuid.uuid4().hex,
    )


def _trial_claim(trial_id: int, owner: str) -> bool:
    return leases.take(
        Trial.objects.filter(
            pk=trial_id,
            status=Trial.Status.RUNNING,
            batch__isnull=False,
            job__status=TuningJob.Status.RUNNING,
            job__dispatch=TuningJob.Dispatch.TRIALS,
        ),
        owner,
        lease_s=settings.TUNING_LEASE_S,
        host=pool_selectors.host_here(),
    )


def tuning_trial_run(*, trial_id: int, owner: str) -> str:
    """Measure one trial of a batch on this host (the pool's agent took its task). Idempotent: a
    trial that another live task holds, or that has its result, is left alone."""
    if not _trial_claim(trial_id, owner):
        return "busy-or-done"
    return leases.hold(
        Trial.objects.filter(pk=trial_id),
        owner,
        lambda: _trial_measure(trial_id, owner),
        every_s=_HEARTBEAT_S,
        name=f"trial {trial_id}",
    )


def _batch_history(job: TuningJob, batch: int) -> list[TrialRecord]:
    return [r for r in _history(job) if r.number < batch]


def _trial_measure(trial_id: int, owner: str) -> str:
    trial = Trial.objects.select_related("job__organization", "job__served_model", "host").get(pk=trial_id)
    job, batch = trial.job, int(trial.batch or 0)
    planned = PlannedTrial(**(trial.planned or {"phase": "unknown", "assignment": trial.assignment}))
    here = pool_selectors.host_here()
    where = f"host {here.name}" if here is not None else "this machine"
    trial_dir = selectors.job_work_dir(job) / f"trial-{trial.number}"
    try:
        prepared = plan_job(job.job_spec(), selectors.job_work_dir(job), calibration=_calibration_pairs(job))
    except JobSpecError as exc:
        result: dict[str, Any] = {"status": "failed", "error": f"on {where}: {exc}", **planned.stamp()}
    else:
        with _EngineLogWatch(trial, trial_dir / ENGINE_LOG_NAME, _log_replacements(job)):
            result = execute(
                prepared,
                planned,
                _batch_history(job, batch),
                trial_dir,
                holder=f"tuning job {job.id} trial {trial.number}",
            )
    if here is not None:
        result = {**result, "host": pool_selectors.host_summary(here)}
    _reconnect_if_lost()
    return _trial_record(job, trial, result, owner=owner)


def _trial_record(job: TuningJob, trial: Trial, result: dict[str, Any], *, owner: str | None) -> str:
    """Store one batch trial's result; the batch's last owes the job's next step. `owner`: the
    task that must still hold the trial's lease (None: the redispatcher, which holds the row)."""
    with transaction.atomic():
        # The job's row first: two siblings finishing together agree on which one was last.
        TuningJob.objects.select_for_update().filter(id=job.id).first()
        row = Trial.objects.filter(pk=trial.pk, status=Trial.Status.RUNNING)
        if not (leases.held(row, owner) if owner is not None else row.select_for_update().exists()):
            logger.warning("tuning job %s: trial %s lost its lease", job.id, trial.number)
            return "lease-lost"
        Trial.objects.filter(pk=trial.pk).update(
            status=Trial.Status.DONE,
            result=result,
            finished_at=timezone.now(),
            **leases.FREE,
        )
        if job.trials.filter(status=Trial.Status.RUNNING).exists():
            return f"trial {trial.number}"
        if TuningJob.objects.filter(id=job.id, dispatch=TuningJob.Dispatch.TRIALS).update(
            dispatch=TuningJob.Dispatch.PENDING, phase=""
        ):
            _step_owe(TuningJob.objects.select_related("pool").get(id=job.id))
    return f"trial {trial.number} (last of its batch)"


def _trials_redispatch(now: datetime) -> dict[str, int]:
    """The batch trials the broker should hold but may not: unclaimed, with nothing in the outbox
    waiting to send them and the broker's last copy taken TUNING_REDISPATCH_AFTER_S ago or more
    (lost), or claimed by a task whose lease ran out (its host died)."""
    counts = {"trials_lost": 0, "trials_died": 0, "trials_failed": 0}
    stale = leases.stale_before(settings.TUNING_LEASE_S, now)
    lost_before = now - timedelta(seconds=settings.TUNING_REDISPATCH_AFTER_S)
    out = Trial.objects.filter(
        status=Trial.Status.RUNNING,
        batch__isnull=False,
        job__status=TuningJob.Status.RUNNING,
        job__dispatch=TuningJob.Dispatch.TRIALS,
        job__pool__isnull=False,
    )
    for pk in out.filter(lease_owner="").values_list("pk", flat=True):
        if not outbox_lost(key_prefix=trial_key_prefix(pk), sent_before=lost_before):
            continue
        with transaction.atomic():
            trial = (
                out.select_for_update(skip_locked=True, of=("self",))
                .select_related("job__pool")
                .filter(pk=pk, lease_owner="")
                .first()
            )
            if trial is None or not outbox_lost(key_prefix=trial_key_prefix(pk), sent_before=lost_before):
                continue
            assert trial.job.pool is not None
            _trial_owe(trial, trial.job.pool)
            counts["trials_lost"] += 1
    for pk in out.exclude(lease_owner="").filter(lease_heartbeat_at__lt=stale).values_list("pk", flat=True):
        with transaction.atomic():
            trial = (
                out.select_for_update(skip_locked=True, of=("self",))
                .select_related("job__pool", "host")
                .filter(pk=pk, lease_heartbeat_at__lt=stale)
                .first()
            )
            if trial is None:
                continue
            host = trial.host
            named = f"host {host.name}" if host is not None else "its host"
            if trial.attempts >= settings.TUNING_MAX_INTERRUPTIONS:
                planned = PlannedTrial(
                    **(trial.planned or {"phase": "unknown", "assignment": trial.assignment})
                )
                result = {
                    "status": "failed",
                    "error": f"{named} stopped while it measured this trial, {trial.attempts} time(s) in a row",
                    **planned.stamp(),
                    **({"host": pool_selectors.host_summary(host)} if host is not None else {}),
                }
                _trial_record(trial.job, trial, result, owner=None)
                counts["trials_failed"] += 1
                continue
            Trial.objects.filter(pk=pk).update(**leases.FREE, attempts=F("attempts") + 1)
            logger.warning(
                "tuning job %s: trial %s stopped on %s; sending it again", trial.job_id, trial.number, named
            )
            assert trial.job.pool is not None
            _trial_owe(trial, trial.job.pool)
            counts["trials_died"] += 1
    return counts


# --- Organization deletion (registered with compliance.holders) ---------------------------------


def jobs_files_remove(organization: Organization) -> None:
    for job_id in TuningJob.objects.filter(organization=organization).values_list("id", flat=True):
        shutil.rmtree(Path(settings.TUNING_WORK_DIR) / str(job_id), ignore_errors=True)


def jobs_count(organization: Organization) -> dict[str, int]:
    return {"jobs": TuningJob.objects.filter(organization=organization).count()}


def jobs_rows_delete(organization: Organization) -> None:
    # Before the organization's cascade: a job's sample and served models are protected from it.
    TuningJob.objects.filter(organization=organization).delete()


JOBS_HOLDER = DataHolder(
    name="jobs",
    order=20,
    remove_files=jobs_files_remove,
    count=jobs_count,
    delete_rows=jobs_rows_delete,
)
