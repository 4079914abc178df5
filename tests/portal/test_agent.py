"""The engine-host agent as a real second Celery worker process, on its pool's own queue.

Real Redis (the test database TAILGUARD_TEST_REDIS_URL) and the real PostgreSQL test database:
a job on a pool with no live host waits, visibly, in that pool's queue (not the default one);
the agent started with `tailguard agent --pool NAME` registers its host with its facts, takes the
step from the pool's queue and runs it; a host whose hardware contradicts its pool is
quarantined and takes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from portal.accounts.models import User
from portal.jobs import services as job_services
from portal.jobs.models import TuningJob, trial_key_prefix
from portal.outbox.models import OutboxMessage
from portal.pools import selectors as pool_selectors
from portal.pools import services
from portal.pools.models import Host
from tests.conftest import REPO_ROOT
from tests.factories import LOOSE_SLO, ready_sample

pytestmark = [pytest.mark.celery_worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
WAIT_S = 120  # an upper bound on each awaited event (polled), never a sleep the test relies on


def _database_url() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def broker(settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """This test's Redis database, empty; `_send_through(broker)` switches the portal onto it."""
    import redis

    if connection.vendor != "postgresql":
        pytest.skip("the agent shares the test database only on PostgreSQL")
    url = os.environ.get("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Redis at {url}: {exc}")
        pytest.skip(f"Redis not reachable at {url}")
    client.flushdb()
    from portal.celery import app

    try:
        yield url
    finally:
        app.conf.update(task_always_eager=True)
        client.flushdb()


def _send_through(broker: str, settings) -> None:  # type: ignore[no-untyped-def]
    from portal.celery import app

    app.conf.update(task_always_eager=False, broker_url=broker)
    # Drop connections made to the embedded broker earlier in this process.
    app._pool = None
    app.amqp._producer_pool = None
    settings.CELERY_TASK_ALWAYS_EAGER = False


def _agent(  # type: ignore[no-untyped-def]
    pool: str, name: str, broker: str, tmp_path: Path, settings, host: _NetnsHost | None = None, **extra: str
) -> subprocess.Popen[str]:
    env = dict(os.environ, **extra)
    # Each agent is its own engine host: its own measuring lock (serving.engine.host.lock_path).
    env["TAILGUARD_HOST_LOCK"] = str(tmp_path / f"{name}.lock")
    database, broker_url = _database_url(), broker
    if host is not None:
        # From its own network namespace the host reaches PostgreSQL and Redis over the veth.
        database = database.replace("127.0.0.1", host.gateway).replace("localhost", host.gateway)
        broker_url = broker.replace("127.0.0.1", host.gateway).replace("localhost", host.gateway)
    env.update(
        DATABASE_URL=database,
        CELERY_BROKER_URL=broker_url,
        CELERY_TASK_ALWAYS_EAGER="false",
        AGENT_HEARTBEAT_S="1",
        TUNING_WORK_DIR=str(settings.TUNING_WORK_DIR),
        TRAFFIC_WORKLOAD_DIR=str(settings.TRAFFIC_WORKLOAD_DIR),
        ENDPOINTS_DIR=str(tmp_path / f"endpoints-{name}"),
        TUNING_MODEL_ROOTS=str(settings.TUNING_MODEL_ROOTS[0]),
    )
    command = [sys.executable, "-m", "tailguard.cli", "agent", "--pool", pool, "--name", name]
    if host is not None:
        command = ["ip", "netns", "exec", host.namespace, *command]  # execs: the same pid
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


class _Relay(threading.Thread):
    """A TCP relay on the veth's host side to a service on this machine's loopback (PostgreSQL
    and Redis listen there only); it counts the connections it carried."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.server = socket.create_server(listen)
        self.target, self.connections = target, 0

    def run(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            self.connections += 1
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


@dataclass
class _NetnsHost:
    namespace: str
    gateway: str  # the root namespace's end of the veth
    address: str  # the host's own end: how other machines reach it
    relays: list[_Relay]


@contextlib.contextmanager
def _netns_host(label: str) -> Iterator[_NetnsHost | None]:
    """A second host on this machine: a network namespace joined to this one by a veth pair,
    with PostgreSQL and Redis relayed onto the veth. None where namespaces cannot be made (not
    root, no `ip`): the agent then runs as a plain second process."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield None
        return
    tag = f"{os.getpid() % 100000}"
    namespace, outer, inner = f"tg{label}{tag}", f"tgo{tag}", f"tgi{tag}"
    subnet = f"10.231.{os.getpid() % 250}"
    gateway, address = f"{subnet}.1", f"{subnet}.2"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    relays: list[_Relay] = []
    try:
        ip("netns", "add", namespace)
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", namespace)
        ip("addr", "add", f"{gateway}/30", "dev", outer)
        ip("link", "set", outer, "up")
        ip("netns", "exec", namespace, "ip", "addr", "add", f"{address}/30", "dev", inner)
        ip("netns", "exec", namespace, "ip", "link", "set", inner, "up")
        ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        for port in (5432, 6379):
            relay = _Relay((gateway, port), ("127.0.0.1", port))
            relay.start()
            relays.append(relay)
    except (subprocess.CalledProcessError, OSError):
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            ip("netns", "del", namespace)
        yield None
        return
    try:
        yield _NetnsHost(namespace=namespace, gateway=gateway, address=address, relays=relays)
    finally:
        for relay in relays:
            relay.close()
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            ip("netns", "del", namespace)  # the veth pair goes with it
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            ip("link", "del", outer)


def _stop(process: subprocess.Popen[str]) -> str:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output


def _await(condition, process: subprocess.Popen[str], what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"{what} did not happen; agent said:\n{_stop(process)[-4000:]}")


def test_a_pool_job_waits_visibly_is_taken_by_an_agent_and_rerun_elsewhere_when_its_host_dies(
    alice, alice_org, broker, settings, tmp_path, shared_traces, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    import redis

    pool, sample, model = _pool_job(
        alice, alice_org, settings, tmp_path, shared_traces, django_capture_on_commit_callbacks, "cpu-a"
    )
    _send_through(broker, settings)
    with django_capture_on_commit_callbacks(execute=True):
        job = job_services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="",
            traffic_sample=sample,
            served_model=model,
            slo=LOOSE_SLO,
            peak_rps=1.0,
            pool=pool.name,
        )
    job.refresh_from_db()
    # No host of the pool: never silent. The step waits in the pool's queue, not the default one.
    assert job.dispatch == TuningJob.Dispatch.PENDING and not job.awaits_broker
    assert job.phase.startswith("waiting for a host of pool cpu-a"), job.phase
    queues = redis.Redis.from_url(broker, socket_timeout=5)
    assert queues.llen("pool.cpu-a") == 1
    assert queues.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0
    # Engine host A is busy with another measurement (its host lock is held): its agent takes
    # the step, plans the job and waits for the host, visibly, without starting an engine.
    lock = os.open(tmp_path / "engine-a.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.write(lock, b"another measurement on engine-a")
    agent_a = _agent("cpu-a", "engine-a", broker, tmp_path, settings)
    agent_b = None
    second_host = contextlib.ExitStack()
    try:
        _await(
            lambda: Host.objects.filter(name="engine-a", state=Host.State.ACTIVE).exists(),
            agent_a,
            "host registration",
        )
        host_a = Host.objects.get(name="engine-a")
        assert host_a.facts["cpu_model"] and host_a.facts["num_cpus"] >= 1
        assert "gpus" in host_a.facts and "engine_command" in host_a.facts
        _await(
            lambda: "on host engine-a: waiting for the engine host" in TuningJob.objects.get(pk=job.pk).phase,
            agent_a,
            "the agent running the job's step on its host",
        )
        assert queues.llen("pool.cpu-a") == 0
        host_a.refresh_from_db()
        assert str(job.id) in host_a.current_task  # what runs on it, for the admin page
        # While its measuring worker waits, the host's own queue still moves: an endpoint
        # recorded on host A gets its watch round there (a gap: nothing serves it in this test).
        from portal.endpoints import services as endpoint_services
        from portal.endpoints.models import Endpoint, MetricSnapshot

        served = Endpoint.objects.create(
            organization=alice_org,
            name="on-a",
            served_model=model,
            job=job,
            pool=pool,
            host=host_a,
            config={},
            port=1,
            api_key_prefix="x",
            api_key_hash="y",
            status=Endpoint.Status.HEALTHY,
        )
        endpoint_services.endpoints_watch()
        _await(
            lambda: MetricSnapshot.objects.filter(endpoint=served, gap=True).exists(),
            agent_a,
            "the watch on A",
        )
        Endpoint.objects.filter(pk=served.pk).update(status=Endpoint.Status.STOPPED)
        # Host A dies mid-step (kill -9 of its agent): its lease runs out (here: time moved on),
        # the beat's redispatch sends the step to the pool's queue again, and host B takes it.
        os.killpg(agent_a.pid, signal.SIGKILL)
        agent_a.communicate(timeout=60)
        later = timezone.now() + timedelta(seconds=settings.TUNING_LEASE_S + 1)
        assert job_services.tuning_jobs_redispatch(now=later)["died"] == 1
        assert queues.llen("pool.cpu-a") == 1
        # Cancelled while it waits, so host B's step plans the job and ends it, engine-free.
        # Host B is another host: its own network namespace, reaching the database and the
        # broker over a veth pair (where namespaces can be made; a plain process otherwise).
        TuningJob.objects.filter(pk=job.pk).update(cancel_requested=True)
        netns = second_host.enter_context(_netns_host("b"))
        agent_b = _agent("cpu-a", "engine-b", broker, tmp_path, settings, host=netns)
        _await(
            lambda: TuningJob.objects.filter(pk=job.pk, status=TuningJob.Status.CANCELLED).exists(),
            agent_b,
            "host B re-running the step",
        )
        # The host records the task as done once the task returns (after the job's last write).
        _await(
            lambda: Host.objects.filter(
                name="engine-b", tasks_done=1, last_task__contains=str(job.id)
            ).exists(),
            agent_b,
            "host B recording the step it ran",
        )
        host_b = Host.objects.get(name="engine-b")
        assert TuningJob.objects.get(pk=job.pk).interruptions == 1
        # Host A never said goodbye: it turns silent once its heartbeats are older than the limit.
        host_a.refresh_from_db()
        assert host_a.state == Host.State.ACTIVE and host_a.tasks_done == 0
        silent_at = timezone.now() + timedelta(seconds=settings.POOL_HOST_LIVE_S + 1)
        assert pool_selectors.host_health(host_a, now=silent_at) == "silent"
        first_beat = host_b.last_heartbeat_at
        _await(
            lambda: Host.objects.filter(pk=host_b.pk, last_heartbeat_at__gt=first_beat).exists(),
            agent_b,
            "a heartbeat",
        )
        if netns is not None:
            # Everything host B did went over the veth: PostgreSQL and Redis through the relays.
            assert all(relay.connections > 0 for relay in netns.relays)
    finally:
        os.close(lock)
        if agent_a.poll() is None:
            _stop(agent_a)
        output = _stop(agent_b) if agent_b is not None else ""
        second_host.close()
    assert "tuning_job_step" in output
    assert Host.objects.get(name="engine-b").state == Host.State.STOPPED


def test_an_agent_whose_hardware_contradicts_its_pool_is_quarantined(broker, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tuning.search.job import HARDWARE

    settings.TUNING_MODEL_ROOTS = [tmp_path]
    gpu = next((name for name, t in HARDWARE.items() if t.device_kind == "gpu"), None)
    if gpu is None:
        pytest.skip("no GPU hardware target in the tuning registry")
    from serving.runner.hostfacts import gpu_facts

    if gpu_facts()[0]:
        pytest.skip("this machine has GPUs: the contradiction is made on a CPU-only host")
    ops = User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)
    services.pool_create(actor=ops, name="gpu-pool", region="local", accelerator=gpu, devices_per_host=8)
    agent = _agent("gpu-pool", "cpu-box", broker, tmp_path, settings)
    try:
        output = agent.communicate(timeout=WAIT_S)[0]
    except subprocess.TimeoutExpired:
        pytest.fail("a quarantined agent kept running:\n" + _stop(agent)[-4000:])
    assert agent.returncode == 3, output
    host = Host.objects.get(name="cpu-box")
    assert host.state == Host.State.QUARANTINED
    assert "reports no GPU" in host.quarantine_reason and "quarantined" in output


@pytest.mark.engine
def test_an_endpoint_is_started_served_and_stopped_by_its_hosts_agent(
    alice, alice_org, broker, settings, tmp_path, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    """Deploy on a pool: the pool's agent starts the supervisor (the test process, standing in
    for web and workers, holds no engine), the endpoint answers at the pool's configured public
    address (the host's end of a veth when it runs in its own network namespace, the router
    listening on every address there), the watch scrapes it on its host, and the stop runs there
    in the background."""
    import openai

    from portal.endpoints import services as endpoint_services
    from portal.endpoints.models import Endpoint
    from serving.models.tiny import build_tiny_model
    from serving.runner.supervisor import process_alive
    from tests.factories import finished_job

    build_tiny_model(arch="llama", size="xs", out_dir=tmp_path / "models" / "llama-xs", seed=0)
    settings.TUNING_MODEL_ROOTS = [tmp_path / "models"]
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    settings.TRAFFIC_WORKLOAD_DIR = tmp_path / "workloads"
    ops = User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)
    second_host = contextlib.ExitStack()
    agent: subprocess.Popen[str] | None = None
    endpoint = None
    try:
        # The engine host is another host (its own network namespace, where one can be made):
        # its public address is its end of the veth; otherwise a loopback alias, not 127.0.0.1.
        netns = second_host.enter_context(_netns_host("e"))
        public = netns.address if netns is not None else "127.0.0.2"
        pool = services.pool_create(
            actor=ops,
            name="cpu-serve",
            region="local",
            accelerator="local-cpu",
            bind_address="0.0.0.0",  # noqa: S104 (the router listens where clients reach it)
            endpoint_url_template=f"http://{public}:{{port}}",
        )
        job = finished_job(alice_org, alice, tmp_path / "models", winner=True)
        TuningJob.objects.filter(pk=job.pk).update(pool=pool, spec={"hardware": "local-cpu"})
        job.refresh_from_db()
        _send_through(broker, settings)
        agent = _agent("cpu-serve", "engine-b", broker, tmp_path, settings, host=netns)
        _await(
            lambda: Host.objects.filter(name="engine-b", state=Host.State.ACTIVE).exists(),
            agent,
            "registration",
        )
        with django_capture_on_commit_callbacks(execute=True):
            endpoint, api_key = endpoint_services.endpoint_deploy(actor=alice, job=job)

        def healthy() -> bool:
            # What the beat does every 15 s: the endpoint's round goes to its host's queue.
            endpoint_services.endpoints_watch()
            return Endpoint.objects.filter(pk=endpoint.pk, status=Endpoint.Status.HEALTHY).exists()

        deadline = time.monotonic() + 600
        while not healthy():
            row = Endpoint.objects.get(pk=endpoint.pk)
            assert row.status != Endpoint.Status.FAILED, row.status_detail
            assert time.monotonic() < deadline and agent.poll() is None, (row.status, row.status_detail)
            time.sleep(2)
        endpoint.refresh_from_db()
        assert endpoint.host.name == "engine-b" and endpoint.runner_handle["kind"] == "local"
        # The port the agent picked there, reported back: the address clients use carries it.
        assert endpoint.port == endpoint.runner_handle["port"]
        assert endpoint.base_url == f"http://{public}:{endpoint.port}"
        supervisor = int(endpoint.runner_handle["pid"])
        parent = int(Path(f"/proc/{supervisor}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent != os.getpid()  # started by the agent, not by this (web/worker) process
        answer = openai.OpenAI(
            base_url=f"{endpoint.base_url}/v1", api_key=api_key, timeout=60
        ).completions.create(model="llama-xs", prompt="hello there", max_tokens=4)  # its short name
        assert answer.usage.completion_tokens == 4
        with django_capture_on_commit_callbacks(execute=True):
            endpoint_services.endpoint_stop(actor=alice, endpoint=endpoint)
        assert Endpoint.objects.get(pk=endpoint.pk).status == Endpoint.Status.STOPPING
        _await(
            lambda: Endpoint.objects.filter(pk=endpoint.pk, status=Endpoint.Status.STOPPED).exists(),
            agent,
            "the stop on the endpoint's host",
        )
        assert not process_alive(supervisor)
    finally:
        output = _stop(agent) if agent is not None else ""
        if endpoint is not None:
            endpoint.refresh_from_db()
            pid = (endpoint.runner_handle or {}).get("pid")
            if pid and process_alive(int(pid)):
                os.killpg(int(pid), signal.SIGKILL)
        second_host.close()
    assert "endpoint_start" in output and "endpoint_stop" in output


def _pool_job(alice, alice_org, settings, tmp_path, shared_traces, capture, pool: str):  # type: ignore[no-untyped-def]
    """A ready sample, the tiny model and a pool of that name: what a pool's job needs."""
    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    settings.TRAFFIC_WORKLOAD_DIR = tmp_path / "workloads"
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    from serving.models.tiny import build_tiny_model

    build_tiny_model(arch="llama", size="xs", out_dir=tmp_path / "models" / "llama-xs", seed=0)
    settings.TUNING_MODEL_ROOTS = [tmp_path / "models"]
    ops = User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)
    made = services.pool_create(actor=ops, name=pool, region="local", accelerator="local-cpu")
    sample = ready_sample(alice_org, alice, shared_traces / "azure2023_conv.csv", capture)
    model = job_services.served_model_register(
        actor=alice, organization=alice_org, name="llama-xs", path=str(tmp_path / "models" / "llama-xs")
    )
    return made, sample, model


def _smallest_job(alice, sample, model, pool, **extra):  # type: ignore[no-untyped-def]
    """The smallest search on the pool: the competent baseline and one candidate, no confirmation."""
    return job_services.tuning_job_create(
        actor=alice,
        organization=sample.organization,
        name="",
        traffic_sample=sample,
        served_model=model,
        slo=LOOSE_SLO,
        peak_rps=1.0,
        pool=pool.name,
        budget_trials=2,
        confirm_repeats=0,
        **extra,
    )


def _with_reference(job: TuningJob) -> None:
    """Record the job's reference as captured (as a resumed job's would be), so the first thing
    left is the search."""
    from portal.jobs import selectors as job_selectors
    from portal.jobs.models import Trial
    from tuning.search.job import REFERENCE, plan_job

    prepared = plan_job(job.job_spec(), job_selectors.job_work_dir(job))
    Trial.objects.create(
        job=job,
        organization=job.organization,
        number=0,
        assignment=dict(prepared.reference),
        label="reference",
        status=Trial.Status.DONE,
        result={"status": "ok", "capture": {"prompt_logprobs": [], "greedy": []}, "phase": REFERENCE},
    )


def test_a_pool_job_measures_a_batch_at_once_one_trial_per_host(  # type: ignore[no-untyped-def]
    alice, alice_org, broker, settings, tmp_path, shared_traces, django_capture_on_commit_callbacks
) -> None:
    """Two idle hosts: the job's step sends its two search trials out at once, each host takes
    one, and the job goes on once both are back. The hosts are two agents on this machine; their
    "engine" is tests/tuning/pool_rendezvous.py, which exits with status 3 only when both engines
    were started together (no vLLM starts and nothing is timed)."""
    from django.db import transaction

    from portal.jobs.models import Trial

    pool, sample, model = _pool_job(
        alice, alice_org, settings, tmp_path, shared_traces, django_capture_on_commit_callbacks, "cpu-pair"
    )
    _send_through(broker, settings)
    rendezvous = tmp_path / "rendezvous"
    engine = {
        "TAILGUARD_ENGINE_COMMAND": f"{sys.executable} -m tests.tuning.pool_rendezvous",
        "TAILGUARD_TEST_RENDEZVOUS": str(rendezvous),
        "TAILGUARD_TEST_RENDEZVOUS_N": "2",
    }
    agents = [_agent("cpu-pair", f"colocated-{x}", broker, tmp_path, settings, **engine) for x in "ab"]
    outputs: list[str] = []
    try:
        _await(
            lambda: Host.objects.filter(pool=pool, state=Host.State.ACTIVE).count() == 2,
            agents[0],
            "both hosts registering",
        )
        with transaction.atomic():
            job = _smallest_job(alice, sample, model, pool, duration_s=5, repeats=1)
            _with_reference(job)
        _await(
            lambda: not TuningJob.objects.get(pk=job.pk).is_active,
            agents[1],
            "the job ending",
        )
    finally:
        outputs = [_stop(a) for a in agents]
    job.refresh_from_db()
    trials = list(Trial.objects.filter(job=job).order_by("number"))
    assert [t.number for t in trials] == [0, 1, 2], [(t.number, t.result) for t in trials]
    search = trials[1:]
    # One batch, measured by its own tasks: each host took one trial, and both engines were up
    # together (the rendezvous's status 3, not 4).
    assert all(t.batch == 1 and t.status == Trial.Status.DONE for t in search)
    assert {t.result["host"]["name"] for t in search} == {"colocated-a", "colocated-b"}, [
        t.result for t in search
    ]
    for t in search:
        assert "engine exited with status 3 during start-up" in t.result["error"], t.result["error"]
    assert len(list(rendezvous.glob("engine-*"))) == 2
    # The batch's last trial owed the job's next step, which found the search done and ended it.
    assert job.status in TuningJob.TERMINAL and job.dispatch != TuningJob.Dispatch.TRIALS, (
        job.status,
        job.error,
    )
    assert [t["number"] for t in (job.report or {}).get("trials", [])] == [0, 1, 2]
    assert sum("tuning_trial_run" in output for output in outputs) == 2, outputs


def test_batch_trials_whose_host_died_are_sent_again_then_failed_with_the_host_named(  # type: ignore[no-untyped-def]
    alice, alice_org, broker, settings, tmp_path, shared_traces, django_capture_on_commit_callbacks
) -> None:
    import redis

    from portal.jobs.models import Trial

    pool, sample, model = _pool_job(
        alice, alice_org, settings, tmp_path, shared_traces, django_capture_on_commit_callbacks, "cpu-gone"
    )
    _send_through(broker, settings)
    queue = redis.Redis.from_url(broker, socket_timeout=5)
    with django_capture_on_commit_callbacks(execute=True):
        job = _smallest_job(alice, sample, model, pool)
    queue.delete("pool.cpu-gone")
    host = Host.objects.create(
        pool=pool, name="engine-gone", state=Host.State.ACTIVE, last_heartbeat_at=timezone.now()
    )
    # A batch is out: trial 1 never reached the broker, trial 2's host stopped mid-trial.
    TuningJob.objects.filter(pk=job.pk).update(
        status=TuningJob.Status.RUNNING, dispatch=TuningJob.Dispatch.TRIALS
    )
    long_ago = timezone.now() - timedelta(seconds=settings.TUNING_LEASE_S + 5)
    planned = {"phase": "search", "assignment": {}}
    common = {
        "job": job,
        "organization": alice_org,
        "assignment": {},
        "label": "x",
        "planned": planned,
        "batch": 1,
    }
    first = Trial.objects.create(number=1, **common)
    second = Trial.objects.create(
        number=2, host=host, lease_owner="task-2", lease_heartbeat_at=long_ago, **common
    )
    # A stray copy of the job's step while its batch is out does nothing.
    assert job_services.tuning_job_step(job_id=str(job.id), owner="stray") == "busy-or-done"
    with django_capture_on_commit_callbacks(execute=True):
        counts = job_services.tuning_jobs_redispatch()
    assert counts["trials_lost"] == 1 and counts["trials_died"] == 1, counts
    assert queue.llen("pool.cpu-gone") == 2  # both trials, on the pool's queue for any live host
    second.refresh_from_db()
    assert second.attempts == 2 and second.lease_owner == ""
    # Each went through the task outbox, sent: a beat now owes neither again.
    for trial in (first, second):
        sent = OutboxMessage.objects.filter(key__startswith=trial_key_prefix(trial.pk))
        assert [m.status for m in sent] == [OutboxMessage.Status.SENT]
    with django_capture_on_commit_callbacks(execute=True):
        again = job_services.tuning_jobs_redispatch()
    assert again["trials_lost"] == 0 and again["trials_died"] == 0, again
    assert queue.llen("pool.cpu-gone") == 2
    # Each dies again on its host, up to the limit: then it is recorded as failed, the host named,
    # and the batch's last owes the job's next step.
    Trial.objects.filter(pk__in=[first.pk, second.pk]).update(
        attempts=settings.TUNING_MAX_INTERRUPTIONS, host=host, lease_owner="task", lease_heartbeat_at=long_ago
    )
    queue.delete("pool.cpu-gone")
    with django_capture_on_commit_callbacks(execute=True):
        counts = job_services.tuning_jobs_redispatch()
    assert counts["trials_failed"] == 2, counts
    for trial in (first, second):
        trial.refresh_from_db()
        assert trial.status == Trial.Status.DONE and trial.result["status"] == "failed"
        assert trial.result["error"].startswith("host engine-gone stopped while it measured this trial")
        assert trial.result["host"]["name"] == "engine-gone"
    job.refresh_from_db()
    assert job.dispatch == TuningJob.Dispatch.PENDING and not job.awaits_broker
    messages = [m.decode(errors="replace") for m in queue.lrange("pool.cpu-gone", 0, -1)]
    assert len(messages) == 1 and "tuning_job_step" in messages[0]
