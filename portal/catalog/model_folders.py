"""Which model folders an organization may register (issue 27 finding 5).

Models live under the serving hosts' model roots (TUNING_MODEL_ROOTS). Inside them:

- `<root>/orgs/<organization slug>/` is that organization's own folder: only it may register
  models there (operators copy a customer's checkpoints into it);
- anywhere else under a root, a folder belongs to the first organization that registers it: no
  other organization may register the same folder, a folder inside it, or one that contains it
  (a symlink counts as the folder it points to: paths are resolved first).

Errors never tell one organization what exists outside its own folder: a missing folder, a
folder that is not a model and a folder another organization holds all get the same sentence.
Inside its own folder an organization gets the loader's detailed reason.

Two registrations of one folder at the same moment are serialised by a transaction-level
advisory lock on the folder's path, so the check-then-create cannot be raced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection

from portal.accounts.models import Organization

ORG_FOLDERS = "orgs"


def roots() -> list[Path]:
    return [Path(r).expanduser().resolve() for r in settings.TUNING_MODEL_ROOTS]


def own_folders(organization: Organization) -> list[Path]:
    """The organization's own folder under every model root (they need not exist yet)."""
    return [root / ORG_FOLDERS / organization.slug for root in roots()]


def not_available(organization: Organization) -> str:
    own = ", ".join(str(p) for p in own_folders(organization))
    return (
        "No model this organization may register at that path: a model folder holds config.json, "
        "a tokenizer and weights, and no other organization has registered it. "
        f"This organization's own model folder: {own}."
    )


@dataclass(frozen=True)
class Place:
    path: Path  # resolved
    own: bool  # inside the organization's own folder: detailed errors are safe to show


def model_folder_place(*, organization: Organization, path: str) -> Place:
    """The resolved folder, if it lies under a model root and is not another organization's
    own folder; else ValidationError on `path` (nothing is read from the disk before this)."""
    resolved = Path(path or "").expanduser().resolve()
    model_roots = roots()
    root = next((r for r in model_roots if resolved.is_relative_to(r)), None)
    if root is None:
        raise ValidationError(
            {
                "path": "Models must live under one of the serving host's model folders: "
                + ", ".join(str(r) for r in model_roots)
            }
        )
    org_area = root / ORG_FOLDERS
    if resolved.is_relative_to(org_area):
        own = root / ORG_FOLDERS / organization.slug
        if not resolved.is_relative_to(own):
            raise ValidationError({"path": not_available(organization)})
        return Place(resolved, own=True)
    return Place(resolved, own=False)


def model_folder_claim(
    *, organization: Organization, place: Place, registered_elsewhere: Callable[[], Iterable[str]]
) -> None:
    """Inside the registering transaction: refuses a folder another organization registered (the
    same one, one inside it or one around it). `registered_elsewhere` gives the folders other
    organizations registered; it is read under the folder's lock, which lasts the transaction."""
    if place.own:
        return
    if connection.vendor == "postgresql":
        key = int.from_bytes(hashlib.sha256(str(place.path).encode()).digest()[:8], "big", signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
    for other in registered_elsewhere():
        theirs = Path(other)
        if place.path == theirs or place.path.is_relative_to(theirs) or theirs.is_relative_to(place.path):
            raise ValidationError({"path": not_available(organization)})
