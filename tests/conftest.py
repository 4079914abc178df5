"""Suite-wide fixtures and the rule for slow tests.

Tests marked `engine` or `browser` are slow. On a developer machine they may be skipped with
`TAILGUARD_FAST=1`; under CI (`CI=true`) nothing is ever skipped that way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def traces_dir() -> Path:
    """The public traces shipped beside the checkout (`../shared/traces`), or TAILGUARD_TRACES_DIR."""
    configured = os.environ.get("TAILGUARD_TRACES_DIR")
    return Path(configured) if configured else REPO_ROOT.parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    path = traces_dir()
    if not path.is_dir():
        pytest.fail(f"shared traces not found at {path}; set TAILGUARD_TRACES_DIR")
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _truthy("CI") or not _truthy("TAILGUARD_FAST"):
        return
    skip = pytest.mark.skip(reason="TAILGUARD_FAST=1 skips slow tests on a developer machine (never in CI)")
    for item in items:
        if "engine" in item.keywords or "browser" in item.keywords:
            item.add_marker(skip)
