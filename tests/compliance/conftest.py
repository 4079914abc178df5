"""Compliance fixtures: two regions ("us", "eu"), a private local store, and a real
S3-compatible server (moto's server mode) on loopback, started as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Helpers test_audit_anchor.py still imports from here (they live in tests/compliance/helpers.py).
from tests.compliance.helpers import s3_keys, two_factor_done  # noqa: F401


@pytest.fixture
def regions(settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A deployment with US and EU regions whose default is US only, on encrypted local folders."""
    settings.COMPLIANCE_REGIONS = ["us", "eu"]
    settings.COMPLIANCE_DEFAULT_REGIONS = ["us"]
    settings.COMPLIANCE_STORAGE_BACKEND = "local"
    settings.COMPLIANCE_STORAGE_DIR = tmp_path / "objects"
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    settings.TRAFFIC_WORKLOAD_DIR = tmp_path / "workloads"
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    return settings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's S3 server on a free loopback port; yields its endpoint URL."""
    try:
        import moto  # noqa: F401
    except ImportError:
        pytest.fail("moto[server] is not installed in this environment (see /work/notes/deps-compliance.txt)")
    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("moto server did not start")
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3_regions(regions, moto_server: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """US and EU buckets on the moto server, each created in its real AWS region."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    suffix = uuid.uuid4().hex[:8]
    buckets = {"us": f"tg-us-{suffix}", "eu": f"tg-eu-{suffix}"}
    names = {"us": "us-east-2", "eu": "eu-central-1"}
    for region, bucket in buckets.items():
        client = boto3.client("s3", region_name=names[region], endpoint_url=moto_server)
        client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": names[region]})
    regions.COMPLIANCE_STORAGE_BACKEND = "s3"
    regions.COMPLIANCE_S3_BUCKETS = buckets
    regions.COMPLIANCE_S3_REGION_NAMES = names
    regions.COMPLIANCE_S3_KMS_KEYS = {}
    regions.COMPLIANCE_S3_ENDPOINT_URL = moto_server
    return regions
