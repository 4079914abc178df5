"""Leases on database rows: which worker holds a piece of background work, kept alive by a
heartbeat, taken over once the heartbeat is older than the lease.

A row that can be leased has two fields, `lease_owner` (the holder's name, e.g. its Celery task
id; empty: free) and `lease_heartbeat_at`. One conditional UPDATE takes a lease (so two workers
can never both hold it), a thread keeps it fresh while the work runs, and the holder drops it
when done; a holder killed mid-work leaves a lease that goes stale after `lease_s`, and the next
taker (a re-delivered message, a redispatcher) proceeds. Writes that finish the work are fenced
by the lease: `held(queryset, owner)` under SELECT ... FOR UPDATE, so a holder that lost its
lease drops its late result instead of overwriting its successor's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DatabaseError, connection, models
from django.db.models import Q, QuerySet
from django.utils import timezone

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Leased(models.Model):
    """The fields of a row that background work leases (an abstract base of the run models)."""

    # The holder (e.g. its Celery task id); empty: nobody holds it.
    lease_owner = models.CharField(max_length=200, blank=True)
    # When the holder last said it was alive: another worker takes over only when it is older
    # than the lease (a killed worker).
    lease_heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


# The field values of a free lease (an `update(**FREE)` drops whoever held it).
FREE: dict[str, Any] = {"lease_owner": "", "lease_heartbeat_at": None}


def stale_before(lease_s: float, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(seconds=lease_s)


def free_or_stale(lease_s: float, now: datetime | None = None) -> Q:
    """Rows nobody holds, or whose holder stopped heartbeating `lease_s` ago."""
    stale = stale_before(lease_s, now)
    return Q(lease_owner="") | Q(lease_heartbeat_at__isnull=True) | Q(lease_heartbeat_at__lt=stale)


def take(queryset: QuerySet[Any], owner: str, *, lease_s: float, **also: Any) -> bool:
    """Take the lease of the row(s) in `queryset` that are free or stale, writing `also` with it.
    False: a live holder has it (or no row matched)."""
    now = timezone.now()
    return bool(
        queryset.filter(free_or_stale(lease_s, now)).update(lease_owner=owner, lease_heartbeat_at=now, **also)
    )


def drop(queryset: QuerySet[Any], owner: str) -> int:
    """Give the lease back, if `owner` still holds it."""
    return int(queryset.filter(lease_owner=owner).update(**FREE))


def held(queryset: QuerySet[Any], owner: str) -> bool:
    """Whether `owner` still holds the row's lease, locking the row (call inside a transaction,
    before writing the work's result)."""
    return queryset.select_for_update().filter(lease_owner=owner).exists()


class Heartbeat:
    """Keeps `owner`'s lease on the row(s) of `queryset` fresh from a thread while the work runs
    (a trial can take minutes). A database that drops the thread's connection (restart,
    failover) costs one beat: the next one reconnects."""

    def __init__(self, queryset: QuerySet[Any], owner: str, *, every_s: float, name: str) -> None:
        self.queryset, self.owner, self.every_s = queryset, owner, every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"lease-{name}")

    def _run(self) -> None:
        try:
            while not self.stop.wait(self.every_s):
                try:
                    self.queryset.filter(lease_owner=self.owner).update(lease_heartbeat_at=timezone.now())
                except DatabaseError as exc:
                    logger.warning("%s: heartbeat not recorded (%s)", self.thread.name, exc)
                    connection.close()
        finally:
            connection.close()

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def hold(queryset: QuerySet[Any], owner: str, work: Callable[[], T], *, every_s: float, name: str) -> T:
    """Runs `work` while keeping `owner`'s lease fresh. Work that raises gives the lease back, so
    the next delivery need not wait for it to run out; a database that is away then (restart,
    failover) cannot take it back, and the lease runs out instead."""
    try:
        with Heartbeat(queryset, owner, every_s=every_s, name=name):
            return work()
    except Exception:
        try:
            drop(queryset, owner)
        except DatabaseError:
            logger.warning("%s: %s lost the database; its lease will run out", name, owner)
        raise
