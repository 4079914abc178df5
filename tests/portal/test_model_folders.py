"""Model folders belong to one organization (issue 27 finding 5). Charlie tries to register
Alice's model folder (the same path, a folder inside it, one around it, a symlink to it, her
organization's own folder) and to learn from the errors which server paths exist."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from portal.accounts.models import Organization, User
from portal.catalog import model_folders
from portal.jobs import services
from portal.jobs.models import ServedModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(settings, tmp_path: Path, model_root: Path) -> Path:  # type: ignore[no-untyped-def]
    built_model = model_root / "llama-xs"
    root = tmp_path / "models"
    shutil.copytree(built_model, root / "shared" / "llama-xs")
    shutil.copytree(built_model, root / "orgs" / "acme-voice" / "llama-xs")
    (root / "orgs" / "acme-voice" / "broken").mkdir()
    settings.TUNING_MODEL_ROOTS = [root]
    return root


def _register(user: User, org: Organization, path: Path | str, name: str = "m") -> ServedModel:
    return services.served_model_register(actor=user, organization=org, name=name, path=str(path))


def _refusal(user: User, org: Organization, path: Path | str) -> str:
    with pytest.raises(ValidationError) as caught:
        _register(user, org, path)
    return caught.value.message_dict["path"][0]


def test_a_folder_registered_by_one_organization_is_refused_to_another(
    alice: User, alice_org: Organization, charlie: User, root: Path
) -> None:
    charlie_org = charlie.memberships.get().organization
    _register(alice, alice_org, root / "shared" / "llama-xs")
    (root / "shared" / "link").symlink_to(root / "shared" / "llama-xs")
    generic = model_folders.not_available(charlie_org)
    for attempt in (
        root / "shared" / "llama-xs",
        root / "shared" / "llama-xs" / ".",
        root / "shared" / "link",
        root / "shared",  # a folder around Alice's
        root / "orgs" / "acme-voice" / "llama-xs",  # Alice's organization's own folder
        root / "orgs" / "acme-voice" / "nothing-here",
    ):
        assert _refusal(charlie, charlie_org, attempt) == generic, attempt
    # A folder that does not exist, or is not a model, gets the very same sentence: the errors
    # tell Charlie nothing about what exists outside his own folder.
    (root / "shared" / "empty").mkdir()
    assert _refusal(charlie, charlie_org, root / "shared" / "missing") == generic
    assert _refusal(charlie, charlie_org, root / "shared" / "empty") == generic
    assert str(root / "orgs" / "other-corp") in generic and "acme-voice" not in generic
    assert not ServedModel.objects.filter(organization=charlie_org).exists()
    # Through the API too.
    api = APIClient()
    api.force_login(charlie)
    response = api.post(
        "/api/v1/models/", {"name": "x", "path": str(root / "shared" / "llama-xs")}, format="json"
    )
    assert response.status_code == 400 and response.json()["path"] == [generic]
    assert not ServedModel.objects.filter(organization=charlie_org).exists()


def test_an_organization_uses_its_own_folder_with_detailed_errors(
    alice: User, alice_org: Organization, root: Path
) -> None:
    own = root / "orgs" / alice_org.slug
    assert "config.json" in _refusal(
        alice, alice_org, own / "broken"
    ) and "not a model directory" in _refusal(alice, alice_org, own / "broken")
    model = _register(alice, alice_org, own / "llama-xs")
    assert model.architecture == "LlamaForCausalLM"
    # Twice in one organization is allowed (another name), as before.
    assert _register(alice, alice_org, own / "llama-xs", name="again").path == model.path
