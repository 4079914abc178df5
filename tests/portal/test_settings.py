"""Settings come from the environment, fail loudly on bad values, and pass the deploy check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.env import Env
from tests.conftest import REPO_ROOT
from tests.portal.settings_env import PRODUCTION_ENV, run_manage


def test_deploy_check_is_clean_with_documented_production_variables() -> None:
    result = run_manage(["check", "--deploy", "--fail-level", "WARNING"], PRODUCTION_ENV)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "System check identified no issues" in result.stdout
    assert "WARNINGS" not in result.stderr


def test_development_defaults_fail_the_deploy_check() -> None:
    # The embedded defaults are for a laptop; the deploy check must say so.
    result = run_manage(["check", "--deploy", "--fail-level", "WARNING"], {})
    assert result.returncode != 0
    assert "DEBUG" in result.stderr


def test_production_without_secret_key_refuses_to_start() -> None:
    env = dict(PRODUCTION_ENV)
    del env["SECRET_KEY"]
    result = run_manage(["check"], env)
    assert result.returncode != 0
    assert "SECRET_KEY is required" in result.stderr


def test_a_wsgi_server_gets_debug_off_unless_it_is_set() -> None:
    """gunicorn imports portal.wsgi first: without DEBUG it is production (and needs its key)."""
    probe = "import portal.wsgi; from django.conf import settings; print('DEBUG', settings.DEBUG)"
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_ENV}

    def load(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe],
            cwd=REPO_ROOT,
            env=env | extra,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    keyless = load({})
    assert keyless.returncode != 0 and "SECRET_KEY is required when DEBUG=false" in keyless.stderr
    assert "DEBUG False" in load({"SECRET_KEY": PRODUCTION_ENV["SECRET_KEY"]}).stdout
    assert "DEBUG True" in load({"DEBUG": "true"}).stdout  # a developer may still say so


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEBUG", "maybe", "DEBUG='maybe' is not a boolean"),
        ("EMAIL_PORT", "smtp", "EMAIL_PORT='smtp' is not an integer"),
        ("DATABASE_URL", "not a url", "DATABASE_URL is not a database URL"),
        ("LOG_LEVEL", "LOUD", "LOG_LEVEL='LOUD' must be one of"),
        ("ALLOWED_HOSTS", "a,,b", "ALLOWED_HOSTS='a,,b' has an empty item"),
        ("LOCAL_HARDWARE_REGION", "us east", "LOCAL_HARDWARE_REGION must be a residency code"),
        # The three redispatch beats became one: a removed interval is refused, not ignored.
        (
            "TUNING_REDISPATCH_INTERVAL_S",
            "5",
            "TUNING_REDISPATCH_INTERVAL_S is gone: set REDISPATCH_INTERVAL_S",
        ),
        (
            "ALERT_REDISPATCH_INTERVAL_S",
            "5",
            "ALERT_REDISPATCH_INTERVAL_S is gone: set REDISPATCH_INTERVAL_S",
        ),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str, message: str) -> None:
    result = run_manage(["check"], {name: value})
    assert result.returncode != 0
    assert message in result.stderr


def test_env_reader_parses_and_rejects() -> None:
    env = Env({"A": " true ", "B": "0", "N": "42", "L": "x, y", "C": "beta"})
    assert env.bool("A", default=False) is True
    assert env.bool("B", default=True) is False
    assert env.bool("MISSING", default=True) is True
    assert env.int("N", 1, minimum=1) == 42
    assert env.list("L", []) == ["x", "y"]
    assert env.choice("C", "alpha", ["alpha", "beta"]) == "beta"
    with pytest.raises(ImproperlyConfigured, match="N=42 must be at least 100"):
        env.int("N", 1, minimum=100)
    with pytest.raises(ImproperlyConfigured, match="environment variable Z is required"):
        env.required_str("Z")
