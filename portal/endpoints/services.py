"""Writes of the endpoints app: deploy a job's winner, watch it, stop it.

The endpoint runs as its own supervisor process on the serving host (`tailguard endpoint
serve`), detached from the Celery worker that started it: the router keeps the address, the
supervisor restarts crashed engines and re-deploys without failing requests when its config
file changes. The portal talks to it through files (config in, state out) and the engine's
metrics.

The database holds the configuration the endpoint should serve; `config.json` follows it. A
switch writes the file once its transaction commits, and every watch round writes it again if
it differs, so a worker killed between the commit and the write (or a write that failed) delays
the hand-over by one round instead of losing it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from compliance.services import audit_record, residency_require_hardware
from portal.accounts import tokens
from portal.accounts.models import Role, User
from portal.accounts.services import require_role
from portal.endpoints.models import Endpoint, EndpointRevision, MetricSnapshot
from portal.jobs.models import TuningJob
from portal.pools.models import Pool
from portal.pools.services import pool_require_usable
from serving.engine.launcher import free_port
from serving.metrics import MetricsFormatError, snapshot_delta, snapshot_from_text
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
    pool_name = pool or (job.pool.name if job.pool_id else None)
    chosen: Pool | None = None
    if pool_name:
        chosen = pool_require_usable(organization=job.organization, name=pool_name, doing="this endpoint")
        if chosen.accelerator != (job.spec or {}).get("hardware"):
            raise ValidationError(
                {
                    "pool": f"Pool {chosen.name} is {chosen.accelerator}; the job tuned for "
                    f"{(job.spec or {}).get('hardware')}: deploy on a pool of the same hardware."
                }
            )
    else:
        residency_require_hardware(
            organization=job.organization,
            hardware=str((job.spec or {}).get("hardware", "local-cpu")),
            doing="this endpoint",
        )
    number, result = _winner(job)
    config = dict(result["config"])  # type: ignore[call-overload]
    prefix, secret = secrets.token_hex(4), secrets.token_urlsafe(32)
    api_key = f"{ENDPOINT_KEY_PREFIX}{prefix}_{secret}"
    used = set(Endpoint.objects.values_list("port", flat=True))
    port = next(p for p in (free_port() for _ in range(20)) if p not in used)
    with transaction.atomic():
        endpoint = Endpoint.objects.create(
            organization=job.organization,
            name=(name or f"{job.served_model.name} (tuned)")[:120],
            served_model=job.served_model,
            job=job,
            pool=chosen,
            config=config,
            port=port,
            api_key_prefix=prefix,
            api_key_hash=tokens.digest(api_key),
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
        )
        audit_record(
            actor=actor,
            organization=job.organization,
            action="endpoint.deploy",
            target=endpoint,
            data={"job": str(job.id), "trial": number, "port": port},
        )
        _write_files(endpoint, config, api_key)
        from portal.endpoints.tasks import endpoint_start

        endpoint_id = str(endpoint.id)
        transaction.on_commit(lambda: endpoint_start.delay(endpoint_id))
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
    """Record a new generation and hand its config to the supervisor (after the commit).

    The supervisor swaps engines without failing a request; callers check permissions.
    """
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        generation = (
            locked.revisions.order_by("-generation").values_list("generation", flat=True).first() or 0
        ) + 1
        revision = _revision(locked, generation, config, job, trial_number, result, reason)
        Endpoint.objects.filter(pk=endpoint.pk).update(config=config, **({"job": job} if job else {}))
        audit_record(
            actor=actor,
            organization=endpoint.organization,
            action=action,
            target=endpoint,
            data={"job": str(job.id) if job else None, "trial": trial_number, "generation": generation},
        )
        endpoint_id = str(endpoint.pk)
        transaction.on_commit(lambda: endpoint_config_sync(endpoint_id=endpoint_id))
    return revision


def endpoint_config_sync(*, endpoint_id: str) -> bool:
    """Make the supervisor's config file say what the database says the endpoint serves.
    Returns whether it had to write (the supervisor then switches engines)."""
    endpoint = Endpoint.objects.filter(id=endpoint_id).only("id", "config", "status").first()
    if endpoint is None or not endpoint.is_active:
        return False
    folder = endpoint_dir(endpoint)
    if not folder.is_dir():
        return False  # served from another host, or not deployed here yet
    path = folder / "config.json"
    try:
        current = json.loads(path.read_text())
    except (OSError, ValueError):
        current = None
    if current == endpoint.config:
        return False
    try:
        _atomic_write(path, json.dumps(endpoint.config))
    except OSError as exc:
        # The next watch round tries again; one endpoint's folder must not stop the watch.
        logger.warning("endpoint %s: could not write its config file (%s)", endpoint_id, exc)
        return False
    logger.info("endpoint %s: config file brought in line with the database", endpoint_id)
    return True


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _revision(
    endpoint: Endpoint,
    generation: int,
    config: dict[str, object],
    job: TuningJob | None,
    number: int | None,
    result: dict[str, object],
    reason: str,
) -> EndpointRevision:
    return EndpointRevision.objects.create(
        organization_id=endpoint.organization_id,
        endpoint=endpoint,
        generation=generation,
        config=config,
        job=job,
        trial_number=number,
        reason=reason,
        measured_ttft_p50_ms=result.get("ttft_p50_ms"),  # type: ignore[misc]
        measured_ttft_p95_ms=result.get("ttft_p95_ms"),
        measured_tokens_per_s=_tokens_per_s(result),  # type: ignore[misc]
    )


def _tokens_per_s(result: dict[str, object]) -> float | None:
    load = result.get("load") or []
    at_target = [p["tokens_per_s"] for p in load if isinstance(p, dict) and p.get("rate_multiple") == 1.0]  # type: ignore[union-attr]
    return float(sum(at_target) / len(at_target)) if at_target else None


def _write_files(endpoint: Endpoint, config: dict[str, object], api_key: str) -> None:
    folder = endpoint_dir(endpoint)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_file = folder / "api_key"
    key_file.write_text(api_key)
    key_file.chmod(0o600)
    (folder / "config.json").write_text(json.dumps(config))


def endpoint_start(*, endpoint_id: str) -> str:
    """Start the endpoint's supervisor process (idempotent: a running supervisor is kept)."""
    endpoint = Endpoint.objects.get(id=endpoint_id)
    if endpoint.status == Endpoint.Status.STOPPED:
        return "stopped"
    if _supervisor_alive(endpoint):
        return "running"
    folder = endpoint_dir(endpoint)
    command = [
        sys.executable,
        "-m",
        "tuning.cli",
        "endpoint",
        "serve",
        "--model",
        endpoint.served_model.path,
        "--config",
        str(folder / "config.json"),
        "--port",
        str(endpoint.port),
        "--work-dir",
        str(folder / "logs"),
        "--state-file",
        str(folder / "state.json"),
        "--api-key-file",
        str(folder / "api_key"),
    ]
    with (folder / "supervisor.log").open("ab") as log:
        # A new session: the endpoint outlives the worker that started it.
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(Path(settings.BASE_DIR)),
        )
    Endpoint.objects.filter(id=endpoint_id).update(
        supervisor_pid=process.pid, status=Endpoint.Status.STARTING
    )
    return "started"


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


def _supervisor_alive(endpoint: Endpoint) -> bool:
    """Whether the process recorded as the endpoint's supervisor is still that supervisor.

    The stored pid outlives the process it named (a crash, a reboot), and the kernel hands pids
    out again (32768 of them on a default Linux): by then the number may belong to anything, a
    database session included. Only a live process whose command line is this endpoint's
    `endpoint serve` (its own state file) counts; anything else is never signalled.
    """
    pid = endpoint.supervisor_pid
    if not pid or not _alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    state_file = str(endpoint_dir(endpoint) / "state.json").encode()
    return b"serve" in argv and state_file in argv


def read_state(endpoint: Endpoint) -> dict[str, object]:
    path = endpoint_dir(endpoint) / "state.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# The supervisor's states and what the endpoint shows for them. While its engine is down and
# being restarted the endpoint is not serving: degraded, with the cause in `status_detail`.
_STATUS_FROM_SUPERVISOR = {
    "starting": Endpoint.Status.STARTING,
    "healthy": Endpoint.Status.HEALTHY,
    "restarting": Endpoint.Status.DEGRADED,
    "degraded": Endpoint.Status.DEGRADED,
    "failed": Endpoint.Status.FAILED,
    "stopped": Endpoint.Status.STOPPED,
}


def _counters_went_back(earlier: Any, later: Any) -> bool:
    """Whether `later` comes from another engine than `earlier` (its totals started again)."""
    pairs = [
        (earlier.requests_finished_total, later.requests_finished_total),
        (earlier.prompt_tokens_total, later.prompt_tokens_total),
        (earlier.generation_tokens_total, later.generation_tokens_total),
        (earlier.ttft_s.count, later.ttft_s.count),
    ]
    return any(b < a for a, b in pairs)


def endpoint_refresh(*, endpoint_id: str, timeout_s: float = 5.0) -> MetricSnapshot | None:
    """Update the status from the supervisor's state and store one metrics snapshot.

    A snapshot measures the interval since the previous one, so a measured interval never
    spans a gap: a gap drops the stored baseline, the next answer from the engine is a new
    baseline (itself a gap: nothing is known about the time before it), and so is the first
    answer from a restarted engine (its counters start again from zero).
    """
    import httpx

    endpoint = Endpoint.objects.get(id=endpoint_id)
    if not endpoint.is_active:
        return None
    endpoint_config_sync(endpoint_id=endpoint_id)
    state = read_state(endpoint)
    reported = str(state.get("status") or endpoint.status)
    status = _STATUS_FROM_SUPERVISOR.get(reported, reported)
    detail = str(state.get("last_error") or "")
    if endpoint.supervisor_pid and not _supervisor_alive(endpoint) and status != "failed":
        status = Endpoint.Status.DEGRADED
        detail = "the endpoint's supervisor process is not running"
    if status not in Endpoint.Status.values:
        status = Endpoint.Status.DEGRADED
    Endpoint.objects.filter(id=endpoint_id).update(status=status, status_detail=detail[-2000:])
    engine_url = state.get("engine_url")
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

    if status != Endpoint.Status.HEALTHY:
        cause = detail.split("\n", 1)[0]
        return gap(f"endpoint {status}" + (f": {cause}" if cause else ""))
    if not engine_url:
        return gap("the supervisor has not reported an engine address")
    try:
        response = httpx.get(f"{engine_url}/metrics", timeout=timeout_s)
        response.raise_for_status()
        text = response.text
        current = snapshot_from_text(text, taken_at_s=time.time())
    except (httpx.HTTPError, MetricsFormatError) as exc:
        # Garbage or silence is a gap, never zeros.
        return gap(f"metrics unavailable: {type(exc).__name__}")
    values: dict[str, float | None] = {}
    window: dict[str, object] | None = None
    reason = "no earlier scrape to measure from (the first, or the first after a gap)"
    if endpoint.last_metrics_text and endpoint.last_metrics_at:
        try:
            previous = snapshot_from_text(
                endpoint.last_metrics_text, taken_at_s=endpoint.last_metrics_at.timestamp()
            )
            if _counters_went_back(previous, current):
                reason = "the engine restarted since the last scrape (its counters started again)"
            else:
                delta = snapshot_delta(previous, current)
                values = {
                    "ttft_p50_ms": delta.ttft_p50_ms,
                    "ttft_p95_ms": delta.ttft_p95_ms,
                    "requests_per_s": delta.requests_finished_per_s,
                    "prompt_tokens_per_s": delta.prompt_tokens_per_s,
                    "generation_tokens_per_s": delta.generation_tokens_per_s,
                    "prefix_cache_hit_rate": delta.prefix_cache_hit_rate,
                }
                p95 = delta.ttft_p95_ms
                window = LiveWindow(
                    interval_s=delta.interval_s,
                    num_requests=delta.requests_finished,
                    prompt_tokens=delta.prompt_tokens,
                    output_tokens=delta.output_tokens,
                    prefix_queries_tokens=delta.prefix_cache_queries_tokens,
                    prefix_hits_tokens=delta.prefix_cache_hits_tokens,
                    ttft_p95_ms=p95 if p95 == p95 else None,
                ).to_dict()
        except (MetricsFormatError, ValueError):
            values, window = {}, None
            reason = "the previous scrape could not be compared with this one"
    clean = {k: (None if v is None or v != v else float(v)) for k, v in values.items()}
    with transaction.atomic():
        Endpoint.objects.filter(id=endpoint_id).update(
            last_metrics_text=text, last_metrics_at=datetime.fromtimestamp(current.taken_at_s, tz=UTC)
        )
        return MetricSnapshot.objects.create(
            organization_id=endpoint.organization_id,
            endpoint=endpoint,
            taken_at=now,
            gap=not values,
            gap_reason="" if values else reason,
            window=window,
            **clean,
        )


def endpoint_stop(*, actor: User, endpoint: Endpoint) -> None:
    """Stop the engine and router and revoke the key."""
    require_role(actor=actor, organization=endpoint.organization, minimum=Role.MEMBER, doing="stop endpoints")
    if endpoint.status == Endpoint.Status.STOPPED:
        raise ValidationError("This endpoint is already stopped.")
    if endpoint.supervisor_pid and _supervisor_alive(endpoint):
        os.kill(endpoint.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _supervisor_alive(endpoint) and time.monotonic() < deadline:
            time.sleep(0.2)
    (endpoint_dir(endpoint) / "api_key").unlink(missing_ok=True)
    with transaction.atomic():
        Endpoint.objects.filter(id=endpoint.id).update(
            status=Endpoint.Status.STOPPED, stopped_at=timezone.now(), api_key_hash=""
        )
        audit_record(actor=actor, organization=endpoint.organization, action="endpoint.stop", target=endpoint)


def endpoints_watch() -> int:
    """Beat task body: refresh every active endpoint. Returns how many were scraped."""
    from portal.endpoints.loop import loop_tick

    count = 0
    for endpoint_id in Endpoint.objects.filter(status__in=Endpoint.ACTIVE).values_list("id", flat=True):
        endpoint_refresh(endpoint_id=str(endpoint_id))
        count += 1
        try:
            loop_tick(endpoint_id=str(endpoint_id))
        except Exception:  # one endpoint's loop must not stop the others being watched
            logger.exception("continual loop tick failed for endpoint %s", endpoint_id)
    # Snapshot retention is the compliance app's (per organization, after SLA windows close).
    return count
