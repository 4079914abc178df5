"""Fixtures of the portal's tests.

The personas (`alice`, `bob`, `charlie` and their clients) and the browser are suite-wide
(tests/conftest.py); rows are built by tests/factories.py and real workers run through
tests/workers.py. What is here is what several portal modules need and nothing outside them; the benchmark
reports' servers and people are in tests/portal/benchmarks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories import build_model_dir

# The benchmark reports' fixtures (local OpenAI-compatible servers, the sales engineer, a sample).
from tests.portal.benchmarks import bench_settings, bench_tokenizer, sam, sam_client, sample, serve  # noqa: F401
from tests.portal.billing import billing, stripe_fake  # noqa: F401 (the Stripe stand-in's fixtures)

# A deployed endpoint's rows for the continual loop's tests (its model_root is the requesting module's).
from tests.portal.loop import deployed  # noqa: F401

# Alice's world of one object of every tenant kind (the isolation sweep, safe methods, API fuzz).
from tests.portal.sweep import world  # noqa: F401
from tests.workers import require_postgres


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `llama-xs` (random weights, local tokenizer), built once per run. Tests
    only read it; a module that needs its own copy defines its own `model_root`."""
    root = tmp_path_factory.mktemp("models")
    build_model_dir(root)
    return root


@pytest.fixture
def postgres() -> None:
    """Skips where the test database is not PostgreSQL (a worker process cannot share it)."""
    require_postgres()
