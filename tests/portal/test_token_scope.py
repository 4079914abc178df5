"""API tokens act within their own role cap inside services, and a removed member's tokens stay
dead (issue 27 finding 12). Each test makes the attack and checks that nothing changed."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from rest_framework.test import APIClient, APIRequestFactory

from compliance.models import AuditEvent
from portal.accounts import acting, services
from portal.accounts.models import ApiToken, Invitation, Membership, Organization, Role, User
from portal.api.authentication import ApiTokenAuthentication
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def dave(alice_org: Organization) -> User:
    user = services.user_signup(email="dave@acme.test", password=PASSWORD, full_name="Dave")
    Membership.objects.create(organization=alice_org, user=user, role=Role.MEMBER)
    return user


def _authenticate(secret: str) -> None:
    """What the API does with a bearer header: the real authentication class, which sets the cap."""
    request = APIRequestFactory().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert ApiTokenAuthentication().authenticate(request) is not None


def test_a_member_token_stays_a_member_inside_services_after_its_creator_is_promoted(
    alice_org: Organization, dave: User
) -> None:
    issued = services.api_token_create(actor=dave, organization=alice_org, name="ci")
    assert issued.token.role == Role.MEMBER
    Membership.objects.filter(user=dave, organization=alice_org).update(role=Role.ADMIN)
    before = (Invitation.objects.count(), ApiToken.objects.count())
    scope = acting.begin_request()
    try:
        _authenticate(issued.secret)
        # Services that need more than the token's cap refuse, whatever the view checked.
        with pytest.raises(PermissionDenied, match="capped by this API token"):
            services.invitation_create(actor=dave, organization=alice_org, email="x@evil.test", role="viewer")
        # Other people's memberships keep their own roles (Alice is still the owner).
        assert Membership.objects.get(user__email="alice@acme.test", organization=alice_org).has_role(
            Role.OWNER
        )
        # A token cannot mint a token above its own cap.
        minted = services.api_token_create(actor=dave, organization=alice_org, name="escalate")
        assert minted.token.role == Role.MEMBER
    finally:
        acting.end_request(scope)
    assert Invitation.objects.count() == before[0]
    # Outside the token's request the person acts with their own (admin) role again.
    assert Membership.objects.get(user=dave, organization=alice_org).has_role(Role.ADMIN)
    # Through HTTP: the member-capped token cannot do an admin's work either.
    refused = _bearer(issued.secret).post(
        "/api/v1/invitations/", {"email": "y@evil.test", "role": "viewer"}, format="json"
    )
    assert refused.status_code == 403
    assert Invitation.objects.count() == before[0]


def test_a_token_cannot_act_in_another_organization_of_its_creator(
    alice_org: Organization, dave: User
) -> None:
    other = services.organization_create(actor=dave, name="Dave's own")
    issued = services.api_token_create(actor=dave, organization=alice_org, name="ci")
    scope = acting.begin_request()
    try:
        _authenticate(issued.secret)
        with pytest.raises(PermissionDenied, match="another organization"):
            services.invitation_create(actor=dave, organization=other, email="x@evil.test", role="viewer")
    finally:
        acting.end_request(scope)
    assert not Invitation.objects.filter(organization=other).exists()


def test_a_removed_members_tokens_never_work_again(alice: User, alice_org: Organization, dave: User) -> None:
    issued = services.api_token_create(actor=dave, organization=alice_org, name="ci")
    assert _bearer(issued.secret).get("/api/v1/me/").status_code == 200
    owner = APIClient()
    owner.force_login(alice)
    membership = Membership.objects.get(user=dave, organization=alice_org)
    assert owner.delete(f"/api/v1/members/{membership.pk}/").status_code == 204
    assert _bearer(issued.secret).get("/api/v1/me/").status_code == 401
    assert ApiToken.objects.get(pk=issued.token.pk).revoked_at is not None
    event = AuditEvent.objects.get(action="membership.remove")
    assert event.data["tokens_revoked"] == 1
    # Invited back: a new membership, and the old token stays dead.
    Membership.objects.create(organization=alice_org, user=dave, role=Role.MEMBER)
    assert _bearer(issued.secret).get("/api/v1/me/").status_code == 401


def test_a_token_dies_with_its_membership_even_when_removed_outside_the_service(
    alice_org: Organization, dave: User
) -> None:
    # A membership deleted another way (the admin, a cascade) and re-created: not revoked, still dead.
    issued = services.api_token_create(actor=dave, organization=alice_org, name="ci")
    Membership.objects.filter(user=dave, organization=alice_org).delete()
    Membership.objects.create(organization=alice_org, user=dave, role=Role.ADMIN)
    response = _bearer(issued.secret).get("/api/v1/me/")
    assert response.status_code == 401
    assert "no longer a member" in response.json()["detail"]


def test_who_may_remove_whom(
    alice: User, alice_org: Organization, bob: User, charlie: User, dave: User
) -> None:
    alice_membership = Membership.objects.get(user=alice, organization=alice_org)
    dave_membership = Membership.objects.get(user=dave, organization=alice_org)
    viewer, stranger, owner = APIClient(), APIClient(), APIClient()
    viewer.force_login(bob)
    stranger.force_login(charlie)
    owner.force_login(alice)
    refused = viewer.delete(f"/api/v1/members/{dave_membership.pk}/")
    assert refused.status_code == 403 and "admin or above" in refused.json()["detail"]
    assert stranger.delete(f"/api/v1/members/{dave_membership.pk}/").status_code == 404
    last_owner = owner.delete(f"/api/v1/members/{alice_membership.pk}/")
    assert last_owner.status_code == 400 and "needs an owner" in str(last_owner.json())
    assert Membership.objects.filter(organization=alice_org).count() == 3
    # The HTML page: a viewer leaves by themself.
    from django.test import Client

    page = Client()
    page.force_login(bob)
    bob_membership = Membership.objects.get(user=bob, organization=alice_org)
    assert page.post(f"/members/{bob_membership.pk}/remove/").status_code == 302
    assert not Membership.objects.filter(user=bob, organization=alice_org).exists()
