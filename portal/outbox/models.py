"""The task outbox: one row per message the broker owes a worker.

A service writes the row in the transaction that makes the work due, so the broker never holds
the only copy of "this has to run": a broker that is down when the transaction commits delays
the work, and loses nothing. The row is platform plumbing, not tenant data: it carries a task's
name and its keyword arguments (ids only, never personal data), so it has no `organization` and
is read and written by the web side after its tenant transaction ended, and by the beat.
"""

from __future__ import annotations

from django.db import models


class OutboxMessage(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Waiting for the broker"
        SENT = "sent", "Taken by the broker"

    # The logical action this message performs, unique: the same action recorded twice (a
    # retried request, a repeated webhook) is one message, e.g. "invitation.send:<id>".
    key = models.CharField(max_length=255, unique=True)
    # The registered Celery task's name, e.g. "portal.endpoints.tasks.endpoint_start".
    task = models.CharField(max_length=200)
    # The task's keyword arguments, routing ones included (`pool`, `host`: the Celery router,
    # portal.pools.routing, picks the queue from them when the message is sent).
    kwargs = models.JSONField(default=dict)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    # Tries to hand the message to the broker, failed or not.
    attempts = models.PositiveIntegerField(default=0)
    # A pending message is sent by whoever first finds it due: set ahead while one sender holds
    # it (a claim), and after a failed try (the back-off).
    next_attempt_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # Why the last try failed ("" when it did not), for whoever looks at a message still pending.
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="outbox_due"),
            models.Index(fields=["status", "sent_at"], name="outbox_sent"),
        ]

    def __str__(self) -> str:
        return f"{self.task} ({self.key}, {self.status})"
