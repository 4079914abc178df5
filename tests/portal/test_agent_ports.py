"""An endpoint's port comes from the engine host that serves it: deploying picks none on the web
side; the start, run by the host's agent, has the runner pick one there (never the address of
another endpoint of that host) and records what it reports, with the address clients use. No
engine starts: the supervisor's command is echoed instead of run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.accounts.models import User
from portal.endpoints import selectors, services
from portal.endpoints.models import Endpoint
from portal.outbox.models import OutboxMessage
from portal.pools import services as pool_services
from portal.pools.models import Host
from portal.pools.selectors import AGENT_HOST_ENV
from serving.runner import supervisor
from serving.runner.supervisor import LocalSupervisorRunner
from tests.factories import deployed_endpoint, finished_job


def test_the_web_side_picks_no_port_and_the_hosts_start_picks_and_reports_one(
    alice,
    alice_org,
    alice_client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks,
) -> None:  # type: ignore[no-untyped-def]
    ops = User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)
    pool = pool_services.pool_create(
        actor=ops,
        name="cpu-ports",
        region="local",
        accelerator="local-cpu",
        endpoint_url_template="http://10.0.0.5:{port}",
    )
    host = Host.objects.create(
        pool=pool, name="engine-a", state=Host.State.ACTIVE, last_heartbeat_at=timezone.now()
    )
    job = finished_job(alice_org, alice, tmp_path, winner=True)
    job.pool, job.spec = pool, {**job.spec, "hardware": "local-cpu"}
    job.save(update_fields=["pool", "spec"])
    echo = shutil.which("echo")
    assert echo is not None
    monkeypatch.setattr(
        services, "runner_for", lambda endpoint: LocalSupervisorRunner(tmp_path / "endpoints", python=echo)
    )
    with django_capture_on_commit_callbacks(execute=False) as sent:
        endpoint, _key = services.endpoint_deploy(actor=alice, job=job)
    # The start is recorded in the task outbox for the pool's queue; it goes out after the commit.
    (message,) = OutboxMessage.objects.filter(task="portal.endpoints.tasks.endpoint_start")
    assert message.kwargs == {"endpoint_id": str(endpoint.id), "pool": "cpu-ports"}
    assert message.status == OutboxMessage.Status.PENDING and sent
    row = Endpoint.objects.get(pk=endpoint.pk)
    # Nothing picked here: the address waits for the host's port.
    assert row.port is None and row.base_url == "" and selectors.endpoint_base_url(row) == ""
    listing = alice_client.get(reverse("endpoints:list")).content.decode()
    assert "address pending" in listing and "port None" not in listing
    # Another endpoint of that host still holds its address; the host's picks are 41001 (taken
    # by it), then 41002.
    deployed_endpoint(alice_org, alice, port=41001, pool=pool, host=host, status=Endpoint.Status.STOPPED)
    picks: Iterator[int] = iter([41001, 41002])
    monkeypatch.setattr(supervisor, "free_port", lambda address="127.0.0.1": next(picks))
    # What the agent of engine-a does with the start.
    monkeypatch.setenv(AGENT_HOST_ENV, str(host.id))
    assert services.endpoint_start(endpoint_id=str(endpoint.id)) == "started"
    row.refresh_from_db()
    assert row.host == host and row.port == 41002 == row.runner_handle["port"]
    assert row.base_url == "http://10.0.0.5:41002"
    assert selectors.endpoint_base_url(row) == "http://10.0.0.5:41002/v1"
