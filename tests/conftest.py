"""Suite-wide fixtures and the rule for slow tests.

Tests marked `engine`, `browser` or `slow` are slow. On a developer machine they may be skipped
with `TAILGUARD_FAST=1`; under CI (`CI=true`) nothing is ever skipped that way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser import browser, page_factory  # noqa: F401 (the browser tests' fixtures, for every package)

REPO_ROOT = Path(__file__).resolve().parent.parent


def _own_redis_database(name: str, default: str) -> None:
    """Under pytest-xdist each worker process gets a Redis database of its own (the tests that
    use Redis flush it), counting down from the configured one in steps of two (the suite's two
    Redis URLs, 15 and 14 by default, never meet: gw0 gets 13 and 12, gw1 11 and 10)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    base, _, db = os.environ.get(name, default).rpartition("/")
    os.environ[name] = f"{base}/{(int(db or 0) - 2 * (1 + int(worker[2:]))) % 16}"


_own_redis_database("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
_own_redis_database("TAILGUARD_TEST_FAULTS_REDIS_URL", "redis://127.0.0.1:6379/14")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def traces_dir() -> Path:
    """The public traces vendored in the repository (`data/traces`, with their licences and
    attribution in TRACES.md), or TAILGUARD_TRACES_DIR."""
    configured = os.environ.get("TAILGUARD_TRACES_DIR")
    return Path(configured) if configured else REPO_ROOT / "data" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    path = traces_dir()
    if not path.is_dir():
        pytest.fail(f"shared traces not found at {path}; set TAILGUARD_TRACES_DIR")
    return path


# The markers of the tier between "fast" and "everything" (pyproject.toml describes each).
SLOW_MARKERS = ("engine", "browser", "slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _truthy("CI") or not _truthy("TAILGUARD_FAST"):
        return
    skip = pytest.mark.skip(reason="TAILGUARD_FAST=1 skips slow tests on a developer machine (never in CI)")
    for item in items:
        if any(marker in item.keywords for marker in SLOW_MARKERS):
            item.add_marker(skip)


# --- Personas -------------------------------------------------------------------------------
# alice: owner of "Acme Voice"; bob: viewer in Alice's organization; charlie: owner of another
# organization. Every endpoint gets an ownership test (Charlie) and a role test (Bob).

PASSWORD = "correct-horse-battery-staple"


@pytest.fixture(autouse=True)
def _eager_celery(request: pytest.FixtureRequest) -> None:
    """Unit tests run tasks in-process; the worker test uses a real worker instead."""
    if "django_db_setup" not in request.fixturenames and "settings" not in request.fixturenames:
        # Pure library tests do not touch Django at all.
        return
    settings = request.getfixturevalue("settings")
    settings.CELERY_TASK_ALWAYS_EAGER = True
    # Files a test writes stay in its own temporary folder (tests may override these again).
    tmp = request.getfixturevalue("tmp_path") / "var"
    for name in (
        "TRAFFIC_STAGING_DIR",
        "TRAFFIC_WORKLOAD_DIR",
        "TUNING_WORK_DIR",
        "ENDPOINTS_DIR",
        "COMPLIANCE_STORAGE_DIR",
    ):
        setattr(settings, name, tmp / name.lower())
    from portal.celery import app

    app.conf.task_always_eager = True


@pytest.fixture
def alice(db):  # type: ignore[no-untyped-def]
    from portal.accounts import services

    user = services.user_signup(email="alice@acme.test", password=PASSWORD, full_name="Alice")
    services.organization_create(actor=user, name="Acme Voice")
    return user


@pytest.fixture
def alice_org(alice):  # type: ignore[no-untyped-def]
    return alice.memberships.get().organization


@pytest.fixture
def bob(db, alice_org):  # type: ignore[no-untyped-def]
    from portal.accounts import services
    from portal.accounts.models import Membership, Role

    user = services.user_signup(email="bob@acme.test", password=PASSWORD, full_name="Bob")
    Membership.objects.create(organization=alice_org, user=user, role=Role.VIEWER)
    return user


@pytest.fixture
def charlie(db):  # type: ignore[no-untyped-def]
    from portal.accounts import services

    user = services.user_signup(email="charlie@other.test", password=PASSWORD, full_name="Charlie")
    services.organization_create(actor=user, name="Other Corp")
    return user


def _client_for(user):  # type: ignore[no-untyped-def]
    import time

    from django.test import Client

    from portal.accounts.reauth import SESSION_KEY as REAUTH_KEY

    client = Client()
    client.force_login(user)
    # force_login stands for a sign-in with the password, which counts as a fresh confirmation
    # for sensitive actions (tests/portal/test_reauth.py tries stale sessions).
    session = client.session
    session[REAUTH_KEY] = {"user": str(user.pk), "at": time.time()}
    session.save()
    return client


@pytest.fixture
def alice_client(alice):  # type: ignore[no-untyped-def]
    return _client_for(alice)


@pytest.fixture
def bob_client(bob):  # type: ignore[no-untyped-def]
    return _client_for(bob)


@pytest.fixture
def charlie_client(charlie):  # type: ignore[no-untyped-def]
    return _client_for(charlie)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    # Lets fixtures see whether the test failed (the browser fixture keeps screenshots then).
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
