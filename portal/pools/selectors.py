"""Reads of the pools app: which pools an organization may use, which hosts are alive."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from portal.accounts.models import Organization
from portal.pools.models import Host, Pool

# Set by `tailguard agent` in its own process (portal/pools/agent.py): the host it runs on.
AGENT_HOST_ENV = "TAILGUARD_AGENT_HOST_ID"


def pools_for(*, organization: Organization) -> QuerySet[Pool]:
    """The enabled pools this organization may choose: the platform's and its own."""
    return Pool.objects.filter(enabled=True).filter(Q(owned_by__isnull=True) | Q(owned_by=organization))


def pool_for(*, organization: Organization, name: str) -> Pool | None:
    """The pool of that name if this organization may use it (another's own pool is not found)."""
    return pools_for(organization=organization).filter(name=name).first()


def live_since(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(seconds=settings.POOL_HOST_LIVE_S)


def hosts_live(*, pool: Pool, now: datetime | None = None) -> QuerySet[Host]:
    """Hosts of the pool whose agent takes work and reported within POOL_HOST_LIVE_S."""
    return pool.hosts.filter(state=Host.State.ACTIVE, last_heartbeat_at__gte=live_since(now))


def host_is_live(host: Host, now: datetime | None = None) -> bool:
    return (
        host.state == Host.State.ACTIVE
        and host.last_heartbeat_at is not None
        and host.last_heartbeat_at >= live_since(now)
    )


def host_health(host: Host, now: datetime | None = None) -> str:
    """One word for the admin page: live, silent (no heartbeat lately), quarantined, stopped."""
    if host.state == Host.State.QUARANTINED:
        return "quarantined"
    if host.state == Host.State.STOPPED:
        return "stopped"
    return "live" if host_is_live(host, now) else "silent"


def pool_waiting_reason(*, pool: Pool, now: datetime | None = None) -> str:
    """Why work sent to the pool waits ('' when a live host will take it)."""
    if hosts_live(pool=pool, now=now).exists():
        return ""
    quarantined = pool.hosts.filter(state=Host.State.QUARANTINED).count()
    extra = f"; {quarantined} host(s) quarantined" if quarantined else ""
    return (
        f"waiting for a host of pool {pool.name}: no agent of this pool has reported in the last "
        f"{settings.POOL_HOST_LIVE_S} s{extra} (start one with `tailguard agent --pool {pool.name}`)"
    )


def host_here() -> Host | None:
    """The host whose agent runs this code (None outside an agent: the web side's workers)."""
    host_id = os.environ.get(AGENT_HOST_ENV)
    return Host.objects.select_related("pool").filter(id=host_id).first() if host_id else None


def host_summary(host: Host) -> dict[str, object]:
    """What a trial records about the host that measured it (shown on the job page)."""
    facts = host.facts or {}
    gpus = [g for g in facts.get("gpus") or [] if isinstance(g, dict)]
    return {
        "name": host.name,
        "pool": host.pool.name,
        "cpu_model": facts.get("cpu_model"),
        "num_cpus": facts.get("num_cpus"),
        "isa": facts.get("isa"),
        "gpus": f"{len(gpus)} x {gpus[0].get('name')}" if gpus else "none",
        "vllm_version": facts.get("vllm_version"),
    }
