"""Bearer API tokens: `Authorization: Bearer tg_xxxxxxxx_...`."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from portal.accounts import acting, rls, services


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        secret = secret.strip()
        if not secret or " " in secret:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: use 'Bearer <token>'.")
        try:
            token = services.api_token_authenticate(secret=secret)
        except services.TokenError as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        # From here on the request acts in the token's organization (row-level security), and
        # the services' role checks see the token's cap, not only its creator's current role.
        if transaction.get_connection().in_atomic_block:
            rls.scope_transaction(organization_id=token.organization_id, user_id=token.created_by_id)
        acting.cap_role(organization_id=token.organization_id, role=token.role, user_id=token.created_by_id)
        return token.created_by, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "portal.api.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An organization-scoped API token."}
