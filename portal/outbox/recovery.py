"""The one redispatch of background work: each app registers how it finds its own work that a
dead worker or a lost message left behind, and the beat (`portal.outbox.tasks.redispatch`, every
REDISPATCH_INTERVAL_S) runs them all, then sends what the outbox holds.

A recoverer takes the beat's `now` and returns counts (or a number) for the beat's log. It frees
or re-queues its own rows, under its own leases (`portal.leases`), and hands the resulting
messages to the broker through the outbox or its own dispatch record, inside the transaction
that changed the row; it must be safe to run twice at once, as the beat may be.

Phases, in order: RECOVER (work whose holder died or whose message was lost is queued again),
then the outbox's own sends (which include what RECOVER just queued, where the broker did not
take it at once), then DELIVER (work that calls outside services itself, e.g. alert webhooks:
slow receivers must not hold up the rest).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

logger = logging.getLogger(__name__)

RECOVER = "recover"
DELIVER = "deliver"
PHASES = (RECOVER, DELIVER)

Recoverer = Callable[[datetime], Mapping[str, int] | int]

_REGISTERED: dict[str, tuple[str, Recoverer]] = {}


def register(name: str, recover: Recoverer, *, phase: str = RECOVER) -> None:
    """Adds (or replaces, for an app loaded again) the recoverer `name`."""
    if phase not in PHASES:
        raise ValueError(f"a recoverer's phase is one of {PHASES}, not {phase!r}")
    _REGISTERED[name] = (phase, recover)


def registered(phase: str) -> dict[str, Recoverer]:
    return {name: recover for name, (p, recover) in _REGISTERED.items() if p == phase}


def run(phase: str, now: datetime) -> dict[str, Any]:
    """Runs every recoverer of `phase`; one that raises is logged and reported as "error", and
    the others still run (one app's bug must not stop every other app's recovery)."""
    out: dict[str, Any] = {}
    for name, recover in registered(phase).items():
        try:
            result = recover(now)
        except Exception:
            logger.exception("redispatch: the recoverer %s failed; the others ran", name)
            out[name] = "error"
            continue
        out[name] = dict(result) if isinstance(result, Mapping) else result
    return out
