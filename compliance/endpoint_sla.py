"""The endpoints' SLA rows that the compliance page and console show, so compliance can show them
without importing the apps that keep endpoints (issue 22: it depends on no portal app but
accounts).

Compliance owns the pages and the arithmetic (`compliance.sla`); portal.sla owns the endpoints'
SLA state and registers the function that lists them when Django starts (its `AppConfig.ready`).
"""

from __future__ import annotations

from typing import Any, Protocol


class RowsProvider(Protocol):
    """One row per endpoint of the organization, by name: {"endpoint", "terms" (SLATerms or
    None), "report" (this month's `compliance.sla.WindowReport`, or None without terms)}."""

    def __call__(self, *, organization: Any) -> list[dict[str, Any]]: ...


_provider: list[RowsProvider] = []


def register(provider: RowsProvider) -> None:
    """Register the rows' provider (or replace it: `ready()` may run twice in tests)."""
    _provider[:] = [provider]


def endpoint_sla_rows(*, organization: Any) -> list[dict[str, Any]]:
    """Each of the organization's endpoints with its SLA terms and this month's result (none
    while no app that keeps endpoints is installed)."""
    return _provider[0](organization=organization) if _provider else []
