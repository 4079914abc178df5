"""Compliance's side of `portal.accounts.ports`: the audit trail and the second factor, as the
accounts app (below compliance) reaches them. Registered in `ComplianceConfig.ready`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.http import HttpRequest

from compliance import auth, selectors, services


class AccountsCompliance:
    def audit(
        self,
        *,
        actor: Any,
        action: str,
        organization: Any = None,
        target: Any = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        services.audit_record(actor=actor, action=action, organization=organization, target=target, data=data)

    def recent_events(self, *, organization: Any, limit: int) -> Sequence[Any]:
        return list(selectors.audit_event_list(organization=organization)[:limit])

    def signed_in(self, *, user: Any, request: HttpRequest | None) -> None:
        auth.sign_in_record(user=user, request=request)

    def signed_out(self, *, user: Any, request: HttpRequest | None) -> None:
        auth.sign_out_record(user=user, request=request)

    def second_factor_confirmed(self, *, user: Any) -> bool:
        return selectors.totp_confirmed(user=user)

    def second_factor_verify(self, *, user: Any, code: str) -> bool:
        return services.totp_verify(user=user, code=code)

    def second_factor_required(self, *, user: Any) -> bool:
        return selectors.two_factor_required(user=user)
