"""Drift: quiet on two halves of stationary traffic, loud (and specific) on a real change."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from tests.tuning.workload_factories import ingest_lines, mooncake_trace
from tuning.workload import WorkloadProfile, drift_report, ingest


def halves(lines: list[str]) -> tuple[WorkloadProfile, WorkloadProfile]:
    middle = len(lines) // 2
    return ingest_lines(lines[:middle]).profile, ingest_lines(lines[middle:]).profile


def test_false_alarms_on_halves_of_stationary_traffic_are_rare() -> None:
    alarms = []
    for seed in range(30):
        old, new = halves(mooncake_trace(np.random.default_rng(seed), n=2000))
        report = drift_report(old, new)
        if report.drifted:
            alarms.append((seed, report.summary))
    assert len(alarms) <= 1, alarms


def test_halves_of_the_public_azure_trace_do_not_alarm(azure_path: Path) -> None:
    header, *body = azure_path.read_bytes().splitlines()
    middle = len(body) // 2
    old = ingest(io.BytesIO(b"\n".join([header, *body[:middle]]))).profile
    new = ingest(io.BytesIO(b"\n".join([header, *body[middle:]]))).profile
    report = drift_report(old, new)
    assert not report.drifted, report.summary


def test_longer_prompts_are_flagged_with_a_readable_sentence() -> None:
    rng = np.random.default_rng(1)
    old = ingest_lines(mooncake_trace(rng)).profile
    new = ingest_lines(mooncake_trace(rng, input_scale=3.5)).profile
    report = drift_report(old, new)
    assert report.drifted
    flagged = {d.dimension for d in report.dimensions if d.drifted}
    assert "input_tokens" in flagged
    assert "output_tokens" not in flagged and "arrival_rate" not in flagged
    dimension = next(d for d in report.dimensions if d.dimension == "input_tokens")
    assert " input length rose from " in dimension.explanation
    assert dimension.explanation in report.summary
    assert dimension.divergence is not None and dimension.divergence > dimension.threshold


def test_a_doubled_rate_is_flagged() -> None:
    rng = np.random.default_rng(2)
    old = ingest_lines(mooncake_trace(rng, rate_rps=4.0)).profile
    new = ingest_lines(mooncake_trace(rng, rate_rps=8.0)).profile
    report = drift_report(old, new)
    flagged = {d.dimension for d in report.dimensions if d.drifted}
    assert flagged == {"arrival_rate"}, report.summary
    assert report.summary.startswith("mean arrival rate rose from 4")


def test_burstier_traffic_is_flagged() -> None:
    rng = np.random.default_rng(3)
    old = ingest_lines(mooncake_trace(rng, n=3000)).profile
    new = ingest_lines(mooncake_trace(rng, n=3000, gap_shape=0.15)).profile
    report = drift_report(old, new)
    flagged = {d.dimension for d in report.dimensions if d.drifted}
    assert "burstiness" in flagged, report.summary
    assert "input_tokens" not in flagged
    assert "burstier traffic" in report.summary


def test_lost_prefix_sharing_is_flagged() -> None:
    rng = np.random.default_rng(4)
    old = ingest_lines(mooncake_trace(rng, shared_prefixes=5)).profile
    new = ingest_lines(mooncake_trace(rng, shared_prefixes=0)).profile
    report = drift_report(old, new)
    flagged = {d.dimension for d in report.dimensions if d.drifted}
    assert flagged == {"prefix_reuse"}, report.summary
    assert "prefix reuse fell from" in report.summary


def test_identical_profiles_and_a_json_round_trip() -> None:
    profile = ingest_lines(mooncake_trace(np.random.default_rng(5))).profile
    again = WorkloadProfile.from_json_dict(json.loads(json.dumps(profile.to_json_dict())))
    assert again == profile
    report = drift_report(profile, again)
    assert not report.drifted
    assert report.summary.startswith("no drift")
    assert all(d.divergence in (0.0, None) for d in report.dimensions)
    json.dumps(report.to_json_dict())


def test_prefix_dimension_is_skipped_without_prefix_information(azure_path: Path) -> None:
    azure = ingest(io.BytesIO(azure_path.read_bytes())).profile
    mooncake = ingest_lines(mooncake_trace(np.random.default_rng(6))).profile
    prefix = next(d for d in drift_report(azure, mooncake).dimensions if d.dimension == "prefix_reuse")
    assert prefix.divergence is None and not prefix.drifted
    assert "no prefix information" in prefix.explanation


@pytest.mark.parametrize("seed", [7, 8])
def test_small_samples_do_not_alarm_on_noise(seed: int) -> None:
    old, new = halves(mooncake_trace(np.random.default_rng(seed), n=120))
    assert not drift_report(old, new).drifted
