"""Writes of the accounts app: signup, organizations, invitations, API tokens.

Every mutating function takes the acting user, checks the actor's role itself (views only
orchestrate), and writes its audit event in the same transaction. Side effects (email) leave
with `transaction.on_commit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import authenticate
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify

from portal.accounts import rls, tokens
from portal.accounts.models import ROLE_RANK, ApiToken, Invitation, Membership, Organization, Role, User
from portal.accounts.ports import RETRY_AFTER_ATTR, compliance
from portal.outbox.services import outbox_enqueue


class InvitationError(Exception):
    """An invitation link that cannot be used; the message tells the person why."""


class TokenError(Exception):
    """An API token that does not authenticate; the message tells the client why."""


def _require_role(membership: Membership | None, minimum: str, doing: str) -> Membership:
    if membership is None:
        raise PermissionDenied("You are not a member of this organization.")
    if not membership.has_role(minimum):
        article = "an" if minimum[0] in "aeiou" else "a"
        acting = membership.acting_role
        if acting is None:
            raise PermissionDenied("This API token belongs to another organization.")
        as_token = " (capped by this API token)" if acting != membership.role else ""
        raise PermissionDenied(
            f"Only {article} {minimum} or above can {doing}; you act as {acting}{as_token}."
        )
    return membership


def _membership(user: User, organization: Organization) -> Membership | None:
    return Membership.objects.filter(user=user, organization=organization).first()


def require_role(*, actor: User, organization: Organization, minimum: str, doing: str) -> Membership:
    """The actor's membership if its role is at least `minimum`; else PermissionDenied saying why.

    Every service that changes an organization's data starts with this."""
    return _require_role(_membership(actor, organization), minimum, doing)


def user_signup(*, email: str, password: str, full_name: str = "") -> User:
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationError({"email": "Enter a valid email address."}) from None
    if User.objects.filter(email__iexact=email).exists():
        raise ValidationError({"email": "An account with this email already exists. Sign in instead."})
    candidate = User(email=email, full_name=full_name.strip())
    try:
        validate_password(password, user=candidate)
    except ValidationError as exc:
        raise ValidationError({"password": exc.messages}) from None
    try:
        with transaction.atomic():
            user = User.objects.create_user(email=email, password=password, full_name=full_name.strip())
            compliance().audit(actor=user, action="user.signup", target=user)
    except IntegrityError:
        # Two signups with one address at the same moment: the unique constraint decides.
        raise ValidationError(
            {"email": "An account with this email already exists. Sign in instead."}
        ) from None
    return user


def _unique_slug(name: str) -> str:
    base = slugify(name)[:50] or "org"
    slug, n = base, 1
    while Organization.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def organization_create(*, actor: User, name: str) -> Organization:
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "Name your organization."})
    if len(name) > 120:
        raise ValidationError({"name": "Use at most 120 characters."})
    with transaction.atomic():
        organization = Organization.objects.create(name=name, slug=_unique_slug(name), created_by=actor)
        # Its first rows are written in its own tenant (row-level security).
        with rls.tenant_transaction(organization.id):
            Membership.objects.create(organization=organization, user=actor, role=Role.OWNER)
            compliance().audit(
                actor=actor, organization=organization, action="organization.create", target=organization
            )
    return organization


def invitation_create(*, actor: User, organization: Organization, email: str, role: str) -> Invitation:
    membership = _require_role(_membership(actor, organization), Role.ADMIN, "invite people")
    email = (email or "").strip().lower()
    errors: dict[str, str] = {}
    try:
        validate_email(email)
    except ValidationError:
        errors["email"] = "Enter a valid email address."
    if role not in ROLE_RANK:
        errors["role"] = f"Choose one of: {', '.join(Role.values)}."
    elif ROLE_RANK[role] > ROLE_RANK[membership.role]:
        errors["role"] = f"You cannot grant a role above your own ({membership.role})."
    if (
        not errors
        and Membership.objects.filter(organization=organization, user__email__iexact=email).exists()
    ):
        errors["email"] = f"{email} is already a member of {organization.name}."
    if errors:
        raise ValidationError(errors)
    now = timezone.now()
    with transaction.atomic():
        # A new invitation replaces any pending one for the same address.
        Invitation.objects.filter(
            organization=organization, email=email, accepted_at__isnull=True, revoked_at__isnull=True
        ).update(revoked_at=now)
        invitation = Invitation.objects.create(
            organization=organization,
            email=email,
            role=role,
            # Placeholder digest of a secret nobody knows; the sending task sets the real one.
            token_hash=tokens.digest(tokens.new_link_secret()),
            invited_by=actor,
            expires_at=now + timedelta(hours=settings.INVITATION_TTL_HOURS),
        )
        compliance().audit(
            actor=actor,
            organization=organization,
            action="invitation.create",
            target=invitation,
            data={"email": email, "role": role},
        )
        # Sent after the commit, or by the outbox's beat if the broker is down then.
        outbox_enqueue(
            task="portal.accounts.tasks.invitation_send",
            kwargs={"invitation_id": str(invitation.id)},
            key=f"invitation.send:{invitation.id}",
        )
    return invitation


def invitation_send_email(*, invitation_id: str) -> bool:
    """Sends the invitation's link. Claims the row first, so a duplicated task sends nothing.

    The link secret is made here and never stored in clear or passed through the broker.
    Returns whether an email was sent.
    """
    secret = tokens.new_link_secret()
    claimed = Invitation.objects.filter(
        id=invitation_id, sent_at__isnull=True, accepted_at__isnull=True, revoked_at__isnull=True
    ).update(sent_at=timezone.now(), token_hash=tokens.digest(secret))
    if not claimed:
        return False
    invitation = Invitation.objects.select_related("organization", "invited_by").get(id=invitation_id)
    link = settings.SITE_URL + reverse("accounts:invitation_accept", args=[secret])
    inviter = invitation.invited_by.email if invitation.invited_by else "A Tailguard user"
    try:
        send_mail(
            subject=f"You are invited to {invitation.organization.name} on Tailguard",
            message=(
                f"{inviter} invited you to join {invitation.organization.name} on Tailguard "
                f"as {invitation.role}.\n\nAccept the invitation: {link}\n\n"
                f"The link works once and expires at {invitation.expires_at:%Y-%m-%d %H:%M} UTC."
            ),
            from_email=None,
            recipient_list=[invitation.email],
        )
    except Exception:
        # Release the claim so a retry sends again.
        Invitation.objects.filter(id=invitation_id).update(sent_at=None)
        raise
    return True


def invitation_revoke(*, actor: User, invitation: Invitation) -> None:
    _require_role(_membership(actor, invitation.organization), Role.ADMIN, "revoke invitations")
    if invitation.accepted_at is not None:
        raise ValidationError("This invitation was already accepted.")
    with transaction.atomic():
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        compliance().audit(
            actor=actor, organization=invitation.organization, action="invitation.revoke", target=invitation
        )


def invitation_accept(*, user: User, secret: str) -> Membership:
    with transaction.atomic():
        # Found by its secret before its organization is known: a platform-wide lookup, then
        # everything else in the invitation's organization.
        with rls.platform_transaction():
            invitation = (
                Invitation.objects.select_for_update()
                .select_related("organization")
                .filter(token_hash=tokens.digest(secret or ""))
                .first()
            )
        if invitation is None:
            raise InvitationError("This invitation link is not valid. Check that you copied all of it.")
        if invitation.accepted_at is not None:
            raise InvitationError("This invitation has already been used.")
        if invitation.revoked_at is not None:
            raise InvitationError("This invitation was withdrawn. Ask for a new one.")
        if invitation.expires_at <= timezone.now():
            raise InvitationError(
                "This invitation has expired. Ask the person who invited you for a new one."
            )
        if invitation.email.lower() != user.email.lower():
            raise InvitationError(
                "This invitation was sent to another email address. Sign in with that address to accept it."
            )
        with rls.tenant_transaction(invitation.organization_id):
            membership, created = Membership.objects.get_or_create(
                organization=invitation.organization, user=user, defaults={"role": invitation.role}
            )
            invitation.accepted_at = timezone.now()
            invitation.accepted_by = user
            invitation.save(update_fields=["accepted_at", "accepted_by"])
            compliance().audit(
                actor=user,
                organization=invitation.organization,
                action="invitation.accept",
                target=invitation,
                data={"role": membership.role, "already_member": not created},
            )
    return membership


def invitations_expire(*, now: object = None) -> int:
    """Marks pending invitations past their expiry as revoked. Returns how many."""
    moment = timezone.now() if now is None else now
    return Invitation.objects.filter(
        accepted_at__isnull=True, revoked_at__isnull=True, expires_at__lte=moment
    ).update(revoked_at=moment)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    # The full secret; shown to the person once and never stored.
    secret: str

    def __repr__(self) -> str:
        return f"IssuedToken(token={self.token!r}, secret=<hidden>)"


def api_token_create(*, actor: User, organization: Organization, name: str) -> IssuedToken:
    membership = _require_role(_membership(actor, organization), Role.MEMBER, "create API tokens")
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "Name the token so you can recognise it later."})
    if len(name) > 100:
        raise ValidationError({"name": "Use at most 100 characters."})
    prefix, secret = tokens.new_api_token()
    with transaction.atomic():
        token = ApiToken.objects.create(
            organization=organization,
            created_by=actor,
            name=name,
            prefix=prefix,
            token_hash=tokens.digest(secret),
            membership=membership,
            # What the request acts with: a token cannot mint a token above its own cap.
            role=membership.acting_role or Role.VIEWER,
        )
        compliance().audit(
            actor=actor,
            organization=organization,
            action="api_token.create",
            target=token,
            data={"name": name, "prefix": prefix, "role": token.role},
        )
    return IssuedToken(token=token, secret=secret)


def api_token_revoke(*, actor: User, token: ApiToken) -> None:
    membership = _membership(actor, token.organization)
    if token.created_by_id != actor.pk:
        _require_role(membership, Role.ADMIN, "revoke other people's tokens")
    else:
        _require_role(membership, Role.MEMBER, "revoke API tokens")
    if token.revoked_at is not None:
        raise ValidationError("This token is already revoked.")
    with transaction.atomic():
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        compliance().audit(
            actor=actor,
            organization=token.organization,
            action="api_token.revoke",
            target=token,
            data={"prefix": token.prefix},
        )


def api_token_authenticate(*, secret: str) -> ApiToken:
    """The live token this secret signs, with its organization and creator, or TokenError.

    The token is found before its organization is known, so the lookup is platform-wide (by the
    secret's prefix, then checked against its hash) whatever the caller's tenant.
    """
    with rls.platform_transaction():
        return _api_token_authenticate(secret)


def _api_token_authenticate(secret: str) -> ApiToken:
    prefix = tokens.split_api_token(secret)
    token = (
        ApiToken.objects.select_related("organization", "created_by", "membership")
        .filter(prefix=prefix)
        .first()
        if prefix
        else None
    )
    if token is None or not tokens.matches(secret, token.token_hash):
        raise TokenError("Invalid API token.")
    if token.revoked_at is not None:
        raise TokenError("This API token has been revoked. Create a new one on the Tokens page.")
    if not token.created_by.is_active:
        raise TokenError("The user who created this API token is deactivated.")
    membership = token.membership
    if (
        membership is None
        or membership.user_id != token.created_by_id
        or membership.organization_id != token.organization_id
    ):
        raise TokenError("The user who created this API token is no longer a member of its organization.")
    now = timezone.now()
    # Throttled write: at most one last-used update a minute per token.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def membership_remove(*, actor: User, membership: Membership) -> int:
    """Removes a member from an organization (or the actor leaves it). Their API tokens for it are
    revoked in the same transaction and can never work again, not even if they are invited back.

    An admin may remove members up to their own role; anyone may leave; the last owner stays.
    Returns how many tokens were revoked."""
    organization = membership.organization
    if membership.user_id != actor.pk:
        actor_membership = _require_role(_membership(actor, organization), Role.ADMIN, "remove members")
        if ROLE_RANK[membership.role] > ROLE_RANK[actor_membership.role]:
            raise PermissionDenied(
                f"You cannot remove a member whose role ({membership.role}) is above yours "
                f"({actor_membership.role})."
            )
    else:
        _require_role(_membership(actor, organization), Role.VIEWER, "leave the organization")
    with transaction.atomic():
        # Locked, so two owners removing each other at once cannot leave the organization ownerless.
        owners = list(
            Membership.objects.select_for_update()
            .filter(organization=organization, role=Role.OWNER)
            .values_list("pk", flat=True)
        )
        if membership.role == Role.OWNER and owners == [membership.pk]:
            raise ValidationError(
                "An organization needs an owner: make someone else owner before this one leaves."
            )
        now = timezone.now()
        revoked = ApiToken.objects.filter(
            organization=organization, created_by_id=membership.user_id, revoked_at__isnull=True
        ).update(revoked_at=now)
        compliance().audit(
            actor=actor,
            organization=organization,
            action="membership.remove",
            target=membership.user,
            data={"email": membership.user.email, "role": membership.role, "tokens_revoked": revoked},
        )
        membership.delete()
    return revoked


def user_reauthenticate(*, user: User, password: str, code: str, request: HttpRequest | None) -> None:
    """Confirms, for a sensitive action, that the signed-in person is who the session says: their
    password (through the sign-in backend, so wrong guesses are throttled and audited like
    sign-ins) and, once they have an authenticator, a two-factor or recovery code.
    ValidationError names the field that was wrong; nothing is recorded as confirmed then."""
    confirmed = authenticate(request, username=user.email, password=password or "")
    if confirmed is None or confirmed.pk != user.pk:
        wait_s = getattr(request, RETRY_AFTER_ATTR, None)
        if wait_s is not None:
            raise ValidationError(
                {"password": f"Too many wrong passwords. Try again in {max(1, math.ceil(wait_s))} seconds."}
            )
        raise ValidationError({"password": "That password is not right."})
    if compliance().second_factor_confirmed(user=user):
        if not (code or "").strip():
            raise ValidationError({"code": "Enter the code from your authenticator (or a recovery code)."})
        if not compliance().second_factor_verify(user=user, code=code.strip()):
            raise ValidationError({"code": "That code is not right (or was already used). Try the next one."})
    with transaction.atomic():
        compliance().audit(actor=user, action="auth.reauthenticate", data={})
