"""Per-request context the audit trail records (set by `compliance.middleware`)."""

from __future__ import annotations

from contextvars import ContextVar

# The id of the request being served ("" outside a request: tasks, commands).
request_id: ContextVar[str] = ContextVar("tailguard_request_id", default="")
