"""HTML pages: the signup → organization → invite → switch → tokens journey, and refusals."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from compliance.models import AuditEvent
from portal.accounts import services
from portal.accounts.models import ApiToken, Invitation, Membership, Organization, Role, User
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_signup_create_org_and_dashboard(client: Client) -> None:
    response = client.post(
        reverse("accounts:signup"), {"email": "new@x.test", "password": PASSWORD, "full_name": "New"}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("accounts:organization_create")
    # No organization yet: the dashboard sends people to create one.
    assert client.get(reverse("accounts:dashboard"))["Location"] == reverse("accounts:organization_create")
    response = client.post(reverse("accounts:organization_create"), {"name": "Voice Co"})
    assert response.status_code == 302
    page = client.get(reverse("accounts:dashboard"))
    assert page.status_code == 200
    assert b"Voice Co" in page.content
    assert b"organization.create" in page.content


def test_signup_errors_name_the_field(client: Client, alice: User) -> None:
    response = client.post(reverse("accounts:signup"), {"email": "alice@acme.test", "password": PASSWORD})
    assert response.status_code == 400
    assert b"already exists" in response.content
    response = client.post(reverse("accounts:signup"), {"email": "bad", "password": ""})
    assert response.status_code == 400
    assert b'data-field="email"' in response.content
    assert b'data-field="password"' in response.content
    assert User.objects.count() == 1


def test_malformed_organization_form_is_400(alice_client: Client) -> None:
    before = Organization.objects.count()
    response = alice_client.post(reverse("accounts:organization_create"), {"name": "x" * 500})
    assert response.status_code == 400
    assert b'data-field="name"' in response.content
    assert Organization.objects.count() == before


def test_invite_by_email_link_then_switch_organizations(
    alice_client: Client,
    alice_org: Organization,
    charlie: User,
    charlie_client: Client,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(
            reverse("accounts:members"), {"email": "charlie@other.test", "role": "member"}
        )
    assert response.status_code == 302
    link = next(line for line in mail.outbox[-1].body.splitlines() if "/invitations/accept/" in line)
    path = link[link.index("/invitations/accept/") :]
    assert charlie_client.get(path).status_code == 200
    response = charlie_client.post(path)
    assert response.status_code == 302
    assert Membership.objects.get(user=charlie, organization=alice_org).role == Role.MEMBER
    # Reusing the link is refused with a clear message.
    again = charlie_client.post(path)
    assert again.status_code == 400
    assert b"already been used" in again.content
    # Charlie now switches between his own organization and Alice's.
    own = Organization.objects.get(name="Other Corp")
    charlie_client.post(reverse("accounts:organization_switch"), {"organization": str(own.id)})
    assert b"Other Corp</h1>" in charlie_client.get(reverse("accounts:dashboard")).content
    charlie_client.post(reverse("accounts:organization_switch"), {"organization": str(alice_org.id)})
    assert b"Acme Voice</h1>" in charlie_client.get(reverse("accounts:dashboard")).content


def test_tokens_page_shows_secret_once_and_revokes(alice_client: Client) -> None:
    response = alice_client.post(reverse("accounts:api_tokens"), {"name": "deploy"})
    assert response.status_code == 200
    secret = response.context["issued"].secret
    assert secret.encode() in response.content
    listing = alice_client.get(reverse("accounts:api_tokens"))
    assert secret.encode() not in listing.content
    token = ApiToken.objects.get(name="deploy")
    response = alice_client.post(reverse("accounts:api_token_revoke", args=[token.id]))
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    # The htmx path returns the fragment only.
    fragment = alice_client.post(reverse("accounts:api_tokens"), {"name": "ci"}, HTTP_HX_REQUEST="true")
    assert b"<html" not in fragment.content
    assert b"new-token-secret" in fragment.content


def test_charlie_gets_404_for_alice_objects(
    alice: User, alice_org: Organization, charlie_client: Client, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    token = services.api_token_create(actor=alice, organization=alice_org, name="t").token
    with django_capture_on_commit_callbacks(execute=True):
        invitation = services.invitation_create(
            actor=alice, organization=alice_org, email="z@acme.test", role=Role.MEMBER
        )
    events = AuditEvent.objects.count()
    for url in (
        reverse("accounts:api_token_revoke", args=[token.id]),
        reverse("accounts:invitation_revoke", args=[invitation.id]),
    ):
        assert charlie_client.post(url).status_code == 404
    assert (
        charlie_client.post(
            reverse("accounts:organization_switch"), {"organization": str(alice_org.id)}
        ).status_code
        == 404
    )
    assert (
        charlie_client.post(reverse("accounts:organization_switch"), {"organization": "nope"}).status_code
        == 404
    )
    token.refresh_from_db()
    invitation.refresh_from_db()
    assert token.revoked_at is None
    assert invitation.revoked_at is None
    assert AuditEvent.objects.count() == events


def test_bob_viewer_writes_are_403(
    alice: User, alice_org: Organization, bob_client: Client, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    token = services.api_token_create(actor=alice, organization=alice_org, name="t").token
    with django_capture_on_commit_callbacks(execute=True):
        invitation = services.invitation_create(
            actor=alice, organization=alice_org, email="z@acme.test", role=Role.MEMBER
        )
    counts = (Invitation.objects.count(), ApiToken.objects.count(), AuditEvent.objects.count())
    assert (
        bob_client.post(reverse("accounts:members"), {"email": "q@acme.test", "role": "viewer"}).status_code
        == 403
    )
    assert bob_client.post(reverse("accounts:api_tokens"), {"name": "mine"}).status_code == 403
    assert bob_client.post(reverse("accounts:api_token_revoke", args=[token.id])).status_code == 403
    assert bob_client.post(reverse("accounts:invitation_revoke", args=[invitation.id])).status_code == 403
    # Reads are allowed.
    assert bob_client.get(reverse("accounts:members")).status_code == 200
    assert bob_client.get(reverse("accounts:api_tokens")).status_code == 200
    assert (Invitation.objects.count(), ApiToken.objects.count(), AuditEvent.objects.count()) == counts
    token.refresh_from_db()
    invitation.refresh_from_db()
    assert token.revoked_at is None and invitation.revoked_at is None


def test_anonymous_is_sent_to_login(client: Client) -> None:
    for name in (
        "accounts:dashboard",
        "accounts:members",
        "accounts:api_tokens",
        "accounts:organization_create",
    ):
        response = client.get(reverse(name))
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("accounts:login"))
