"""What the product apps hold for an organization, so compliance can enforce retention and delete
an organization without importing them.

Compliance owns the rules (how long data may be kept, who may delete an organization, what the
audit trail records); each portal app that keeps an organization's data owns the purge of it and
registers a `DataHolder` when Django starts (its `AppConfig.ready`). Retention and deletion then
walk the registered holders in `order`. A holder is a handful of plain functions over one
organization; none may raise for "nothing to do".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class RetentionCutoffs:
    """Rows created before these moments are past the organization's retention."""

    samples: datetime
    sample_days: int
    metrics: datetime
    metric_days: int


@dataclass(frozen=True)
class DataHolder:
    """One app's share of an organization's data.

    - `expire(organization, cutoffs)` removes what retention no longer allows and returns counts
      under the names in `counts` (the same names every time, zeros included);
    - `refuse_deletion(organization)` says why the organization cannot be deleted yet ("" when
      it can: e.g. an endpoint still serves);
    - `remove_files(organization)` removes files the app keeps outside the database;
    - `count(organization)` reports what the deletion removes, for its audit event;
    - `delete_rows(organization)` deletes rows that the organization's cascade would not take in
      the right order (holders run in ascending `order`);
    - `freeze(now)` runs once per retention run, before any holder expires anything in any
      organization: it stores the results that are computed from data retention may remove
      (portal.sla freezes the SLA windows that ended before `now`).
    """

    name: str
    order: int = 100
    counts: tuple[str, ...] = ()
    expire: Callable[[Any, RetentionCutoffs], dict[str, int]] | None = None
    refuse_deletion: Callable[[Any], str] | None = None
    remove_files: Callable[[Any], None] | None = None
    count: Callable[[Any], dict[str, int]] | None = None
    delete_rows: Callable[[Any], None] | None = None
    freeze: Callable[[datetime], object] | None = None


_HOLDERS: dict[str, DataHolder] = {}


def register(holder: DataHolder) -> None:
    """Register (or replace, by name: `ready()` may run twice in tests) an app's holder."""
    _HOLDERS[holder.name] = holder


def holders() -> list[DataHolder]:
    return sorted(_HOLDERS.values(), key=lambda holder: (holder.order, holder.name))
