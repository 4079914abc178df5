"""Writes of the endpoints app: deploy a job's winner, watch it, promote, stop it.

The portal holds no engine process. An endpoint is run by a runner (`serving.runner.base`): the
local supervisor (`tailguard endpoint serve`: router at the stable address, crash restarts,
zero-failure swaps) started on an engine host by that host's agent, or Kubernetes. The database
stores the runner's handle and its last state, nothing else about the process. Start, stop, a
new configuration and the watch's scrape are Celery tasks routed where the endpoint runs: a
pool's start to the pool's queue (any of its hosts), everything after it to the queue of the host
that started it; an endpoint without a pool runs on this deployment's own workers.

The database holds the configuration the endpoint should serve; the runner follows it. A
switch hands it over once its transaction commits, and every watch round hands it over again if
it differs, so a worker killed between the commit and the write (or a write that failed) delays
the hand-over by one round instead of losing it.
"""

from __future__ import annotations

import logging
import re
import secrets
import shutil
import socket
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from compliance.holders import DataHolder, RetentionCutoffs
from compliance.selectors import allowed_regions
from compliance.services import audit_record, residency_require_hardware
from compliance.storage import seal, unseal
from portal.accounts import tokens
from portal.accounts.models import Organization, Role, User
from portal.accounts.services import require_role
from portal.endpoints.models import Endpoint, EndpointRevision, MetricSnapshot
from portal.jobs.models import TuningJob
from portal.outbox.services import outbox_enqueue
from portal.pools.models import Pool
from portal.pools.selectors import host_here, pool_waiting_reason
from portal.pools.services import pool_require_usable
from serving.engine.config import EngineConfig, InvalidEngineConfig
from serving.runner import k8s_tables
from serving.runner.base import (
    EndpointLaunch,
    EndpointRunner,
    MetricsReading,
    RunnerError,
    RunnerHandle,
    RunnerState,
)
from serving.runner.k8s_runner import ClusterTarget, KubernetesRunner, object_name
from serving.runner.supervisor import LocalSupervisorRunner, process_alive
from tuning.continual import LiveWindow

logger = logging.getLogger(__name__)

ENDPOINT_KEY_PREFIX = "tgk_"


def endpoint_dir(endpoint: Endpoint) -> Path:
    return Path(settings.ENDPOINTS_DIR) / str(endpoint.id)


def _winner(job: TuningJob) -> tuple[int, dict[str, object]]:
    if job.status != TuningJob.Status.SUCCEEDED or job.winner_trial is None:
        raise ValidationError({"job": "Only a finished job with a winner can be deployed."})
    trial = job.trials.filter(number=job.winner_trial).first()
    if trial is None or not trial.result:
        raise ValidationError({"job": "The winning trial's record is missing."})
    return trial.number, trial.result


def _tables_to_ship(
    job: TuningJob | None, *, hardware: str, config: dict[str, object]
) -> tuple[dict[str, str], str, str]:
    """(tables, digest, note): the job's tuned fused-MoE tables where the endpoint's engine can
    read them; none, with the reason in the note, where it cannot (tables for another device, a
    configuration already pointing vLLM elsewhere): the engine then runs vLLM's own."""
    if job is None or not job.moe_tables:
        return {}, "", ""
    try:
        shipped = k8s_tables.tables_from_files(job.moe_tables)
        k8s_tables.check_tables(
            shipped, hardware=hardware, model=None, config=EngineConfig.from_mapping(config)
        )
    except (k8s_tables.TablesRefused, InvalidEngineConfig) as exc:
        note = f"tuning job {job.name!r} tuned MoE tables that are not shipped ({exc}); the engine runs vLLM's own"
        return {}, "", note[:2000]
    return dict(shipped.files), shipped.digest, ""


DEPLOY_TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9_-]{20,64}$")


def deploy_token_new() -> str:
    """A one-time token for a deploy form (see `endpoint_deploy_once`)."""
    return secrets.token_urlsafe(24)


def endpoint_deploy_once(*, actor: User, job: TuningJob, deploy_token: str) -> tuple[Endpoint, str | None]:
    """`endpoint_deploy`, at most once per deploy form: the same token again (a double click, a
    refresh, a retried request, two at once) returns the endpoint it made and no key (the key
    is shown once, to the request that made it)."""
    if not DEPLOY_TOKEN_PATTERN.match(deploy_token or ""):
        raise ValidationError(
            {"deploy_token": "This deploy form has expired: open the job and deploy again."}
        )
    require_role(actor=actor, organization=job.organization, minimum=Role.MEMBER, doing="deploy endpoints")
    existing = Endpoint.objects.filter(organization=job.organization, deploy_token=deploy_token).first()
    if existing is not None:
        return existing, None
    try:
        return endpoint_deploy(actor=actor, job=job, deploy_token=deploy_token)
    except IntegrityError:
        # The same form, sent at the same moment, won the unique token: that one is the endpoint.
        existing = Endpoint.objects.filter(organization=job.organization, deploy_token=deploy_token).first()
        if existing is None:
            raise
        return existing, None


def endpoint_deploy(
    *,
    actor: User,
    job: TuningJob,
    name: str = "",
    deploy_token: str | None = None,
    pool: str | None = None,
) -> tuple[Endpoint, str]:
    """A new endpoint serving the job's winner. Returns the endpoint and its API key (shown once).
    Pages deploy through `endpoint_deploy_once`, which passes the form's token. It serves on
    `pool` (default: the pool the job was tuned on), which the organization's residency must allow."""
    require_role(actor=actor, organization=job.organization, minimum=Role.MEMBER, doing="deploy endpoints")
    pool_name = pool or (job.pool.name if job.pool is not None else None)
    chosen: Pool | None = None
    if pool_name:
        chosen = pool_require_usable(organization=job.organization, name=pool_name, doing="this endpoint")
        if chosen.accelerator != job.hardware:
            raise ValidationError(
                {
                    "pool": f"Pool {chosen.name} is {chosen.accelerator}; the job tuned for "
                    f"{job.hardware}: deploy on a pool of the same hardware."
                }
            )
    else:
        residency_require_hardware(
            organization=job.organization,
            hardware=job.hardware,
            doing="this endpoint",
        )
    number, result = _winner(job)
    # Clients name the model by its short name (the one registered in the portal), not by the
    # folder it was loaded from: the engine serves it under that name.
    config = {**dict(result["config"]), "served_model_name": job.served_model.name}  # type: ignore[call-overload]
    tables, digest, tables_note = _tables_to_ship(
        job, hardware=chosen.accelerator if chosen is not None else job.hardware, config=config
    )
    prefix, secret = secrets.token_hex(4), secrets.token_urlsafe(32)
    api_key = f"{ENDPOINT_KEY_PREFIX}{prefix}_{secret}"
    # No port here: the host that starts it picks one of its own free ports and reports it
    # (endpoint_start); the address follows then, where the pool's URL carries the port.
    endpoint_id = uuid.uuid4()
    with transaction.atomic():
        endpoint = Endpoint.objects.create(
            id=endpoint_id,
            organization=job.organization,
            name=(name or f"{job.served_model.name} (tuned)")[:120],
            served_model=job.served_model,
            job=job,
            pool=chosen,
            runner_kind=runner_kind_for(chosen),
            base_url=public_base_url(pool=chosen, port=None, endpoint_id=str(endpoint_id)),
            config=config,
            moe_tables=tables,
            moe_tables_note=tables_note,
            api_key_prefix=prefix,
            api_key_hash=tokens.digest(api_key),
            # The host that starts it reads the key from here (never from a message or a command line).
            api_key_sealed=seal(api_key.encode(), purpose=_KEY_PURPOSE),
            created_by=actor,
            deploy_token=deploy_token,
        )
        _revision(
            endpoint,
            1,
            config,
            job,
            number,
            result,
            f"deployed the winner of tuning job {job.name!r} (trial {number})",
            tables=(digest, tables_note),
        )
        event = audit_record(
            actor=actor,
            organization=job.organization,
            action="endpoint.deploy",
            target=endpoint,
            data={"job": str(job.id), "trial": number},
        )
        _enqueue("endpoint_start", endpoint, action=str(event.id), start=True)
    # Where the start ran at once (eager tasks, no outer transaction), its port is known now.
    endpoint.refresh_from_db()
    return endpoint, api_key


def endpoint_promote(*, actor: User, endpoint: Endpoint, job: TuningJob) -> EndpointRevision:
    """Re-deploy a running endpoint with another job's winner, at the same address and key.

    The supervisor sees its config file change and swaps engines without failing a request; if
    the new engine does not start, the old configuration keeps serving and the state says why.
    """
    require_role(
        actor=actor, organization=endpoint.organization, minimum=Role.MEMBER, doing="promote configurations"
    )
    if job.organization_id != endpoint.organization_id:
        raise PermissionDenied("That job belongs to another organization.")
    if not endpoint.is_active:
        raise ValidationError("Only a running endpoint can be re-deployed.")
    if job.served_model_id != endpoint.served_model_id:
        raise ValidationError({"job": "That job tuned another model."})
    number, result = _winner(job)
    config = dict(result["config"])  # type: ignore[call-overload]
    return endpoint_switch(
        endpoint=endpoint,
        config=config,
        job=job,
        trial_number=number,
        result=result,
        reason=f"promoted the winner of tuning job {job.name!r} (trial {number})",
        actor=actor,
        action="endpoint.promote",
    )


def endpoint_switch(
    *,
    endpoint: Endpoint,
    config: dict[str, object],
    job: TuningJob | None,
    trial_number: int | None,
    result: dict[str, object],
    reason: str,
    actor: User | None,
    action: str,
) -> EndpointRevision:
    """Record a new generation and hand its config to the runner (after the commit).

    The runner swaps engines without failing a request; callers check permissions.
    """
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        # A new configuration keeps the name clients call the model by (a job's or the loop's
        # winner names none); an endpoint deployed before short names keeps its folder path.
        served_name = (locked.config or {}).get("served_model_name")
        config = {**config, "served_model_name": served_name} if served_name else dict(config)
        generation = (
            locked.revisions.order_by("-generation").values_list("generation", flat=True).first() or 0
        ) + 1
        # A job's winner brings the job's tables (a promotion can change them); a switch without
        # a job keeps the tables serving now.
        if job is not None:
            hardware = locked.pool.accelerator if locked.pool is not None else job.hardware
            tables, digest, note = _tables_to_ship(job, hardware=hardware, config=config)
        else:
            tables, note = dict(locked.moe_tables or {}), locked.moe_tables_note
            digest = k8s_tables.tables_from_files(tables).digest if tables else ""
        revision = _revision(
            locked, generation, config, job, trial_number, result, reason, tables=(digest, note)
        )
        Endpoint.objects.filter(pk=endpoint.pk).update(
            config=config, moe_tables=tables, moe_tables_note=note, **({"job": job} if job else {})
        )
        audit_record(
            actor=actor,
            organization=endpoint.organization,
            action=action,
            target=endpoint,
            data={"job": str(job.id) if job else None, "trial": trial_number, "generation": generation},
        )
        endpoint_id = str(endpoint.pk)
        if _route(locked):
            # Served on a pool's host: its agent writes the new configuration there.
            _enqueue("endpoint_apply", locked, action=f"generation-{generation}")
        else:
            transaction.on_commit(lambda: endpoint_config_sync(endpoint_id=endpoint_id))
    return revision


# --- the runner --------------------------------------------------------------------------------

_KEY_PURPOSE = "endpoint-api-key"


def runner_kind_for(pool: Pool | None) -> str:
    return pool.runner if pool is not None else "local"


def public_base_url(*, pool: Pool | None, port: int | None, endpoint_id: str) -> str:
    """Where clients reach the endpoint: the pool's configured public address (a host's address
    or an ingress; TLS at the proxy), or this deployment's ENDPOINT_URL_TEMPLATE without a pool.
    '' while an address with `{port}` waits for the host to report its port."""
    template = pool.endpoint_url_template if pool is not None else settings.ENDPOINT_URL_TEMPLATE
    if port is None and "{port}" in template:
        return ""
    return template.format(port=port, endpoint=object_name(endpoint_id)).rstrip("/")


def runner_for(endpoint: Endpoint) -> EndpointRunner:
    """The runner that serves this endpoint (the pool's kind; the local supervisor without a pool)."""
    pool = endpoint.pool
    if endpoint.runner_kind == "kubernetes" and pool is not None:
        return KubernetesRunner(
            ClusterTarget(
                namespace=pool.k8s_namespace,
                hardware=pool.accelerator,
                region=pool.k8s_region,
                allowed_regions=frozenset(allowed_regions(organization=endpoint.organization)),
                kubeconfig=pool.k8s_kubeconfig or None,
                edge_image=settings.EDGE_PROXY_IMAGE or None,
            )
        )
    return LocalSupervisorRunner(Path(settings.ENDPOINTS_DIR), cwd=Path(settings.BASE_DIR))


def _handle(endpoint: Endpoint, runner: EndpointRunner) -> RunnerHandle | None:
    if endpoint.runner_handle:
        return RunnerHandle.from_dict(endpoint.runner_handle)
    if isinstance(runner, LocalSupervisorRunner):
        # Not started here yet, or recorded before handles were: its folder is known.
        return runner.handle_for(str(endpoint.id))
    return None


def _route(endpoint: Endpoint, *, start: bool = False) -> dict[str, str]:
    """Where the endpoint's operations run (Celery routing on these arguments, see
    portal.pools.routing): on the host that started it; its start on any host of its pool. A
    Kubernetes endpoint's, and one without a pool, run on this deployment's own workers."""
    if endpoint.runner_kind != "local" or endpoint.pool_id is None:
        return {}
    if start or endpoint.host_id is None:
        return {"pool": endpoint.pool.name}  # type: ignore[union-attr]
    return {"host": str(endpoint.host_id)}


def _enqueue(task_name: str, endpoint: Endpoint, *, action: str, start: bool = False) -> None:
    """Records an operation of the endpoint (`start`, `stop`, `apply`) in the task outbox, inside
    the caller's transaction, routed where the endpoint runs (`_route`). It goes to the broker
    after the commit, or from the outbox's beat if the broker is down then; `action` names this
    one operation (the audit event that decided it, the generation applied), so the same
    operation recorded twice is sent once."""
    route = _route(endpoint, start=start)
    endpoint_id = str(endpoint.id)
    outbox_enqueue(
        task=f"portal.endpoints.tasks.{task_name}",
        kwargs={"endpoint_id": endpoint_id, **route},
        key=f"{task_name}:{endpoint_id}:{action}",
    )
    pool = endpoint.pool
    if start and pool is not None and route:
        transaction.on_commit(lambda: _note_pool_waiting(endpoint_id, pool))


def _note_pool_waiting(endpoint_id: str, pool: Pool) -> None:
    waiting = pool_waiting_reason(pool=pool)
    if waiting:
        # Never silent: the start waits in the pool's queue, and the endpoint says so.
        Endpoint.objects.filter(id=endpoint_id, status=Endpoint.Status.STARTING).update(status_detail=waiting)


def _send_watch(endpoint: Endpoint) -> None:
    # Straight to the broker, not through the outbox: the beat sends a watch every round, so a
    # round lost to a broker outage is replaced by the next.
    from portal.endpoints import tasks

    tasks.endpoint_watch.apply_async(kwargs={"endpoint_id": str(endpoint.id), **_route(endpoint)})


def endpoint_start(*, endpoint_id: str) -> str:
    """Start the endpoint through its runner, on the machine running this (a pool's agent, or
    this deployment's worker without a pool). Idempotent: a running supervisor is kept."""
    endpoint = Endpoint.objects.select_related("served_model", "pool", "organization").get(id=endpoint_id)
    if endpoint.status in {Endpoint.Status.STOPPED, Endpoint.Status.STOPPING}:
        return "stopped"
    if not endpoint.api_key_sealed:
        Endpoint.objects.filter(id=endpoint_id).update(
            status=Endpoint.Status.FAILED, status_detail="the endpoint's key is gone; deploy it again"
        )
        return "failed"
    runner = runner_for(endpoint)
    here = host_here() if endpoint.pool_id else None
    launch = EndpointLaunch(
        endpoint_id=str(endpoint.id),
        model=endpoint.served_model.path,
        config=dict(endpoint.config),
        # The port is this host's choice (the runner picks a free one here and reports it); one
        # it reported before is kept only where it was picked, so a restart keeps its address.
        port=endpoint.port if endpoint.port and endpoint.host_id == (here.id if here else None) else None,
        bind_address=endpoint.pool.bind_address if endpoint.pool else "127.0.0.1",
        api_key=unseal(bytes(endpoint.api_key_sealed), purpose=_KEY_PURPOSE).decode(),
        # Not the address of another endpoint that ran here: its clients may still call it.
        avoid_ports=tuple(
            port
            for port in Endpoint.objects.filter(host=here, port__isnull=False)
            .exclude(id=endpoint.id)
            .values_list("port", flat=True)
            if port is not None  # always: the query excludes null ports
        ),
        # Where the SLA ingest is on, a measuring proxy in front of the engine posts every
        # request's TTFT and status to it (issue 23).
        edge_ingest_url=(
            settings.SLA_EDGE_INGEST_BASE_URL + reverse("sla:edge_ingest")
            if settings.SLA_EDGE_INGEST_TOKEN
            else None
        ),
        edge_ingest_token=settings.SLA_EDGE_INGEST_TOKEN,
        moe_tables=dict(endpoint.moe_tables or {}),
    )
    if here is not None:
        # One host serves it: a start delivered twice (a redelivery after a crash) to another
        # host of the pool finds it claimed and does nothing.
        claimed = (
            Endpoint.objects.filter(id=endpoint_id)
            .filter(Q(host__isnull=True) | Q(host=here))
            .update(host=here, status_detail="")
        )
        if not claimed:
            return "started on another host"
    try:
        if isinstance(runner, LocalSupervisorRunner):
            existing = _handle(endpoint, runner)
            if existing is not None and existing.data.get("hostname") not in {None, socket.gethostname()}:
                existing = None  # another machine's supervisor: its pid means nothing here
            if existing is not None and runner.supervisor_alive(existing):
                return "running"
            handle = runner.start(launch, existing=existing)
        else:
            handle = runner.start(launch)
    except RunnerError as exc:
        Endpoint.objects.filter(id=endpoint_id).update(
            status=Endpoint.Status.FAILED, status_detail=str(exc)[-2000:]
        )
        return "failed"
    port = handle.data.get("port")
    reported = (
        {
            "port": int(port),
            "base_url": public_base_url(pool=endpoint.pool, port=int(port), endpoint_id=endpoint_id),
        }
        if isinstance(port, int)
        else {}
    )
    Endpoint.objects.filter(id=endpoint_id).update(
        runner_handle=handle.to_dict(),
        host=here,
        status=Endpoint.Status.STARTING,
        status_detail="",
        **reported,
    )
    return "started"


def endpoint_config_sync(*, endpoint_id: str) -> bool:
    """Make what the runner serves follow what the database says the endpoint serves. Returns
    whether it had to hand over a new configuration (the runner then switches engines)."""
    endpoint = Endpoint.objects.filter(id=endpoint_id).select_related("pool", "organization").first()
    if endpoint is None or not endpoint.is_active:
        return False
    runner = runner_for(endpoint)
    handle = _handle(endpoint, runner)
    if handle is None:
        return False
    try:
        changed = runner.apply_config(
            handle, dict(endpoint.config), moe_tables=dict(endpoint.moe_tables or {})
        )
    except (RunnerError, OSError) as exc:
        # The next watch round tries again; one endpoint's failure must not stop the watch.
        logger.warning("endpoint %s: configuration not handed over (%s)", endpoint_id, exc)
        return False
    if changed:
        logger.info("endpoint %s: the runner's configuration brought in line with the database", endpoint_id)
    return changed


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    return process_alive(pid)


def _supervisor_alive(endpoint: Endpoint) -> bool:
    """Whether the endpoint's recorded local supervisor is still running here (never a process
    that merely reuses its pid: see serving.runner.supervisor)."""
    runner = runner_for(endpoint)
    handle = _handle(endpoint, runner)
    return (
        isinstance(runner, LocalSupervisorRunner) and handle is not None and runner.supervisor_alive(handle)
    )


def read_state(endpoint: Endpoint) -> dict[str, object]:
    """The runner's own report: read live where it runs on this machine, else the last one an
    agent stored."""
    runner = runner_for(endpoint)
    handle = _handle(endpoint, runner)
    here = handle is not None and handle.data.get("hostname") in {None, socket.gethostname()}
    if isinstance(runner, LocalSupervisorRunner) and handle is not None and here:
        live = runner.read_state_file(handle)
        if live:
            return live
    stored = endpoint.runner_state
    return dict(stored) if isinstance(stored, dict) else {}


def _revision(
    endpoint: Endpoint,
    generation: int,
    config: dict[str, object],
    job: TuningJob | None,
    number: int | None,
    result: dict[str, object],
    reason: str,
    *,
    tables: tuple[str, str] = ("", ""),  # (digest, note), as _tables_to_ship gives them
) -> EndpointRevision:
    return EndpointRevision.objects.create(
        organization_id=endpoint.organization_id,
        endpoint=endpoint,
        generation=generation,
        config=config,
        job=job,
        trial_number=number,
        reason=reason,
        measured_ttft_p50_ms=result.get("ttft_p50_ms"),  # type: ignore[misc]  # JSON values typed object
        measured_ttft_p95_ms=result.get("ttft_p95_ms"),
        measured_tokens_per_s=_tokens_per_s(result),
        moe_tables_digest=tables[0],
        moe_tables_note=tables[1],
    )


def _tokens_per_s(result: dict[str, object]) -> float | None:
    load = cast("Iterable[object]", result.get("load") or [])  # the engine's JSON list of load points
    at_target = [p["tokens_per_s"] for p in load if isinstance(p, dict) and p.get("rate_multiple") == 1.0]
    return float(sum(at_target) / len(at_target)) if at_target else None


def endpoint_refresh(*, endpoint_id: str, timeout_s: float = 5.0) -> MetricSnapshot | None:
    """Update the status from the runner's state and store one metrics snapshot.

    A snapshot measures the interval since the previous one, so a measured interval never
    spans a gap: a gap drops the stored baseline, the next answer from the engine is a new
    baseline (itself a gap: nothing is known about the time before it), and so is the first
    answer from a restarted engine (its counters start again from zero).
    """
    endpoint = Endpoint.objects.select_related("pool", "organization").get(id=endpoint_id)
    if not endpoint.is_active:
        return None
    endpoint_config_sync(endpoint_id=endpoint_id)
    runner = runner_for(endpoint)
    handle = _handle(endpoint, runner)
    now = timezone.now()

    def gap(reason: str) -> MetricSnapshot:
        with transaction.atomic():
            Endpoint.objects.filter(id=endpoint_id).update(last_metrics_text="", last_metrics_at=None)
            return MetricSnapshot.objects.create(
                organization_id=endpoint.organization_id,
                endpoint=endpoint,
                taken_at=now,
                gap=True,
                gap_reason=reason[:300],
            )

    if handle is None:
        return gap(f"endpoint {endpoint.status}: not started by its runner yet")
    try:
        state = runner.state(handle)
    except RunnerError as exc:
        state = RunnerState(status="degraded", detail=str(exc))
    status = state.status if state.status in Endpoint.Status.values else Endpoint.Status.DEGRADED
    if status == "starting" and not state.raw and endpoint.status != Endpoint.Status.STARTING:
        status = endpoint.status  # nothing reported yet: keep what was known
    # Only while it is active: a stop that began meanwhile is not undone by this round.
    Endpoint.objects.filter(id=endpoint_id, status__in=Endpoint.ACTIVE).update(
        status=status,
        status_detail=state.detail[-2000:],
        runner_state=state.raw or {"status": state.status, "last_error": state.detail},
    )
    if status != Endpoint.Status.HEALTHY:
        cause = state.detail.split("\n", 1)[0]
        return gap(f"endpoint {status}" + (f": {cause}" if cause else ""))
    previous = (
        MetricsReading(text=endpoint.last_metrics_text, taken_at_s=endpoint.last_metrics_at.timestamp())
        if endpoint.last_metrics_text and endpoint.last_metrics_at
        else None
    )
    try:
        window = runner.metrics_window(handle, previous, timeout_s=timeout_s)
    except RunnerError as exc:
        # Garbage or silence is a gap, never zeros.
        return gap(str(exc))
    values: dict[str, float | None] = {}
    live: dict[str, object] | None = None
    delta = window.delta
    if delta is not None:
        values = {
            "ttft_p50_ms": delta.ttft_p50_ms,
            "ttft_p95_ms": delta.ttft_p95_ms,
            "requests_per_s": delta.requests_finished_per_s,
            "prompt_tokens_per_s": delta.prompt_tokens_per_s,
            "generation_tokens_per_s": delta.generation_tokens_per_s,
            "prefix_cache_hit_rate": delta.prefix_cache_hit_rate,
        }
        p95 = delta.ttft_p95_ms
        live = LiveWindow(
            interval_s=delta.interval_s,
            num_requests=delta.requests_finished,
            prompt_tokens=delta.prompt_tokens,
            output_tokens=delta.output_tokens,
            prefix_queries_tokens=delta.prefix_cache_queries_tokens,
            prefix_hits_tokens=delta.prefix_cache_hits_tokens,
            ttft_p95_ms=p95 if p95 == p95 else None,
        ).to_dict()
    clean = {k: (None if v is None or v != v else float(v)) for k, v in values.items()}
    with transaction.atomic():
        Endpoint.objects.filter(id=endpoint_id).update(
            last_metrics_text=window.reading.text,
            last_metrics_at=datetime.fromtimestamp(window.reading.taken_at_s, tz=UTC),
        )
        return MetricSnapshot.objects.create(
            organization_id=endpoint.organization_id,
            endpoint=endpoint,
            taken_at=now,
            gap=not values,
            gap_reason="" if values else window.reason,
            window=live,
            **clean,
        )


def endpoint_stop(*, actor: User, endpoint: Endpoint) -> None:
    """Revoke the key at once and stop the endpoint in the background, where it runs (the
    runner stops the router and engine; the endpoint shows 'stopping' until it has)."""
    require_role(actor=actor, organization=endpoint.organization, minimum=Role.MEMBER, doing="stop endpoints")
    if endpoint.status in {Endpoint.Status.STOPPED, Endpoint.Status.STOPPING}:
        raise ValidationError("This endpoint is already stopped.")
    with transaction.atomic():
        Endpoint.objects.filter(id=endpoint.id).update(
            status=Endpoint.Status.STOPPING, api_key_hash="", api_key_sealed=None, status_detail=""
        )
        event = audit_record(
            actor=actor, organization=endpoint.organization, action="endpoint.stop", target=endpoint
        )
        stopping = Endpoint.objects.select_related("pool").get(id=endpoint.id)
        _enqueue("endpoint_stop", stopping, action=str(event.id))


def endpoint_stop_run(*, endpoint_id: str, timeout_s: float = 60.0) -> str:
    """The background half of `endpoint_stop`, where the endpoint runs."""
    endpoint = Endpoint.objects.select_related("pool", "organization").get(id=endpoint_id)
    if endpoint.status == Endpoint.Status.STOPPED:
        return "stopped"
    runner = runner_for(endpoint)
    handle = _handle(endpoint, runner)
    if handle is not None:
        try:
            runner.stop(handle, timeout_s=timeout_s)
        except RunnerError as exc:
            Endpoint.objects.filter(id=endpoint_id).update(status_detail=f"stopping failed: {exc}"[-2000:])
            return "failed"
    Endpoint.objects.filter(id=endpoint_id).update(
        status=Endpoint.Status.STOPPED,
        stopped_at=timezone.now(),
        status_detail="",
        runner_state={"status": "stopped"},
    )
    return "stopped"


def endpoint_watch_one(*, endpoint_id: str) -> None:
    """One endpoint's watch round: its scrape, then its continual loop."""
    from portal.endpoints.loop import loop_tick

    endpoint_refresh(endpoint_id=endpoint_id)
    try:
        loop_tick(endpoint_id=endpoint_id)
    except Exception:  # one endpoint's loop must not stop the others being watched
        logger.exception("continual loop tick failed for endpoint %s", endpoint_id)


def endpoints_watch() -> int:
    """Beat task body: every active endpoint's watch round. An endpoint on a pool's host is
    watched by that host's agent (a task on the host's queue: its runner's state and metrics
    are there); the others here. Returns how many were watched or sent."""
    count = 0
    active = Endpoint.objects.filter(status__in=Endpoint.ACTIVE).select_related("pool")
    for endpoint in active:
        route = _route(endpoint)
        if "pool" in route:
            # Not taken by a host of its pool yet: nothing runs to watch, and the pool's
            # measuring queue gets no scrape; the endpoint says what it waits for.
            waiting = pool_waiting_reason(pool=endpoint.pool)  # type: ignore[arg-type]
            if waiting:
                Endpoint.objects.filter(id=endpoint.id, host__isnull=True).update(status_detail=waiting)
            continue
        if route:
            _send_watch(endpoint)
        else:
            endpoint_watch_one(endpoint_id=str(endpoint.id))
        count += 1
    # Snapshot retention is the compliance app's (per organization, after SLA windows close).
    return count


def endpoint_start_again(*, actor: User, endpoint: Endpoint) -> tuple[Endpoint, str | None]:
    """Start a stopped (or failed) endpoint again with the configuration it served last.

    Without a pool it keeps its address; a pool's endpoint goes to whichever host of the pool
    takes the start (the one that served it may be gone), which reports its address. Stopping
    revoked its key, so a stopped endpoint gets a new one (returned, shown once); a failed one
    keeps the key it has, if any (None returned). Residency is checked again: a policy changed
    since the deploy is honoured. Two requests at once start it once: the state change is a
    conditional update, and the loser is told it is already running."""
    require_role(
        actor=actor, organization=endpoint.organization, minimum=Role.MEMBER, doing="start endpoints"
    )
    restartable = {Endpoint.Status.STOPPED, Endpoint.Status.FAILED}
    if endpoint.status not in restartable:
        raise ValidationError("Only a stopped or failed endpoint can be started again.")
    if endpoint.pool is not None:
        pool_require_usable(
            organization=endpoint.organization, name=endpoint.pool.name, doing="this endpoint"
        )
    else:
        hardware = endpoint.job.hardware if endpoint.job else "local-cpu"
        residency_require_hardware(
            organization=endpoint.organization, hardware=hardware, doing="this endpoint"
        )
    api_key: str | None = None
    values: dict[str, object] = {
        "status": Endpoint.Status.STARTING,
        "status_detail": "",
        "stopped_at": None,
        "runner_state": None,
        # Any host of its pool may take the start (the one that served it may be gone).
        "host": None,
    }
    if not endpoint.api_key_sealed:
        prefix, secret = secrets.token_hex(4), secrets.token_urlsafe(32)
        api_key = f"{ENDPOINT_KEY_PREFIX}{prefix}_{secret}"
        values |= {
            "api_key_prefix": prefix,
            "api_key_hash": tokens.digest(api_key),
            "api_key_sealed": seal(api_key.encode(), purpose=_KEY_PURPOSE),
        }
    with transaction.atomic():
        claimed = Endpoint.objects.filter(id=endpoint.id, status__in=restartable).update(**values)
        if not claimed:
            raise ValidationError("This endpoint is already starting or running.")
        event = audit_record(
            actor=actor,
            organization=endpoint.organization,
            action="endpoint.start_again",
            target=endpoint,
            data={"new_key": api_key is not None},
        )
        starting = Endpoint.objects.select_related("pool", "organization", "served_model", "job").get(
            id=endpoint.id
        )
        _enqueue("endpoint_start", starting, action=str(event.id), start=True)
    return starting, api_key


IDEMPOTENCY_KEY_MAX = 255


def endpoint_deploy_keyed(
    *, actor: User, job: TuningJob, idempotency_key: str, name: str = "", pool: str | None = None
) -> tuple[Endpoint, str | None]:
    """`endpoint_deploy` at most once per client-chosen key (the API's `Idempotency-Key`): the
    same key for the same job again returns the endpoint it made and no key, like the deploy
    form's token (`endpoint_deploy_once`). The stored token is a digest of the organization, the
    job and the key, so two tenants' keys never meet and a key reused for another job deploys
    that job."""
    if not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_MAX:
        raise ValidationError(
            {"idempotency_key": f"Send an Idempotency-Key of 1 to {IDEMPOTENCY_KEY_MAX} characters."}
        )
    require_role(actor=actor, organization=job.organization, minimum=Role.MEMBER, doing="deploy endpoints")
    token = tokens.digest(f"{job.organization_id}:{job.id}:{idempotency_key}")
    existing = Endpoint.objects.filter(organization=job.organization, deploy_token=token).first()
    if existing is not None:
        return existing, None
    try:
        with transaction.atomic():
            return endpoint_deploy(actor=actor, job=job, name=name, deploy_token=token, pool=pool)
    except IntegrityError:
        # The same request, sent at the same moment, won the unique token: that one is the endpoint.
        existing = Endpoint.objects.filter(organization=job.organization, deploy_token=token).first()
        if existing is None:
            raise
        return existing, None


# --- Retention and organization deletion (registered with compliance.holders) ------------------


def endpoints_retention_expire(organization: Organization, cutoffs: RetentionCutoffs) -> dict[str, int]:
    """Metric snapshots past the organization's metric retention (SLA windows that need them
    were frozen first: compliance closes them before any holder expires)."""
    deleted, _ = MetricSnapshot.objects.filter(
        organization=organization, taken_at__lt=cutoffs.metrics
    ).delete()
    return {"metric_snapshots": deleted}


def endpoints_refuse_deletion(organization: Organization) -> str:
    active = Endpoint.objects.filter(organization=organization, status__in=Endpoint.ACTIVE).count()
    return f"Stop the organization's {active} running endpoint(s) first." if active else ""


def endpoints_files_remove(organization: Organization) -> None:
    for endpoint_id in Endpoint.objects.filter(organization=organization).values_list("id", flat=True):
        shutil.rmtree(Path(settings.ENDPOINTS_DIR) / str(endpoint_id), ignore_errors=True)


def endpoints_rows_delete(organization: Organization) -> None:
    # Before the jobs: an endpoint's job is protected from deletion while the endpoint exists.
    Endpoint.objects.filter(organization=organization).delete()


ENDPOINTS_HOLDER = DataHolder(
    name="endpoints",
    order=10,
    counts=("metric_snapshots",),
    expire=endpoints_retention_expire,
    refuse_deletion=endpoints_refuse_deletion,
    remove_files=endpoints_files_remove,
    delete_rows=endpoints_rows_delete,
)
