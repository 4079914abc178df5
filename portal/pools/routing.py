"""Celery routing of pool work: the message names where it must run, the router picks the queue.

Work that must run on an engine host carries its target in its keyword arguments: `pool` (a
pool's name: any live host of the pool may take it, e.g. a trial or an endpoint's start) or
`host` (a host's id: it must run where an endpoint already runs, e.g. a new configuration, a
stop, a scrape). Celery calls `route_task` for every message it sends (settings
CELERY_TASK_ROUTES), so no caller picks queues by hand; work with neither goes to the default
queue, which the web side's ordinary workers consume. Each agent consumes exactly its pool's
queue and its own host queue (portal/pools/agent.py).
"""

from __future__ import annotations

from typing import Any


def pool_queue(pool_name: str) -> str:
    return f"pool.{pool_name}"


def host_queue(host_id: str) -> str:
    return f"host.{host_id}"


def route_task(
    name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **_: Any
) -> dict[str, str] | None:
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if kwargs.get("host"):
        return {"queue": host_queue(str(kwargs["host"]))}
    if kwargs.get("pool"):
        return {"queue": pool_queue(str(kwargs["pool"]))}
    return None
