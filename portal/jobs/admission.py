"""Checks that apps above jobs make before a tuning job is admitted, registered at startup.

Billing sits above jobs (it meters their trials and the endpoints deployed from them), so jobs
may not import it (issue 22: no cycle between portal apps); a past-due subscription still
refuses new jobs: billing registers its check here in `BillingConfig.ready`. A check refuses by
raising `ValidationError` with the message the person sees; running work is never touched.
"""

from __future__ import annotations

from collections.abc import Callable

from portal.accounts.models import Organization

StartCheck = Callable[[Organization], None]

_CHECKS: dict[str, StartCheck] = {}


def register(name: str, check: StartCheck) -> None:
    """Register (or replace, by name: `ready()` may run twice in tests) a start check."""
    _CHECKS[name] = check


def assert_can_start(*, organization: Organization) -> None:
    """Runs every registered check, in name order; the first refusal propagates."""
    for name in sorted(_CHECKS):
        _CHECKS[name](organization)
