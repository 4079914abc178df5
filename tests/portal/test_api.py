"""REST API: the same operations as the pages, token auth, field errors and tenant isolation."""

from __future__ import annotations

import time

import pytest
from django.core import mail
from django.urls import reverse
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.accounts import services
from portal.accounts.models import ApiToken, Invitation, Membership, Organization, Role, User
from portal.accounts.reauth import SESSION_KEY as REAUTH_KEY
from portal.restkit.base import TenantScopedMixin
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _api(user: User | None = None, token: str | None = None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_login(user)
        # A sign-in with the password: fresh for creating tokens (test_reauth tries stale ones).
        session = client.session
        session[REAUTH_KEY] = {"user": str(user.pk), "at": time.time()}
        session.save()
    if token is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_schema_is_served() -> None:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/api/v1/tokens/", "/api/v1/invitations/", "/api/v1/organizations/", "/api/v1/auth/signup/"):
        assert path in paths
    assert APIClient().get("/api/docs/").status_code == 200


def test_signup_field_errors_and_duplicate(alice: User) -> None:
    client = APIClient()
    response = client.post("/api/v1/auth/signup/", {"email": "nope", "password": 5}, format="json")
    assert response.status_code == 400
    assert "email" in response.json()
    response = client.post(
        "/api/v1/auth/signup/", {"email": "alice@acme.test", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 400
    assert "already exists" in response.json()["email"][0]
    response = client.post("/api/v1/auth/signup/", {"email": "x@y.test", "password": "123"}, format="json")
    assert response.status_code == 400
    assert "password" in response.json()
    response = client.post("/api/v1/auth/signup/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert User.objects.count() == 1
    response = client.post(
        "/api/v1/auth/signup/", {"email": "new@y.test", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 201


def test_full_api_journey(db, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    owner = services.user_signup(email="o@x.test", password=PASSWORD)
    client = _api(owner)
    org = client.post("/api/v1/organizations/", {"name": "Org One"}, format="json")
    assert org.status_code == 201
    org2 = client.post("/api/v1/organizations/", {"name": "Org Two"}, format="json").json()
    assert client.get("/api/v1/me/").json()["current_organization"]["name"] == "Org One"
    switched = client.put("/api/v1/me/active-organization/", {"organization": org2["id"]}, format="json")
    assert switched.status_code == 200
    assert client.get("/api/v1/me/").json()["current_organization"]["name"] == "Org Two"
    with django_capture_on_commit_callbacks(execute=True):
        invited = client.post("/api/v1/invitations/", {"email": "p@x.test", "role": "admin"}, format="json")
    assert invited.status_code == 201
    secret = mail.outbox[-1].body.split("/invitations/accept/")[1].split("/")[0]
    invitee = services.user_signup(email="p@x.test", password=PASSWORD)
    accepted = _api(invitee).post("/api/v1/invitations/accept/", {"token": secret}, format="json")
    assert accepted.status_code == 200
    assert accepted.json()["name"] == "Org Two"
    again = _api(invitee).post("/api/v1/invitations/accept/", {"token": secret}, format="json")
    assert again.status_code == 400
    assert "already been used" in again.json()["token"][0]
    created = client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert created.status_code == 201
    secret_token = created.json()["token"]
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert all("token" not in row for row in listed)
    # The token acts on its own organization only.
    by_token = _api(token=secret_token)
    assert by_token.get("/api/v1/me/").json()["current_organization"]["name"] == "Org Two"
    assert [o["name"] for o in by_token.get("/api/v1/organizations/").json()] == ["Org Two"]
    assert by_token.delete(f"/api/v1/tokens/{created.json()['id']}/").status_code == 204
    refused = by_token.get("/api/v1/me/")
    assert refused.status_code == 401
    assert "revoked" in refused.json()["detail"]


def test_bad_bearer_tokens_are_explained(db) -> None:  # type: ignore[no-untyped-def]
    assert _api(token="tg_abcdefgh_nope").get("/api/v1/me/").json()["detail"] == "Invalid API token."
    response = APIClient().get("/api/v1/me/", HTTP_AUTHORIZATION="Bearer two words")
    assert response.status_code == 401
    assert "Malformed" in response.json()["detail"]


def test_invitation_payload_errors(alice: User) -> None:
    client = _api(alice)
    response = client.post("/api/v1/invitations/", {"email": "x@acme.test", "role": "emperor"}, format="json")
    assert response.status_code == 400
    assert "role" in response.json()
    response = client.post(
        "/api/v1/invitations/", {"email": "alice@acme.test", "role": "member"}, format="json"
    )
    assert response.status_code == 400
    assert "already a member" in response.json()["email"][0]
    assert not Invitation.objects.exists()


def _alice_objects(alice: User, alice_org: Organization, capture) -> dict[str, str]:  # type: ignore[no-untyped-def]
    token = services.api_token_create(actor=alice, organization=alice_org, name="alice-token").token
    with capture(execute=True):
        invitation = services.invitation_create(
            actor=alice, organization=alice_org, email="i@acme.test", role="member"
        )
    return {
        "token": f"/api/v1/tokens/{token.id}/",
        "invitation": f"/api/v1/invitations/{invitation.id}/",
    }


def _state() -> tuple[object, ...]:
    return (
        list(ApiToken.objects.values_list("id", "revoked_at")),
        list(Invitation.objects.values_list("id", "revoked_at")),
        Membership.objects.count(),
        AuditEvent.objects.count(),
    )


def test_charlie_sees_404_for_every_alice_object(
    alice: User, alice_org: Organization, charlie: User, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    urls = _alice_objects(alice, alice_org, django_capture_on_commit_callbacks)
    charlie_token = services.api_token_create(
        actor=charlie, organization=Organization.objects.get(name="Other Corp"), name="c"
    ).secret
    before = _state()
    for client in (_api(charlie), _api(token=charlie_token)):
        for url in urls.values():
            assert client.get(url).status_code == 404
            assert client.delete(url).status_code == 404
        # Lists show only Charlie's own rows.
        assert client.get("/api/v1/tokens/").json()["count"] == 1
        assert client.get("/api/v1/invitations/").json()["count"] == 0
        assert all(
            m["email"] == "charlie@other.test" for m in client.get("/api/v1/members/").json()["results"]
        )
    response = _api(charlie).put(
        "/api/v1/me/active-organization/", {"organization": str(alice_org.id)}, format="json"
    )
    assert response.status_code == 404
    assert _state() == before


def test_bob_viewer_cannot_write_through_the_api(
    alice: User, alice_org: Organization, bob: User, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    urls = _alice_objects(alice, alice_org, django_capture_on_commit_callbacks)
    before = _state()
    client = _api(bob)
    for url in urls.values():
        assert client.get(url).status_code == 200
        assert client.delete(url).status_code == 403
    assert client.post("/api/v1/tokens/", {"name": "b"}, format="json").status_code == 403
    response = client.post("/api/v1/invitations/", {"email": "q@acme.test", "role": "viewer"}, format="json")
    assert response.status_code == 403
    assert "admin role" in response.json()["detail"]
    assert _state() == before


def test_token_never_acts_above_its_creator(alice: User, alice_org: Organization) -> None:
    issued = services.api_token_create(actor=alice, organization=alice_org, name="owner-token")
    Membership.objects.filter(user=alice, organization=alice_org).update(role=Role.VIEWER)
    response = _api(token=issued.secret).post("/api/v1/tokens/", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert ApiToken.objects.count() == 1


def test_tenant_views_cannot_widen_their_queryset() -> None:
    with pytest.raises(TypeError, match="must not override get_queryset"):

        class Leaky(TenantScopedMixin):
            def get_queryset(self):  # type: ignore[no-untyped-def]
                return ApiToken.objects.all()


def test_every_api_route_requires_auth(db) -> None:  # type: ignore[no-untyped-def]
    client = APIClient()
    for name in ("me", "organizations", "members", "invitations", "tokens"):
        assert client.get(reverse(f"api:{name}")).status_code in {401, 403}
