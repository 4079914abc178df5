"""Users, organizations (tenants), memberships with roles, invitations and API tokens."""

from __future__ import annotations

import secrets
import uuid
from typing import ClassVar

from django.contrib.auth.models import AbstractUser, BaseUserManager
from django.db import models
from django.db.models.functions import Lower


class UserManager(BaseUserManager["User"]):
    use_in_migrations = True

    def _create(self, email: str, password: str | None, **extra: object) -> User:
        if not email:
            raise ValueError("email is required")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_user(self, email: str, password: str | None = None, **extra: object) -> User:
        extra.setdefault("is_staff", False)
        extra.setdefault("is_superuser", False)
        return self._create(email, password, **extra)

    def create_superuser(self, email: str, password: str | None = None, **extra: object) -> User:
        extra["is_staff"] = True
        extra["is_superuser"] = True
        extra.setdefault("staff_role", User.StaffRole.PLATFORM_ADMIN)
        return self._create(email, password, **extra)


class User(AbstractUser):
    """A person. Signs in with an email address; belongs to organizations through memberships."""

    class StaffRole(models.TextChoices):
        NONE = "", "None"
        # Sees every tenant's SLA, compliance records and audit trail.
        PLATFORM_ADMIN = "platform_admin", "Platform admin"
        # Builds benchmark reports for prospects.
        SALES_ENGINEER = "sales_engineer", "Sales engineer"

    username = None  # type: ignore[assignment]
    email = models.EmailField("email address", unique=True)
    full_name = models.CharField(max_length=200, blank=True)
    staff_role = models.CharField(max_length=32, choices=StaffRole.choices, blank=True, default="")

    USERNAME_FIELD = "email"
    REQUIRED_FIELDS: ClassVar[list[str]] = []

    objects: ClassVar[UserManager] = UserManager()  # type: ignore[assignment]  # email-based manager, not auth's UserManager

    class Meta:
        constraints: ClassVar = [models.UniqueConstraint(Lower("email"), name="user_email_ci_unique")]

    def __str__(self) -> str:
        return self.email


def new_prefix_salt() -> str:
    return secrets.token_hex(16)


class Organization(models.Model):
    """A tenant. Everything a customer owns hangs off one of these."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    # Keys the hashes of prompt blocks in this organization's traffic samples, so equal prompts
    # are recognisable within the organization and nowhere else.
    prefix_salt = models.CharField(max_length=64, default=new_prefix_salt, editable=False)

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    # Ordered from most to least privileged; see ROLE_RANK.
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


ROLE_RANK: dict[str, int] = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


class Membership(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["organization", "user"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"

    @property
    def acting_role(self) -> str | None:
        """The role this membership acts with now: its own, capped by an API token's role when
        the request is signed with one (None outside the token's organization)."""
        from portal.accounts.acting import effective_role

        return effective_role(organization_id=self.organization_id, role=self.role, user_id=self.user_id)

    def has_role(self, minimum: str) -> bool:
        acting = self.acting_role
        return acting is not None and ROLE_RANK[acting] >= ROLE_RANK[minimum]


class Invitation(models.Model):
    """An emailed, single-use link that adds its recipient to an organization with a role."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices)
    # sha256 of the secret in the link; the secret itself is only ever in the email.
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    # Set when the email with the link went out (the sending task claims the row with it).
    sent_at = models.DateTimeField(null=True, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.organization}"


class ApiToken(models.Model):
    """A bearer token scoped to one organization. Stored hashed; the secret is shown once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_tokens")
    created_by = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # Public, non-secret part of the token, shown in lists so people can tell tokens apart.
    prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    # The membership the token was made under. A token works only while that very membership
    # exists: removing the member ends it for good (a later re-invitation makes a new membership,
    # which none of the old tokens name).
    membership = models.ForeignKey(
        Membership, null=True, blank=True, on_delete=models.SET_NULL, related_name="api_tokens"
    )
    # The role the token acts with: never more than its creator had when it was made.
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
