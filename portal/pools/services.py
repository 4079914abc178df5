"""Writes of the pools app: manage pools, and what agents report about their hosts.

A pool is checked against the registries, never a hard-coded list: its accelerator must be a
tuning hardware target (`tuning.search.job.HARDWARE`), its region one of this deployment's
residency regions. An agent's host is quarantined, with the reason, when what it reports
contradicts its pool's accelerator (a GPU pool's host without that GPU, or with fewer devices
than the pool promises); a quarantined agent takes no work.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from compliance.services import audit_record, residency_require
from portal.accounts.models import Organization, Role, User
from portal.accounts.services import require_role
from portal.pools import selectors
from portal.pools.models import Host, Pool
from serving.catalog.hardware import HARDWARE as CATALOG
from tuning.search.job import HARDWARE as TARGETS

POOL_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$")
MAX_DEVICES_PER_HOST = 64
MAX_PRICE = Decimal("10000")
_EDITABLE = (
    "region",
    "accelerator",
    "devices_per_host",
    "price_per_device_hour_usd",
    "endpoint_url_template",
    "bind_address",
    "runner",
    "k8s_namespace",
    "k8s_region",
    "k8s_kubeconfig",
    "enabled",
)


def _is_platform_admin(user: User) -> bool:
    return bool(user.is_superuser or (user.is_staff and getattr(user, "staff_role", "") == "platform_admin"))


def _clean(values: dict[str, Any]) -> dict[str, Any]:
    """The pool's fields checked and normalised; every fault at once, each on its field."""
    errors: dict[str, str] = {}
    out = dict(values)
    if "region" in values:
        region = str(values["region"] or "").strip()
        if region not in settings.COMPLIANCE_REGIONS:
            errors["region"] = (
                f"Unknown region {region!r}; this deployment's regions are {', '.join(settings.COMPLIANCE_REGIONS)}."
            )
        out["region"] = region
    if "accelerator" in values:
        accelerator = str(values["accelerator"] or "").strip()
        if accelerator not in TARGETS:
            errors["accelerator"] = (
                f"Unknown accelerator {accelerator!r}; known: {', '.join(sorted(TARGETS))}."
            )
        out["accelerator"] = accelerator
    if "devices_per_host" in values:
        try:
            devices = int(values["devices_per_host"])
        except (TypeError, ValueError):
            devices = 0
        if not 1 <= devices <= MAX_DEVICES_PER_HOST:
            errors["devices_per_host"] = f"Give a whole number from 1 to {MAX_DEVICES_PER_HOST}."
        out["devices_per_host"] = devices
    if "price_per_device_hour_usd" in values:
        raw = values["price_per_device_hour_usd"]
        price: Decimal | None = None
        if raw is not None and str(raw).strip() != "":
            # Empty is "not priced"; a set price must be one: 0 would rank every configuration
            # as equally free, and selection would compare costs that are not there.
            try:
                price = Decimal(str(raw).strip())
            except (InvalidOperation, ValueError):
                price = Decimal("NaN")
            if not (price.is_finite() and Decimal(0) < price <= MAX_PRICE):
                errors["price_per_device_hour_usd"] = (
                    f"Give a price above 0 and at most {MAX_PRICE} USD per device-hour, "
                    "or leave it empty for a pool that is not priced."
                )
        out["price_per_device_hour_usd"] = price
    if "endpoint_url_template" in values:
        template = str(values["endpoint_url_template"] or "").strip()
        if not re.match(r"^https?://[^\s/]+", template) or not (
            "{port}" in template or "{endpoint}" in template
        ):
            errors["endpoint_url_template"] = (
                "Give an http(s) URL with {port} (a host's address) or {endpoint} (an ingress per endpoint), "
                "e.g. https://{endpoint}.h200.example.com or http://10.0.0.5:{port}."
            )
        elif set(re.findall(r"[{}][^{}]*[{}]?", template)) - {"{port}", "{endpoint}"} or len(template) > 300:
            errors["endpoint_url_template"] = "Only {port} and {endpoint} may appear in braces."
        out["endpoint_url_template"] = template
    if "bind_address" in values:
        bind = str(values["bind_address"] or "").strip()
        if not re.match(r"^[A-Za-z0-9.:-]{1,64}$", bind):
            errors["bind_address"] = "Give an address to listen on, e.g. 0.0.0.0 or 127.0.0.1."
        out["bind_address"] = bind
    if "runner" in values:
        runner = str(values["runner"] or "local")
        if runner not in {"local", "kubernetes"}:
            errors["runner"] = "Choose local (the pool's hosts) or kubernetes."
        elif runner == "kubernetes":
            if not re.match(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", str(values.get("k8s_namespace") or "")):
                errors["k8s_namespace"] = "A Kubernetes pool needs its namespace (a DNS label)."
            k8s_region = str(values.get("k8s_region") or "").strip()
            hardware = CATALOG.get(str(values.get("accelerator") or ""))
            offered = {r.name: r.code for r in hardware.regions} if hardware is not None else {}
            if not k8s_region:
                errors["k8s_region"] = "A Kubernetes pool needs its provider region, as the catalog lists it."
            elif hardware is None:
                errors["accelerator"] = (
                    "A Kubernetes pool's accelerator must be one the hardware catalog lists."
                )
            elif k8s_region not in offered:
                errors["k8s_region"] = (
                    f"The catalog does not offer {hardware.name} in {k8s_region!r}; it does in {', '.join(sorted(offered))}."
                )
            elif offered[k8s_region] != str(values.get("region") or ""):
                # The residency rule is checked on the pool's region: it must be where the cluster is.
                errors["region"] = (
                    f"{k8s_region} is in {offered[k8s_region]!r}, not {values.get('region')!r}."
                )
        out["runner"] = runner
    if errors:
        raise ValidationError(errors)
    return out


def _require_manager(actor: User, owned_by: Organization | None, doing: str) -> None:
    if owned_by is None:
        if not _is_platform_admin(actor):
            raise PermissionDenied(f"Only platform admins may {doing} shared pools.")
    else:
        require_role(actor=actor, organization=owned_by, minimum=Role.ADMIN, doing=f"{doing} pools")


def pool_create(
    *,
    actor: User,
    name: str,
    region: str,
    accelerator: str,
    devices_per_host: int = 1,
    price_per_device_hour_usd: Decimal | float | str | None = None,
    endpoint_url_template: str = "http://127.0.0.1:{port}",
    bind_address: str = "127.0.0.1",
    owned_by: Organization | None = None,
    runner: str = "local",
    k8s_namespace: str = "",
    k8s_region: str = "",
    k8s_kubeconfig: str = "",
) -> Pool:
    """A new pool: the platform's (owned_by None, platform admins) or an organization's own (its admins)."""
    _require_manager(actor, owned_by, "create")
    name = (name or "").strip()
    values = _clean(
        {
            "region": region,
            "accelerator": accelerator,
            "devices_per_host": devices_per_host,
            "price_per_device_hour_usd": price_per_device_hour_usd,
            "endpoint_url_template": endpoint_url_template,
            "bind_address": bind_address,
            "runner": runner,
            "k8s_namespace": k8s_namespace,
            "k8s_region": k8s_region,
            "k8s_kubeconfig": k8s_kubeconfig,
        }
    )
    if not POOL_NAME.match(name):
        raise ValidationError({"name": "Use 1-63 lower-case letters, digits and dashes, e.g. h200-us-east."})
    if Pool.objects.filter(name=name).exists():
        raise ValidationError({"name": f"A pool named {name!r} already exists."})
    if owned_by is not None:
        # An organization's own pool must itself sit where the organization may compute.
        residency_require(organization=owned_by, region=values["region"], doing="this pool")
    with transaction.atomic():
        pool = Pool.objects.create(name=name, owned_by=owned_by, created_by=actor, **values)
        audit_record(
            actor=actor,
            organization=owned_by,
            action="pool.create",
            target=pool,
            data={"name": name, "region": values["region"], "accelerator": values["accelerator"]},
        )
    return pool


def pool_update(*, actor: User, pool: Pool, **changes: Any) -> Pool:
    unknown = sorted(set(changes) - set(_EDITABLE))
    if unknown:
        raise ValidationError({k: "This field cannot be changed." for k in unknown})
    _require_manager(actor, pool.owned_by, "change")
    values = _clean(changes)
    with transaction.atomic():
        Pool.objects.filter(pk=pool.pk).update(**values, updated_at=timezone.now())
        audit_record(
            actor=actor,
            organization=pool.owned_by,
            action="pool.update",
            target=pool,
            data={k: str(v) for k, v in values.items()},
        )
    pool.refresh_from_db()
    return pool


def pool_require_usable(*, organization: Organization, name: str, doing: str) -> Pool:
    """The pool `name` if the organization may run `doing` on it; else a ValidationError on
    `pool` saying why (unknown or another organization's pool, disabled, outside residency)."""
    pool = selectors.pool_for(organization=organization, name=(name or "").strip())
    if pool is None:
        known = ", ".join(selectors.pools_for(organization=organization).values_list("name", flat=True))
        raise ValidationError(
            {"pool": f"No pool named {name!r} is available to you; available: {known or 'none'}."}
        )
    residency_require(organization=organization, region=pool.region, doing=doing, field="pool")
    return pool


def endpoint_base_url(*, pool: Pool, port: int, endpoint_slug: str) -> str:
    """Where clients reach an endpoint of this pool (the pool's configured public address)."""
    return pool.endpoint_url_template.format(port=port, endpoint=endpoint_slug).rstrip("/")


# --- hosts, as their agents report them -------------------------------------------------------


def hardware_contradiction(*, pool: Pool, facts: dict[str, Any]) -> str:
    """Why the host's reported hardware cannot serve as this pool's accelerator ('' if it can).

    A CPU target needs nothing a host can lack. A GPU target needs at least `devices_per_host`
    GPUs whose driver name carries the catalog's name for that accelerator (NVML's "NVIDIA H200"
    for `h200`)."""
    target = TARGETS.get(pool.accelerator)
    if target is None:
        return f"the pool's accelerator {pool.accelerator!r} is no longer a known hardware target"
    if target.device_kind == "cpu":
        return ""
    gpus = [g for g in facts.get("gpus") or [] if isinstance(g, dict)]
    if not gpus:
        return (
            f"pool {pool.name} is {pool.accelerator} ({target.device_kind}) but the host reports no GPU "
            f"(source: {facts.get('gpu_source', 'none')})"
        )
    token = re.sub(
        r"[^a-z0-9]",
        "",
        (CATALOG[pool.accelerator].name if pool.accelerator in CATALOG else pool.accelerator).lower(),
    )
    matching = [g for g in gpus if token in re.sub(r"[^a-z0-9]", "", str(g.get("name", "")).lower())]
    if not matching:
        names = ", ".join(sorted({str(g.get("name")) for g in gpus}))
        return f"pool {pool.name} is {pool.accelerator} but the host's GPUs are {names}"
    if len(matching) < pool.devices_per_host:
        return (
            f"pool {pool.name} promises {pool.devices_per_host} {pool.accelerator} per host; "
            f"this host has {len(matching)}"
        )
    return ""


def host_register(*, pool_name: str, name: str, facts: dict[str, Any], agent_pid: int) -> Host:
    """An agent starting: its host row, quarantined (with the reason) when its hardware
    contradicts the pool's accelerator. The caller takes no work from a quarantined host."""
    pool = Pool.objects.filter(name=pool_name).first()
    if pool is None:
        known = ", ".join(Pool.objects.values_list("name", flat=True))
        raise ValidationError({"pool": f"No pool named {pool_name!r}; known: {known or 'none'}."})
    if not pool.enabled:
        raise ValidationError({"pool": f"Pool {pool_name!r} is disabled."})
    if not HOST_NAME.match(name or ""):
        raise ValidationError({"name": f"{name!r} is not a usable host name (letters, digits, . _ -)."})
    reason = hardware_contradiction(pool=pool, facts=facts)
    now = timezone.now()
    with transaction.atomic():
        host, _ = Host.objects.select_for_update().get_or_create(pool=pool, name=name)
        host.facts = facts
        host.agent_pid = agent_pid
        host.started_at = now
        host.last_heartbeat_at = now
        host.current_task = ""
        host.current_task_since = None
        host.state = Host.State.QUARANTINED if reason else Host.State.ACTIVE
        host.quarantine_reason = reason
        host.save()
        audit_record(
            actor=None,
            organization=pool.owned_by,
            action="host.quarantine" if reason else "host.register",
            target=host,
            data={"pool": pool.name, "host": name, **({"reason": reason} if reason else {})},
        )
    return host


def host_heartbeat(*, host_id: str, facts: dict[str, Any] | None = None) -> bool:
    """The agent is alive (and its facts, when given). False: the host row is gone or stopped."""
    values: dict[str, Any] = {"last_heartbeat_at": timezone.now()}
    if facts is not None:
        values["facts"] = facts
    return bool(Host.objects.filter(id=host_id).exclude(state=Host.State.STOPPED).update(**values))


def host_task_started(*, host_id: str, description: str) -> None:
    Host.objects.filter(id=host_id).update(current_task=description[:300], current_task_since=timezone.now())


def host_task_finished(*, host_id: str, description: str) -> None:
    from django.db.models import F

    Host.objects.filter(id=host_id).update(
        current_task="", current_task_since=None, last_task=description[:300], tasks_done=F("tasks_done") + 1
    )


def host_stopped(*, host_id: str) -> None:
    """A clean agent shutdown (a quarantined host keeps its state and reason)."""
    Host.objects.filter(id=host_id, state=Host.State.ACTIVE).update(
        state=Host.State.STOPPED, current_task="", current_task_since=None
    )
