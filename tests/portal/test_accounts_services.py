"""Accounts services: signup, organizations, invitations and API tokens, with their errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from compliance.models import AuditEvent
from portal.accounts import services, tokens
from portal.accounts.models import ApiToken, Invitation, Membership, Organization, Role, User
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _invite(actor, organization, email, role=Role.MEMBER, django_capture_on_commit_callbacks=None):  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=True):
        invitation = services.invitation_create(
            actor=actor, organization=organization, email=email, role=role
        )
    body = mail.outbox[-1].body
    secret = body.split("/invitations/accept/")[1].split("/")[0]
    return invitation, secret


def test_signup_rejects_duplicate_email_case_insensitively(alice) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as info:
        services.user_signup(email="ALICE@acme.test", password=PASSWORD)
    assert "already exists" in info.value.message_dict["email"][0]
    assert User.objects.filter(email__iexact="alice@acme.test").count() == 1


def test_signup_names_weak_password_and_bad_email(db) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as info:
        services.user_signup(email="new@x.test", password="short")
    assert "password" in info.value.message_dict
    with pytest.raises(ValidationError) as info:
        services.user_signup(email="not-an-email", password=PASSWORD)
    assert "email" in info.value.message_dict
    assert not User.objects.exists()


def test_organization_create_makes_owner_and_audits(alice) -> None:  # type: ignore[no-untyped-def]
    org = services.organization_create(actor=alice, name="Acme Voice")
    assert org.slug == "acme-voice-2"
    assert Membership.objects.get(organization=org, user=alice).role == Role.OWNER
    assert AuditEvent.objects.filter(organization=org, action="organization.create", actor=alice).exists()


def test_invitation_round_trip(alice, alice_org, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    invitation, secret = _invite(
        alice, alice_org, "dana@acme.test", Role.ADMIN, django_capture_on_commit_callbacks
    )
    invitation.refresh_from_db()
    assert invitation.sent_at is not None
    # Only the digest is stored.
    assert invitation.token_hash == tokens.digest(secret)
    assert secret not in str(list(Invitation.objects.values()))
    dana = services.user_signup(email="dana@acme.test", password=PASSWORD)
    membership = services.invitation_accept(user=dana, secret=secret)
    assert membership.organization == alice_org
    assert membership.role == Role.ADMIN
    with pytest.raises(services.InvitationError, match="already been used"):
        services.invitation_accept(user=dana, secret=secret)


def test_invitation_errors_are_clear(alice, alice_org, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    eve = services.user_signup(email="eve@acme.test", password=PASSWORD)
    mallory = services.user_signup(email="mallory@evil.test", password=PASSWORD)
    invitation, secret = _invite(
        alice, alice_org, "eve@acme.test", Role.MEMBER, django_capture_on_commit_callbacks
    )
    with pytest.raises(services.InvitationError, match="sent to another email address"):
        services.invitation_accept(user=mallory, secret=secret)
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(services.InvitationError, match="expired"):
        services.invitation_accept(user=eve, secret=secret)
    with pytest.raises(services.InvitationError, match="not valid"):
        services.invitation_accept(user=eve, secret="garbage")
    _, secret2 = _invite(alice, alice_org, "eve@acme.test", Role.MEMBER, django_capture_on_commit_callbacks)
    services.invitation_revoke(
        actor=alice, invitation=Invitation.objects.get(token_hash=tokens.digest(secret2))
    )
    with pytest.raises(services.InvitationError, match="withdrawn"):
        services.invitation_accept(user=eve, secret=secret2)
    assert not Membership.objects.filter(user__in=[eve, mallory], organization=alice_org).exists()


def test_duplicate_task_sends_one_email(alice, alice_org, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    invitation, _ = _invite(
        alice, alice_org, "frank@acme.test", Role.MEMBER, django_capture_on_commit_callbacks
    )
    sent = len(mail.outbox)
    assert services.invitation_send_email(invitation_id=str(invitation.id)) is False
    assert len(mail.outbox) == sent


def test_viewer_cannot_invite_and_nothing_changes(bob, alice_org) -> None:  # type: ignore[no-untyped-def]
    before = Invitation.objects.count()
    with pytest.raises(PermissionDenied):
        services.invitation_create(actor=bob, organization=alice_org, email="x@acme.test", role=Role.VIEWER)
    assert Invitation.objects.count() == before


def test_admin_cannot_grant_owner(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    admin = services.user_signup(email="adm@acme.test", password=PASSWORD)
    Membership.objects.create(organization=alice_org, user=admin, role=Role.ADMIN)
    with pytest.raises(ValidationError) as info:
        services.invitation_create(actor=admin, organization=alice_org, email="x@acme.test", role=Role.OWNER)
    assert "role" in info.value.message_dict


def test_api_token_is_hashed_shown_once_and_revocable(alice, alice_org) -> None:  # type: ignore[no-untyped-def]
    issued = services.api_token_create(actor=alice, organization=alice_org, name="ci")
    assert issued.secret.startswith("tg_")
    assert "secret=<hidden>" in repr(issued)
    stored = ApiToken.objects.get(pk=issued.token.pk)
    assert stored.token_hash == tokens.digest(issued.secret)
    assert issued.secret not in str(list(ApiToken.objects.values()))
    assert services.api_token_authenticate(secret=issued.secret).pk == stored.pk
    services.api_token_revoke(actor=alice, token=stored)
    with pytest.raises(services.TokenError, match="revoked"):
        services.api_token_authenticate(secret=issued.secret)
    with pytest.raises(ValidationError, match="already revoked"):
        services.api_token_revoke(actor=alice, token=ApiToken.objects.get(pk=stored.pk))
    with pytest.raises(services.TokenError, match="Invalid"):
        services.api_token_authenticate(secret=issued.secret[:-2] + "xx")


def test_viewer_cannot_create_tokens(bob, alice_org) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PermissionDenied):
        services.api_token_create(actor=bob, organization=alice_org, name="nope")
    assert not ApiToken.objects.exists()


def test_expire_task_marks_stale_invitations(alice, alice_org, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    invitation, _ = _invite(
        alice, alice_org, "gina@acme.test", Role.MEMBER, django_capture_on_commit_callbacks
    )
    assert services.invitations_expire() == 0
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    assert services.invitations_expire() == 1
    assert Invitation.objects.get(pk=invitation.pk).revoked_at is not None
    assert Organization.objects.count() == 1
