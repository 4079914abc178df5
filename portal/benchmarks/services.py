"""Writes of the benchmarks app: create a report, run it, share it, revoke a share.

Running a report: for each load level (`peak_rps x multiplier`), the sample's traffic is
synthesised at that rate once (`tuning.workload.synthesize`, a moving-block bootstrap that keeps
its lengths, burstiness and prefix sharing) and replayed with the load generator against each
target in turn, streaming chat completions. Targets are interleaved per level (A then B at one
level, B then A at the next) so every target meets each level within minutes of the others and
no target's run competes with another's for this host; the prompt text and the send schedule
are byte-identical across targets. Each (level, target) result is stored as soon as it exists,
so a worker killed mid-run resumes at the next missing one.

Failures of a target (refused connections, timeouts, non-streaming answers, HTTP errors) are
part of the result: counted by kind per request, never a missing row, never a crashed task.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import platform
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from compliance.services import audit_record
from compliance.storage import StorageError, seal, unseal
from portal import leases, outbound
from portal.accounts import rls, tokens
from portal.accounts.models import User
from portal.benchmarks import measure
from portal.benchmarks.models import BenchmarkReport, BenchmarkShareLink, BenchmarkTarget
from portal.benchmarks.selectors import user_is_benchmark_staff
from portal.outbox.models import OutboxMessage
from portal.outbox.selectors import outbox_lost
from portal.outbox.services import outbox_enqueue
from portal.traffic.models import TrafficSample
from portal.traffic.services import workload_path
from tuning.search.job import MAX_TOKENS as TUNING_MAX_TOKENS

logger = logging.getLogger(__name__)

MAX_TARGETS = 4
MAX_LEVELS = 8
MAX_MULTIPLIER = 10.0
# The most tokens a report may cap a request's prompt or output at: the tuning job's own bound
# (above it no engine's context holds the request, and the database column would overflow).
MAX_TOKENS_CAP = TUNING_MAX_TOKENS
SHARE_DAYS_MIN, SHARE_DAYS_MAX = 1, 30
SEED = 0
# How often a running report says its worker is alive (its lease is `BenchmarkReport.lease_s`).
_HEARTBEAT_S = 10.0
_KEY_PURPOSE = "benchmark-target-api-key"
# Written into a tokenizer folder this app built, so reports can say the tokenizer is a stand-in.
STAND_IN_MARKER = "tailguard-stand-in.txt"


def require_benchmark_staff(actor: Any, doing: str) -> None:
    if not user_is_benchmark_staff(actor):
        raise PermissionDenied(f"Only sales engineers and platform admins can {doing}.")


# --- Input -----------------------------------------------------------------------------------


def parse_load_plan(text: str) -> list[float]:
    """'0.5, 1, 1.25' -> [0.5, 1.0, 1.25]; ValidationError naming `load_multipliers` otherwise."""
    items = [
        item.strip().removesuffix("x").removesuffix("\u00d7").strip() for item in (text or "").split(",")
    ]
    values: list[float] = []
    for item in items:
        if not item:
            continue
        try:
            values.append(float(item))
        except ValueError:
            raise ValidationError({"load_multipliers": f"{item!r} is not a number."}) from None
    return check_load_plan(values)


def check_load_plan(values: Sequence[float]) -> list[float]:
    """The multipliers sorted, or ValidationError naming `load_multipliers`."""
    if not values:
        raise ValidationError(
            {"load_multipliers": "Enter at least one multiplier of the peak rate, e.g. 0.5, 1, 1.25."}
        )
    for value in values:
        if not math.isfinite(value) or not 0 < value <= MAX_MULTIPLIER:
            raise ValidationError(
                {
                    "load_multipliers": f"{value:g} is out of range: use multipliers above 0 "
                    f"and at most {MAX_MULTIPLIER:g}."
                }
            )
    if len(set(values)) != len(values):
        raise ValidationError({"load_multipliers": "Each multiplier may appear once."})
    if len(values) > MAX_LEVELS:
        raise ValidationError({"load_multipliers": f"Use at most {MAX_LEVELS} load levels."})
    return sorted(float(v) for v in values)


@dataclass(frozen=True)
class TargetSpec:
    """One endpoint to measure, as the engineer entered it."""

    name: str
    base_url: str
    model: str
    api_key: str = ""
    pricing: str = BenchmarkTarget.Pricing.HOURLY
    price_per_hour_usd: Decimal | None = None
    price_input_per_mtok_usd: Decimal | None = None
    price_output_per_mtok_usd: Decimal | None = None
    send_ignore_eos: bool = False

    def __repr__(self) -> str:  # never the key
        return f"TargetSpec(name={self.name!r}, base_url={self.base_url!r}, model={self.model!r})"


def base_url_problem(url: str) -> str | None:
    """Why `url` is not an endpoint address the load generator can use, or None."""
    url = (url or "").strip()
    if not url:
        return "Enter the endpoint's base URL, e.g. https://api.example.com/v1."
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "Use an http:// or https:// URL, e.g. https://api.example.com/v1."
    try:
        host, _port = parts.hostname, parts.port
    except ValueError:
        return "The port in this URL is not a number between 0 and 65535."
    if not host:
        return "The URL has no host name."
    if parts.username or parts.password:
        return "Put credentials in the API key field, not in the URL."
    if parts.query or parts.fragment:
        return "Give the base URL only (no ?query or #fragment); /v1/chat/completions is added."
    if parts.path.rstrip("/").endswith(("/chat/completions", "/completions")):
        return "Give the base URL (ending in /v1 or the host), not the completions route."
    return None


def target_address_problem(url: str, *, at_connect: bool) -> str | None:
    """Why the load generator must not send to `url` (an internal address: loopback, private,
    link-local/metadata and the like, unless BENCHMARK_ALLOWED_NETWORKS lists it), or None.
    Checked when the target is entered and again just before each replay (`at_connect`, when a
    name that does not resolve is refused too)."""
    problem = outbound.url_problem(
        url,
        allowed=outbound.parse_networks(settings.BENCHMARK_ALLOWED_NETWORKS),
        require_resolution=at_connect,
    )
    return problem


def target_spec_errors(spec: TargetSpec) -> dict[str, str]:
    """Field name -> problem for one target; empty when it is usable."""
    errors: dict[str, str] = {}
    if not spec.name.strip():
        errors["name"] = "Name this target (e.g. 'Current provider')."
    problem = base_url_problem(spec.base_url)
    if problem is None and (refused := target_address_problem(spec.base_url, at_connect=False)):
        problem = (
            f"Benchmark targets must be public endpoints: {refused}. "
            "(An operator can allow an internal network with BENCHMARK_ALLOWED_NETWORKS.)"
        )
    if problem:
        errors["base_url"] = problem
    if not spec.model.strip():
        errors["model"] = "Enter the model name the endpoint expects."
    if spec.pricing == BenchmarkTarget.Pricing.HOURLY:
        if spec.price_per_hour_usd is None:
            errors["price_per_hour_usd"] = "Enter the dedicated endpoint's price per hour (USD)."
        elif spec.price_per_hour_usd <= 0:
            errors["price_per_hour_usd"] = "The price per hour must be above 0."
    elif spec.pricing == BenchmarkTarget.Pricing.PER_TOKEN:
        for field, what in (
            ("price_input_per_mtok_usd", "input"),
            ("price_output_per_mtok_usd", "output"),
        ):
            value = getattr(spec, field)
            if value is None:
                errors[field] = f"Enter the provider's price per million {what} tokens (USD)."
            elif value < 0:
                errors[field] = "Prices cannot be negative."
        if (
            not errors.keys() & {"price_input_per_mtok_usd", "price_output_per_mtok_usd"}
            and spec.price_input_per_mtok_usd == 0
            and spec.price_output_per_mtok_usd == 0
        ):
            errors["price_input_per_mtok_usd"] = "Both prices are 0: enter what the provider charges."
    else:
        errors["pricing"] = "Choose hourly (dedicated endpoint) or per-token pricing."
    return errors


def _sample_peak_rps(sample: TrafficSample) -> float:
    arrival = (sample.profile or {}).get("arrival") or {}
    value = arrival.get("peak_rps_60s")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


def _sample_summary(sample: TrafficSample) -> dict[str, Any]:
    profile = sample.profile or {}
    return {
        "num_requests": profile.get("num_requests"),
        "duration_s": profile.get("duration_s"),
        "peak_rps_60s": (profile.get("arrival") or {}).get("peak_rps_60s"),
        "mean_rps": (profile.get("arrival") or {}).get("mean_rps"),
        "input_tokens_p50": (profile.get("input_tokens") or {}).get("p50"),
        "output_tokens_p50": (profile.get("output_tokens") or {}).get("p50"),
        "format": profile.get("format") or sample.detected_format,
    }


def benchmark_report_create(
    *,
    actor: User,
    traffic_sample: TrafficSample,
    targets: Sequence[TargetSpec],
    load_multipliers: Sequence[float],
    duration_s: float,
    request_timeout_s: float = 60.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    traffic_source: str = BenchmarkReport.TrafficSource.PROSPECT,
    name: str = "",
) -> BenchmarkReport:
    """A queued report for the sample's organization; its run starts once this commits."""
    require_benchmark_staff(actor, "create benchmark reports")
    errors: dict[str, Any] = {}
    peak = _sample_peak_rps(traffic_sample)
    if traffic_sample.status != TrafficSample.Status.READY:
        errors["traffic_sample"] = "Choose a sample that finished validating."
    elif not peak > 0:
        errors["traffic_sample"] = "This sample has no peak request rate to scale (is it empty?)."
    elif not workload_path(traffic_sample).exists():
        errors["traffic_sample"] = "This sample's replayable workload is missing; upload it again."
    try:
        multipliers = check_load_plan(list(load_multipliers))
    except ValidationError as exc:
        errors.update(exc.message_dict)
        multipliers = []
    if not (isinstance(duration_s, int | float) and math.isfinite(duration_s) and 1 <= duration_s <= 3600):
        errors["duration_s"] = "Use 1 to 3600 seconds per load level."
    if not (
        isinstance(request_timeout_s, int | float)
        and math.isfinite(request_timeout_s)
        and 1 <= request_timeout_s <= 600
    ):
        errors["request_timeout_s"] = "Use a request timeout of 1 to 600 seconds."
    for field, value in (("max_prompt_tokens", max_prompt_tokens), ("max_output_tokens", max_output_tokens)):
        if value is not None and not (isinstance(value, int) and 1 <= value <= MAX_TOKENS_CAP):
            errors[field] = f"Leave it empty (as the trace says) or use 1 to {MAX_TOKENS_CAP:,} tokens."
    if traffic_source not in BenchmarkReport.TrafficSource.values:
        errors["traffic_source"] = f"Choose one of: {', '.join(BenchmarkReport.TrafficSource.values)}."
    if not 1 <= len(targets) <= MAX_TARGETS:
        errors["targets"] = f"Add 1 to {MAX_TARGETS} targets."
    else:
        problems = []
        for index, spec in enumerate(targets, start=1):
            for field, problem in target_spec_errors(spec).items():
                problems.append(f"Target {index} {field}: {problem}")
        names = [spec.name.strip() for spec in targets]
        if len(set(names)) != len(names):
            problems.append("Give each target a different name.")
        if problems:
            errors["targets"] = problems
    if multipliers and peak > 0 and "duration_s" not in errors:
        most = max(multipliers) * peak * duration_s
        if most > settings.BENCHMARK_MAX_REQUESTS_PER_LEVEL:
            errors["duration_s"] = (
                f"The highest level would send {most:,.0f} requests per target "
                f"(limit {settings.BENCHMARK_MAX_REQUESTS_PER_LEVEL:,}); shorten the duration."
            )
    if errors:
        raise ValidationError(errors)

    organization = traffic_sample.organization
    name = (name or "").strip() or f"{traffic_sample.name}: {' vs '.join(s.name.strip() for s in targets)}"
    with transaction.atomic():
        report = BenchmarkReport.objects.create(
            organization=organization,
            name=name[:120],
            traffic_sample=traffic_sample,
            sample_name=traffic_sample.name,
            sample_summary=_sample_summary(traffic_sample),
            traffic_source=traffic_source,
            peak_rps=peak,
            load_multipliers=multipliers,
            duration_s=float(duration_s),
            request_timeout_s=float(request_timeout_s),
            max_prompt_tokens=max_prompt_tokens,
            max_output_tokens=max_output_tokens,
            created_by=actor,
        )
        for position, spec in enumerate(targets):
            target = BenchmarkTarget(
                organization=organization,
                report=report,
                position=position,
                name=spec.name.strip(),
                base_url=spec.base_url.strip().rstrip("/"),
                model=spec.model.strip(),
                pricing=spec.pricing,
                send_ignore_eos=spec.send_ignore_eos,
            )
            if spec.pricing == BenchmarkTarget.Pricing.HOURLY:
                target.price_per_hour_usd = spec.price_per_hour_usd
            else:
                target.price_input_per_mtok_usd = spec.price_input_per_mtok_usd
                target.price_output_per_mtok_usd = spec.price_output_per_mtok_usd
            if spec.api_key.strip():
                target.api_key_sealed = seal(spec.api_key.strip().encode(), purpose=_key_purpose(target))
            target.save()
        audit_record(
            actor=actor,
            organization=organization,
            action="benchmark_report.create",
            target=report,
            data={
                "name": report.name,
                "sample": str(traffic_sample.id),
                "targets": [s.name.strip() for s in targets],
                "load_multipliers": multipliers,
                "duration_s": float(duration_s),
            },
        )
        # Sent after the commit, or by the outbox's beat if the broker is down then.
        _run_enqueue(report, "create")
    return report


def _key_purpose(target: BenchmarkTarget) -> str:
    # Bound to the target: a sealed key copied onto another row does not open.
    return f"{_KEY_PURPOSE}:{target.id}"


def _api_key(target: BenchmarkTarget) -> str | None:
    if not target.api_key_sealed:
        return None
    return unseal(bytes(target.api_key_sealed), purpose=_key_purpose(target)).decode()


# --- Running ---------------------------------------------------------------------------------


def benchmark_tokenizer_dir() -> Path:
    """The tokenizer prompts are built with; a stand-in is built here once when none exists."""
    path = Path(settings.BENCHMARK_TOKENIZER_DIR)
    if (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists():
        return path
    from serving.models.tokenizer import build_tokenizer, save_tokenizer

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=path.parent))
    try:
        tokenizer = build_tokenizer(family="llama", vocab_size=8192, rng=np.random.default_rng(SEED))
        save_tokenizer(tokenizer, family="llama", out_dir=staging, model_max_length=131_072)
        (staging / STAND_IN_MARKER).write_text(
            "A Llama-family byte-level BPE (8192 entries) built locally for synthesising prompts.\n"
        )
        try:
            staging.rename(path)
        except OSError:
            if not (path / "tokenizer.json").exists():  # not a concurrent builder winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _claim(report_id: str, owner: str) -> bool:
    """Takes the report if it is queued, or running with a stale lease (a killed worker)."""
    report = BenchmarkReport.objects.filter(id=report_id).only("duration_s", "request_timeout_s").first()
    if report is None:
        return False
    return leases.take(
        BenchmarkReport.objects.filter(
            id=report_id, status__in=[BenchmarkReport.Status.QUEUED, BenchmarkReport.Status.RUNNING]
        ),
        owner,
        lease_s=report.lease_s,
        status=BenchmarkReport.Status.RUNNING,
        started_at=Coalesce(F("started_at"), Now()),
        attempts=F("attempts") + 1,
    )


class _LeaseLost(Exception):
    """Another worker took the report over (this one's heartbeats stopped reaching the database
    for longer than the lease): its late results are dropped."""


def _conditions(tokenizer: Path) -> dict[str, Any]:
    return {
        "client_host": socket.gethostname(),
        "client_location": settings.BENCHMARK_CLIENT_LOCATION,
        "client_platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "tokenizer": tokenizer.name,
        "stand_in_tokenizer": (tokenizer / STAND_IN_MARKER).exists(),
        "api": "chat/completions, streamed",
        "order": "targets one at a time, interleaved per load level (order alternates between levels)",
        "seed": SEED,
        "started_at": timezone.now().strftime("%Y-%m-%d %H:%M UTC"),
    }


def _update_results(report_id: str, owner: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Applies `change` to the stored results under a row lock, fenced by `owner`'s lease."""
    with transaction.atomic():
        report = BenchmarkReport.objects.select_for_update().filter(id=report_id, lease_owner=owner).first()
        if report is None:
            raise _LeaseLost(report_id)
        results = copy.deepcopy(report.results or {})
        change(results)
        report.results = results
        report.save(update_fields=["results"])


def _price(target: BenchmarkTarget) -> measure.Price:
    def as_float(value: Decimal | None) -> float | None:
        return float(value) if value is not None else None

    return measure.Price(
        pricing=target.pricing,
        per_hour_usd=as_float(target.price_per_hour_usd),
        input_per_mtok_usd=as_float(target.price_input_per_mtok_usd),
        output_per_mtok_usd=as_float(target.price_output_per_mtok_usd),
    )


def _replay_cell(
    report: BenchmarkReport,
    target: BenchmarkTarget,
    trace: Path,
    tokenizer: Path,
    *,
    level: int,
    planned: int,
) -> dict[str, Any]:
    from serving.loadgen.api import replay_trace

    # Again now (the name may resolve elsewhere than when the target was entered), once: the
    # load generator connects only to the addresses checked here (DNS rebinding gets nowhere).
    try:
        pinned = outbound.resolve_pinned(
            target.base_url, allowed=outbound.parse_networks(settings.BENCHMARK_ALLOWED_NETWORKS)
        )
    except outbound.OutboundRefused as refused:
        logger.warning("benchmark %s target %s: address refused", report.id, target.id)
        return measure.failed_cell(
            num_requests=planned, reason=f"Not sent: {refused} (see BENCHMARK_ALLOWED_NETWORKS)"
        )
    try:
        api_key = _api_key(target)
    except StorageError:
        return measure.failed_cell(
            num_requests=planned,
            reason="The stored API key cannot be decrypted (was SECRET_KEY or COMPLIANCE_STORAGE_KEY changed?).",
        )
    try:
        result = replay_trace(
            endpoint=target.base_url,
            trace=trace,
            model=target.model,
            tokenizer=tokenizer,
            api="chat",
            api_key=api_key,
            max_prompt_tokens=report.max_prompt_tokens,
            max_output_tokens=report.max_output_tokens,
            ignore_eos=target.send_ignore_eos,
            seed=SEED,
            request_timeout_s=report.request_timeout_s,
            progress=False,
            connect_to={pinned.host: pinned.addresses},
        )
    except Exception as exc:
        # Whatever stopped this replay belongs to this target's row, not to the whole report.
        logger.warning("benchmark %s target %s: replay failed: %s", report.id, target.id, type(exc).__name__)
        return measure.failed_cell(num_requests=planned, reason=f"{type(exc).__name__}: {exc}")
    rng = np.random.default_rng([SEED, level, target.position])
    return measure.cell_from_replay(result, price=_price(target), rng=rng)


def _fail(report_id: str, message: str) -> str:
    with transaction.atomic():
        report = BenchmarkReport.objects.select_for_update().get(id=report_id)
        report.status = BenchmarkReport.Status.FAILED
        report.error = message
        report.finished_at = timezone.now()
        report.lease_owner, report.lease_heartbeat_at = "", None
        report.save(update_fields=["status", "error", "finished_at", "lease_owner", "lease_heartbeat_at"])
        audit_record(
            actor=None, organization=report.organization_id, action="benchmark_report.failed", target=report
        )
    return BenchmarkReport.Status.FAILED


def _run_enqueue(report: BenchmarkReport, why: str) -> bool:
    """Records the report's run in the task outbox, once per (report, why); False when it was."""
    key = f"benchmark_report.run:{report.id}:{why}"
    if OutboxMessage.objects.filter(key=key).exists():
        return False
    outbox_enqueue(
        task="portal.benchmarks.tasks.benchmark_report_run", kwargs={"report_id": str(report.id)}, key=key
    )
    return True


def benchmark_reports_recover(*, now: datetime | None = None) -> dict[str, int]:
    """Reports that nothing is running (part of the one redispatch beat, portal.outbox.recovery):

    - died: running, and its worker stopped heartbeating longer than the report's lease ago (killed,
      out of memory, its host gone), and the broker's copy of the message went with it or came back
      while the lease was still fresh. The run is queued again (it resumes after its last finished
      cell), or the report fails after BENCHMARK_MAX_ATTEMPTS runs in a row that died;
    - lost: still queued TUNING_REDISPATCH_AFTER_S after the broker took its message (a broker that
      lost its data). In a merely long queue the copy is a no-op: a run claims the report by state.
    Returns counts by case."""
    now = now or timezone.now()
    counts = {"died": 0, "lost": 0, "failed": 0}
    # The shortest lease a report can have (duration and timeout 0): a younger heartbeat is live.
    running = BenchmarkReport.objects.filter(status=BenchmarkReport.Status.RUNNING).filter(
        leases.free_or_stale(300.0, now)
    )
    for report in running.only("id", "duration_s", "request_timeout_s", "attempts", "lease_heartbeat_at"):
        beat = report.lease_heartbeat_at
        if beat is not None and beat >= leases.stale_before(report.lease_s, now):
            continue  # a long replay, still inside its lease
        with transaction.atomic():
            seen = (
                BenchmarkReport.objects.select_for_update(skip_locked=True)
                .filter(id=report.id, status=BenchmarkReport.Status.RUNNING, lease_heartbeat_at=beat)
                .exists()
            )
            if not seen:
                continue  # a run took it again meanwhile, or it ended
            if report.attempts >= settings.BENCHMARK_MAX_ATTEMPTS:
                _fail(
                    str(report.id),
                    f"Stopped after {report.attempts} runs in a row whose worker stopped before the "
                    "report finished. Create the report again.",
                )
                counts["failed"] += 1
            elif _run_enqueue(report, f"attempt-{report.attempts + 1}"):
                # Once per run that died: the next run's claim counts one more attempt.
                counts["died"] += 1
    lost_before = now - timedelta(seconds=settings.TUNING_REDISPATCH_AFTER_S)
    window = int(now.timestamp() // settings.TUNING_REDISPATCH_AFTER_S)
    # A report made since `lost_before` cannot have had its message sent before it.
    queued = BenchmarkReport.objects.filter(status=BenchmarkReport.Status.QUEUED, created_at__lt=lost_before)
    for report in queued.only("id"):
        if not outbox_lost(key_prefix=f"benchmark_report.run:{report.id}:", sent_before=lost_before):
            continue
        with transaction.atomic():
            # Once per redispatch window: a message the broker took and lost is sent again.
            counts["lost"] += int(_run_enqueue(report, f"lost-{window}"))
    return counts


def benchmark_report_run(*, report_id: str, owner: str | None = None) -> str:
    """Runs (or resumes) one report. Idempotent: a report another worker holds is skipped.

    `owner` names this run's lease (the task's id; a fresh name when None). Returns the report's
    final status, "skipped", or "lease-lost" (another worker took over). Never raises for what a target does; an
    unexpected error fails the report with a message rather than leaving it running."""
    owner = owner or f"run-{uuid.uuid4()}"
    if not _claim(report_id, owner):
        return "skipped"
    rows = BenchmarkReport.objects.filter(id=report_id)
    try:
        with leases.Heartbeat(rows, owner, every_s=_HEARTBEAT_S, name=f"benchmark-{report_id}"):
            return _run(report_id, owner)
    except _LeaseLost:
        logger.warning("benchmark %s: run %s lost its lease; its late results are dropped", report_id, owner)
        return "lease-lost"
    except Exception as exc:
        logger.exception("benchmark %s: run crashed", report_id)
        return _fail(report_id, f"Internal error while running the benchmark ({type(exc).__name__}).")


def _run(report_id: str, owner: str) -> str:
    from tuning.workload import TraceError, ingest_path, synthesize, write_mooncake_jsonl

    report = BenchmarkReport.objects.select_related("traffic_sample").get(id=report_id)
    targets = list(report.targets.all())
    try:
        tokenizer = benchmark_tokenizer_dir()
    except Exception as exc:
        logger.error("benchmark %s: no tokenizer: %s", report_id, exc)
        return _fail(
            report_id,
            f"No tokenizer to build prompts with ({type(exc).__name__}); check BENCHMARK_TOKENIZER_DIR.",
        )
    sample = report.traffic_sample
    source = workload_path(sample) if sample is not None else None
    if source is None or not source.exists():
        return _fail(report_id, "The traffic sample (or its replayable workload) was deleted before the run.")
    try:
        ingested = ingest_path(source, trace_format="mooncake", keep_blocks=True)
    except (TraceError, OSError) as exc:
        return _fail(report_id, f"The sample's workload could not be read: {exc}")

    if not (report.results or {}).get("levels"):
        conditions = _conditions(tokenizer)
        levels = [
            {"multiplier": m, "rate_rps": report.peak_rps * m, "num_requests_planned": None, "cells": {}}
            for m in report.load_multipliers
        ]
        _update_results(
            report_id, owner, lambda results: results.update(conditions=conditions, levels=levels)
        )
        report.refresh_from_db(fields=["results"])
    done = {(i, t) for i, level in enumerate(report.results["levels"]) for t in level.get("cells", {})}

    with tempfile.TemporaryDirectory(prefix="tailguard-benchmark-") as work:
        for index, multiplier in enumerate(report.load_multipliers):
            order = targets if index % 2 == 0 else targets[::-1]
            if all((index, str(t.id)) in done for t in order):
                continue
            # Same seed on a resumed run: the same requests at the same moments.
            trace = synthesize(
                ingested,
                target_rps=report.peak_rps * multiplier,
                duration_s=report.duration_s,
                rng=np.random.default_rng([SEED, index]),
            )
            path = Path(work) / f"level-{index}.jsonl"
            with path.open("wb") as out:
                write_mooncake_jsonl(trace, out)
            planned = trace.num_requests
            _update_results(report_id, owner, functools.partial(_set_planned, index=index, planned=planned))
            for target in order:
                if (index, str(target.id)) in done:
                    continue
                cell = _replay_cell(report, target, path, tokenizer, level=index, planned=planned)
                _update_results(
                    report_id,
                    owner,
                    functools.partial(_set_cell, index=index, target_id=str(target.id), cell=cell),
                )

    finished = timezone.now()
    _update_results(
        report_id,
        owner,
        lambda results: results.setdefault("conditions", {}).update(
            finished_at=finished.strftime("%Y-%m-%d %H:%M UTC")
        ),
    )
    with transaction.atomic():
        updated = BenchmarkReport.objects.filter(
            id=report_id, status=BenchmarkReport.Status.RUNNING, lease_owner=owner
        ).update(status=BenchmarkReport.Status.SUCCEEDED, finished_at=finished, **leases.FREE)
        if updated:
            audit_record(
                actor=None,
                organization=report.organization_id,
                action="benchmark_report.succeeded",
                target=report,
            )
    return BenchmarkReport.Status.SUCCEEDED


def _set_planned(results: dict[str, Any], *, index: int, planned: int) -> None:
    results["levels"][index]["num_requests_planned"] = planned


def _set_cell(results: dict[str, Any], *, index: int, target_id: str, cell: dict[str, Any]) -> None:
    results["levels"][index]["cells"][target_id] = cell


# --- Sharing ---------------------------------------------------------------------------------


def benchmark_share_create(
    *, actor: User, report: BenchmarkReport, days: int
) -> tuple[BenchmarkShareLink, str]:
    """A read-only link valid for `days` days; returns it and its secret (shown once)."""
    require_benchmark_staff(actor, "share benchmark reports")
    if not isinstance(days, int) or not SHARE_DAYS_MIN <= days <= SHARE_DAYS_MAX:
        raise ValidationError({"days": f"Links last {SHARE_DAYS_MIN} to {SHARE_DAYS_MAX} days."})
    if report.status != BenchmarkReport.Status.SUCCEEDED:
        raise ValidationError({"days": "Share a report once it has finished."})
    secret = tokens.new_link_secret()
    with transaction.atomic():
        link = BenchmarkShareLink.objects.create(
            organization=report.organization,
            report=report,
            token_hash=tokens.digest(secret),
            created_by=actor,
            expires_at=timezone.now() + timedelta(days=days),
        )
        audit_record(
            actor=actor,
            organization=report.organization,
            action="benchmark_share.create",
            target=link,
            data={"report": str(report.id), "days": days},
        )
    return link, secret


def benchmark_share_revoke(*, actor: User, link: BenchmarkShareLink) -> BenchmarkShareLink:
    require_benchmark_staff(actor, "revoke share links")
    with transaction.atomic():
        revoked = BenchmarkShareLink.objects.filter(id=link.id, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=actor
        )
        if revoked:
            audit_record(
                actor=actor,
                organization=link.organization_id,
                action="benchmark_share.revoke",
                target=link,
                data={"report": str(link.report_id)},
            )
    link.refresh_from_db()
    return link


def benchmark_share_open(*, secret: str, now: datetime | None = None) -> BenchmarkReport | None:
    """The report behind a live link (recording the view in the audit trail), or None when the
    link is unknown, expired or revoked."""
    now = now or timezone.now()
    with transaction.atomic():
        # Found by its secret, before its organization is known: a platform-wide lookup.
        with rls.platform_transaction():
            link = (
                BenchmarkShareLink.objects.select_for_update()
                .select_related("report")
                .filter(token_hash=tokens.digest(secret or ""), revoked_at__isnull=True, expires_at__gt=now)
                .first()
            )
        if link is None:
            return None
        with rls.tenant_transaction(link.organization_id):
            BenchmarkShareLink.objects.filter(id=link.id).update(
                view_count=F("view_count") + 1, last_viewed_at=now
            )
            audit_record(
                actor=None,
                organization=link.organization_id,
                action="benchmark_share.view",
                target=link,
                data={"report": str(link.report_id)},
            )
    return link.report
