"""benchmarks/security_probe.py against the test server: every attack of issue 27 it tries is
refused, nothing of the owner's reaches the outsider, and nothing answers 5xx. (The recorded
result in benchmarks/results/ comes from a run against a live portal, not from this test.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.django_db(transaction=True)
def test_the_probe_finds_no_leak_no_server_error_and_nothing_unrefused(  # type: ignore[no-untyped-def]
    live_server, settings, tmp_path: Path
) -> None:
    from benchmarks import security_probe

    settings.TUNING_MODEL_ROOTS = [tmp_path / "models"]
    # Small allowances, so that a few failed sign-ins already engage the throttle (each costs a
    # password hash): the owner's correct password must still get through within the cap.
    settings.LOGIN_THROTTLE_ADDRESS_FAILURES = 3
    settings.LOGIN_THROTTLE_FAILURES = 2
    out = tmp_path / "security_probe.json"
    status = security_probe.main(
        ["--base-url", live_server.url, "--results", str(out), "--lockout-attempts", "5"]
    )
    result = json.loads(out.read_text())
    summary = result["summary"]
    failures = [c for c in result["cases"] if not c["refused"] or c["leaked"] or c["server_error"]]
    assert (summary["leaks"], summary["server_errors"], summary["unrefused"]) == (0, 0, 0), failures
    assert status == 0
    assert summary["attacks"] >= 40
    assert set(summary["categories"]) >= {
        "lockout",
        "unbounded_work",
        "model_folders",
        "token_scope",
        "cross_tenant",
        "csrf",
        "state_on_get",
        "headers",
        "bad_input",
    }
    assert all(key in result for key in ("machine", "date", "commit", "dirty", "versions", "command"))
