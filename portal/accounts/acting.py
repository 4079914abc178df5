"""The credential a request acts with, for the role checks inside services.

A person signed in acts with their membership's role. A request signed with an API token acts
with the token's role cap as well: never above the role its creator had when the token was made,
whatever the creator's role is now, and only in the token's organization. Services check roles
through `Membership.has_role` (and `require_role`), which read the cap from here, so a view that
forgot to check, or a service stricter than its view, still refuses what the token may not do.

The cap lives in a context variable for the duration of one request: `ApiTokenAuthentication`
sets it when it accepts a token, and `RequestScopeMiddleware` clears it when the request ends
(a worker thread serves the next request with a clean slate).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass

from portal.accounts.models import ROLE_RANK


@dataclass(frozen=True)
class RoleCap:
    organization_id: object  # the token's organization: the only one the request may act in
    role: str  # the highest role the request may act with there
    user_id: object  # the token's creator: other people's memberships keep their own roles


_cap: ContextVar[RoleCap | None] = ContextVar("tailguard_role_cap", default=None)


def role_cap() -> RoleCap | None:
    return _cap.get()


def cap_role(*, organization_id: object, role: str, user_id: object) -> None:
    """Caps what the rest of this request may do (called by token authentication)."""
    current = _cap.get()
    if current is not None and current.organization_id == organization_id:
        role = min(role, current.role, key=lambda r: ROLE_RANK[r])
    _cap.set(RoleCap(organization_id=organization_id, role=role, user_id=user_id))


def begin_request() -> Token[RoleCap | None]:
    return _cap.set(None)


def end_request(token: Token[RoleCap | None]) -> None:
    _cap.reset(token)


def effective_role(*, organization_id: object, role: str, user_id: object) -> str | None:
    """The role a membership acts with under the current cap; None where the cap allows nothing
    (a token acting outside its own organization). Only the token creator's memberships are
    capped: a check on someone else's role (the member being removed) sees their own."""
    cap = _cap.get()
    if cap is None or str(cap.user_id) != str(user_id):
        return role
    if str(cap.organization_id) != str(organization_id):
        return None
    return min(role, cap.role, key=lambda r: ROLE_RANK[r])
