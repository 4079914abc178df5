"""The one tenant-scoped base class every organization-owned API view inherits.

The organization comes from the API token (a token belongs to exactly one organization) or,
for browser sessions, from the session's current organization. `get_queryset` is final: a
subclass names its rows with `tenant_queryset()` and the base class always filters them by
organization, so no subclass can widen what it sees. Another tenant's object is a 404.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import Model, QuerySet
from rest_framework import exceptions, permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from portal.accounts.models import ROLE_RANK, ApiToken, Membership, Role
from portal.accounts.tenancy import SESSION_KEY


class Tenant:
    """The organization a request acts in and the role it acts with."""

    def __init__(self, membership: Membership, role: str, token: ApiToken | None) -> None:
        self.membership = membership
        self.organization = membership.organization
        self.role = role
        self.token = token

    def has_role(self, minimum: str) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[minimum]


def resolve_tenant(request: Request) -> Tenant | None:
    user = request.user
    if not user or not user.is_authenticated:
        return None
    if isinstance(request.auth, ApiToken):
        token = request.auth
        membership = (
            Membership.objects.select_related("organization")
            .filter(user=user, organization=token.organization)
            .first()
        )
        if membership is None:
            return None
        # A token never acts above its creator's current role.
        role = min(token.role, membership.role, key=lambda r: ROLE_RANK[r])
        return Tenant(membership, role, token)
    memberships = Membership.objects.select_related("organization").filter(user=user)
    wanted = request.session.get(SESSION_KEY) if hasattr(request, "session") else None
    membership = memberships.filter(organization_id=wanted).first() if wanted else None
    if membership is None:
        membership = memberships.order_by("organization__name").first()
    return Tenant(membership, membership.role, None) if membership else None


class TenantRolePermission(permissions.BasePermission):
    """Reads need membership; writes need the view's `write_role`."""

    message = "You do not have a role in this organization that allows this."

    def has_permission(self, request: Request, view: Any) -> bool:
        tenant: Tenant | None = getattr(view, "tenant", None)
        if tenant is None:
            self.message = "You are not a member of any organization. Create one first."
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        needed = view.write_role
        if not tenant.has_role(needed):
            self.message = f"This needs the {needed} role or above; you act as {tenant.role}."
            return False
        return True


class TenantScopedMixin:
    """Mix into any DRF view of organization-owned rows (see the module docstring)."""

    permission_classes: ClassVar = [permissions.IsAuthenticated, TenantRolePermission]
    write_role: ClassVar[str] = Role.ADMIN
    tenant: Tenant | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__:
            raise TypeError(f"{cls.__name__} must not override get_queryset; define tenant_queryset()")

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Authentication must run first, then the tenant is fixed for the request.
        request.user  # noqa: B018
        self.tenant = resolve_tenant(request)
        super().initial(request, *args, **kwargs)  # type: ignore[misc]

    def tenant_queryset(self) -> QuerySet[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define tenant_queryset()")

    def get_queryset(self) -> QuerySet[Any]:
        if self.tenant is None:
            raise exceptions.NotFound()
        return self.tenant_queryset().filter(organization=self.tenant.organization)

    def get_object(self) -> Model:
        queryset = self.get_queryset()
        lookup = self.kwargs.get("pk")  # type: ignore[attr-defined]
        obj = queryset.filter(pk=lookup).first()
        if obj is None:
            raise exceptions.NotFound()
        return obj


__all__ = ["APIView", "Tenant", "TenantRolePermission", "TenantScopedMixin", "resolve_tenant"]
