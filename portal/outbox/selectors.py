"""Reads of the outbox for the apps that own the work: is a message of theirs still waiting for
the broker, and did the broker take the last one so long ago that it must have lost it?

An app names its messages `<action>:<id>:<suffix>` (one message per time the work becomes due),
so everything the outbox holds for one piece of work shares the prefix `<action>:<id>:`.
"""

from __future__ import annotations

from datetime import datetime

from portal.outbox.models import OutboxMessage


def outbox_waiting(*, key_prefix: str) -> bool:
    """A message under `key_prefix` waits for the broker (it was down or stuck when sent)."""
    return OutboxMessage.objects.filter(
        key__startswith=key_prefix, status=OutboxMessage.Status.PENDING
    ).exists()


def outbox_lost(*, key_prefix: str, sent_before: datetime) -> bool:
    """The work under `key_prefix` has no copy the broker can still deliver: no message waits to
    be sent, and the newest one the broker took went to it before `sent_before` (a broker that lost
    its data, or a message already purged) or there is none. Whoever owns the work and sees it
    still unclaimed records a new message; a copy that was merely slow is a no-op for a task that
    claims its work by state."""
    mine = OutboxMessage.objects.filter(key__startswith=key_prefix)
    if mine.filter(status=OutboxMessage.Status.PENDING).exists():
        return False
    return not mine.filter(status=OutboxMessage.Status.SENT, sent_at__gte=sent_before).exists()
