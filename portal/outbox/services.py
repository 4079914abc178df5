"""Writes of the outbox: record a task's message with the state change that makes it due, hand it
to the broker after the commit, and send again what the broker never took.

- `outbox_enqueue` runs inside the caller's transaction: the message exists exactly when the
  state change does. After the commit, `outbox_publish` tries the broker once, quickly (each try
  bounded by the broker's socket timeouts, settings.REDIS_BROKER_TIMEOUTS, with one quick second
  try), and marks the message sent. A broker that is down or hangs costs the request those few
  seconds and nothing else: the message stays pending.
- `outbox_redispatch` sends the pending messages that are due, oldest first, at most OUTBOX_BATCH
  a run, and deletes sent ones after OUTBOX_KEEP_SENT_DAYS. It is one part of `redispatch`, the
  one beat of background work (every REDISPATCH_INTERVAL_S), which first runs the recoverers the
  apps register (`portal.outbox.recovery`: work whose worker died, queued again).

One sender at a time per message: a sender first claims it by moving `next_attempt_at` ahead by
`CLAIM_S` (the beat under `select_for_update(skip_locked=True)`, so two beats never take the same
row; the after-commit try by a conditional update). A sender that dies holding a claim frees the
message when the claim runs out.

Exactly once, as the caller sees it, is at-least-once here plus idempotent consumers: a sender
that dies after the broker took the message but before it marked it sent leaves it pending, and
it goes out again. Every task sent through the outbox therefore claims its work by state (an
invitation not sent yet, a report still queued, ...), so a second delivery does nothing.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from celery import Task
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from portal.celery import app
from portal.outbox import recovery
from portal.outbox.models import OutboxMessage

logger = logging.getLogger(__name__)

# One quick second try; the outbox and its beat are the real retry.
SEND_RETRY_POLICY = {"max_retries": 1, "interval_start": 0.0, "interval_step": 0.5, "interval_max": 0.5}
# How long a sender holds a message: far longer than one send can take (two tries, each bounded
# by the broker's connect and socket timeouts), so a live sender never loses its claim.
CLAIM_S = 120
# After a failed try the message waits RETRY_BASE_S x 2^(tries-1), at most RETRY_MAX_S: an
# outage is usually the broker's, not the message's, and a start must not wait long after it.
RETRY_BASE_S = 5
RETRY_MAX_S = 60
# Sent messages deleted per beat run at most (the rest in the next runs).
PURGE_BATCH = 1000
KEY_MAX = OutboxMessage._meta.get_field("key").max_length or 255


class _Outcome:
    SENT = "sent"
    # The broker was unreachable or stuck: the message waits for the next beat.
    UNSENT = "unsent"
    # Anything else went wrong with this one message (recorded in its `last_error`).
    FAILED = "failed"


def _registered_task(name: str) -> Task:
    """The Celery task registered under `name` ("<module>.<function>", Celery's default name).

    Tasks are named, not imported, by the services that record them (an app's tasks module
    imports its services). A worker has every task module loaded (autodiscovery); a web process
    loads the one named here on first use, as a worker would."""
    module, _, _function = name.rpartition(".")
    if module and name not in app.tasks:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not module.startswith(exc.name or "\0"):
                raise  # the task's module exists and lacks something it imports
    try:
        return app.tasks[name]
    except KeyError:
        raise LookupError(f"no Celery task is registered as {name!r}") from None


def outbox_enqueue(*, task: str, kwargs: Mapping[str, Any], key: str) -> OutboxMessage:
    """Records that `task(**kwargs)` must run, once per `key` (the logical action: the same key
    again returns the first message and sends nothing more). Call inside the transaction that
    makes the work due; the message goes to the broker after its commit.

    `kwargs` must be JSON (ids as strings); routing arguments (`pool`, `host`) stay in it, where
    the Celery router reads them when the message is sent."""
    key = (key or "").strip()
    if not key or len(key) > KEY_MAX:
        raise ValueError(f"an outbox key has 1 to {KEY_MAX} characters, not {len(key)}")
    _registered_task(task)  # a name no worker knows fails here, in the caller's transaction
    message, created = OutboxMessage.objects.get_or_create(
        key=key, defaults={"task": task, "kwargs": dict(kwargs), "next_attempt_at": timezone.now()}
    )
    if not created:
        if message.task != task:
            raise ValueError(f"outbox key {key!r} already names task {message.task!r}, not {task!r}")
        return message
    message_id = message.id
    # Robust: the caller's change is committed whatever happens here; the beat sends it later.
    transaction.on_commit(lambda: outbox_publish(message_id=message_id), robust=True)
    return message


def outbox_publish(*, message_id: int, now: datetime | None = None) -> bool:
    """One quick try to hand one pending message to the broker; True when the broker took it.
    Never raises for a broker that is down or stuck: the message stays pending for the beat."""
    now = now or timezone.now()
    claimed = OutboxMessage.objects.filter(
        id=message_id, status=OutboxMessage.Status.PENDING, next_attempt_at__lte=now
    ).update(next_attempt_at=now + timedelta(seconds=CLAIM_S))
    if not claimed:
        return False  # sent already, or another sender holds it
    message = OutboxMessage.objects.get(id=message_id)
    return _send(message, now=now) == _Outcome.SENT


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(RETRY_MAX_S, RETRY_BASE_S * 2 ** max(attempts - 1, 0)))


def _send(message: OutboxMessage, *, now: datetime) -> str:
    """Sends one claimed message and records the outcome on it."""
    try:
        _registered_task(message.task).apply_async(
            kwargs=message.kwargs, retry=True, retry_policy=SEND_RETRY_POLICY
        )
    except Exception as exc:
        unreachable = isinstance(exc, BrokerError | OSError)
        attempts = message.attempts + 1
        OutboxMessage.objects.filter(id=message.id, status=OutboxMessage.Status.PENDING).update(
            attempts=attempts,
            last_error=f"{type(exc).__name__}: {exc}"[:500],
            next_attempt_at=now + _backoff(attempts),
        )
        if unreachable:
            logger.warning(
                "outbox %s (%s): the broker did not take it (%s); it stays pending",
                message.id,
                message.key,
                exc,
            )
            return _Outcome.UNSENT
        logger.exception("outbox %s (%s): could not be sent", message.id, message.key)
        return _Outcome.FAILED
    OutboxMessage.objects.filter(id=message.id, status=OutboxMessage.Status.PENDING).update(
        status=OutboxMessage.Status.SENT, sent_at=timezone.now(), attempts=F("attempts") + 1, last_error=""
    )
    return _Outcome.SENT


def outbox_redispatch(*, now: datetime | None = None) -> dict[str, int]:
    """The beat: sends the pending messages that are due, oldest first (at most OUTBOX_BATCH),
    then deletes old sent ones. Returns counts: sent, unsent (the broker is still unreachable),
    failed (this message could not be sent), purged."""
    now = now or timezone.now()
    with transaction.atomic():
        batch = list(
            OutboxMessage.objects.select_for_update(skip_locked=True)
            .filter(status=OutboxMessage.Status.PENDING, next_attempt_at__lte=now)
            .order_by("created_at", "id")[: settings.OUTBOX_BATCH]
        )
        OutboxMessage.objects.filter(id__in=[m.id for m in batch]).update(
            next_attempt_at=now + timedelta(seconds=CLAIM_S)
        )
    counts = {_Outcome.SENT: 0, _Outcome.UNSENT: 0, _Outcome.FAILED: 0}
    for position, message in enumerate(batch):
        outcome = _send(message, now=now)
        counts[outcome] += 1
        if outcome == _Outcome.UNSENT:
            # The broker is unreachable: the rest would each wait out the same timeouts. They
            # are due again at once, for the next run.
            rest = [m.id for m in batch[position + 1 :]]
            OutboxMessage.objects.filter(id__in=rest, status=OutboxMessage.Status.PENDING).update(
                next_attempt_at=now
            )
            counts[_Outcome.UNSENT] += len(rest)
            break
    return {**counts, "purged": outbox_purge(now=now)}


def redispatch(*, now: datetime | None = None) -> dict[str, Any]:
    """The one beat of background work: the apps' recoverers (work whose worker died or whose
    message was lost, queued again), the outbox's sends, then the deliveries to outside services.
    Returns each part's counts by name."""
    now = now or timezone.now()
    out = recovery.run(recovery.RECOVER, now)
    out["outbox"] = outbox_redispatch(now=now)
    out.update(recovery.run(recovery.DELIVER, now))
    return out


def outbox_purge(*, now: datetime | None = None) -> int:
    """Deletes messages sent more than OUTBOX_KEEP_SENT_DAYS ago, at most PURGE_BATCH of them."""
    now = now or timezone.now()
    before = now - timedelta(days=settings.OUTBOX_KEEP_SENT_DAYS)
    ids = list(
        OutboxMessage.objects.filter(status=OutboxMessage.Status.SENT, sent_at__lt=before)
        .order_by("sent_at")
        .values_list("id", flat=True)[:PURGE_BATCH]
    )
    if not ids:
        return 0
    deleted, _ = OutboxMessage.objects.filter(id__in=ids).delete()
    return deleted
