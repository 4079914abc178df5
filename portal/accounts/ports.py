"""What accounts needs from the compliance layer above it, without importing it.

Compliance builds on accounts (organizations, memberships, row-level security), so accounts may
not import compliance (issue 22: one direction between them). Accounts still writes audit events
in its own transactions, checks second factors before sensitive actions and shows an
organization's recent events; it does so through `Compliance`, a typed port that compliance fills
when Django starts (`ComplianceConfig.ready`). Until it is filled every call refuses loudly:
an account change must never go unaudited because an app was left out of INSTALLED_APPS.

The names two layers share in a request or a session are defined here, below both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

# Set on the request by the sign-in backend when its throttle refused an attempt: the seconds
# until the next one is allowed (forms and services turn it into a message).
RETRY_AFTER_ATTR = "login_retry_after_s"
# The session holds the user's primary key here once its two-factor step passed.
TWO_FACTOR_KEY = "_tailguard_two_factor"


class Compliance(Protocol):
    """The audit trail and the second factor, as accounts uses them."""

    def audit(
        self,
        *,
        actor: Any,
        action: str,
        organization: Any = None,
        target: Any = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Append one event to the organization's audit chain, in the caller's transaction."""
        ...

    def recent_events(self, *, organization: Any, limit: int) -> Sequence[Any]:
        """The organization's newest audit events, newest first."""
        ...

    def signed_in(self, *, user: Any, request: HttpRequest | None) -> None: ...

    def signed_out(self, *, user: Any, request: HttpRequest | None) -> None: ...

    def second_factor_confirmed(self, *, user: Any) -> bool:
        """Whether the user has a confirmed authenticator."""
        ...

    def second_factor_verify(self, *, user: Any, code: str) -> bool:
        """Checks an authenticator or recovery code (replays and floods refused)."""
        ...

    def second_factor_required(self, *, user: Any) -> bool:
        """Whether the user must pass a second factor in every session."""
        ...


_COMPLIANCE: list[Compliance] = []


def register(implementation: Compliance) -> None:
    """Fill the port (again, replacing: `ready()` may run twice in tests)."""
    _COMPLIANCE[:] = [implementation]


def compliance() -> Compliance:
    if not _COMPLIANCE:
        raise ImproperlyConfigured(
            "portal.accounts needs the compliance app (audit trail, two-factor): add 'compliance' "
            "to INSTALLED_APPS."
        )
    return _COMPLIANCE[0]
