"""`tailguard tune --pool NAME`: the command line's trials on a pool's engine hosts, through their
agents (real agents: Celery workers on the pool's queue, against this test's database and Redis).

The two hosts of the parallel test are two agents on this one machine (named `colocated-*`):
they prove that a batch is measured at once, one trial per host, and nothing about speed. Their
"engine" is tests/tuning/pool_rendezvous.py, which only exits cleanly when both hosts' engines
were started together; no vLLM starts and no figure of theirs is used.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from portal.accounts.models import User
from portal.pools import services
from portal.pools.models import Host
from tailguard.cli import build_parser
from tailguard.cli import main as tailguard
from tests.conftest import REPO_ROOT
from tuning.commands.tune import spec_from_args, state_file
from tuning.search.job import REFERENCE, SEARCH, TrialRecord, plan_job

pytestmark = [pytest.mark.django_db(transaction=True)]
WAIT_S = 180  # an upper bound on each awaited event (polled), never a sleep the test relies on
SLO = "ttft_p50_ms<=60000,ttft_p95_ms<=60000"


def _database_url() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def portal_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The command's portal process (and the agents) on this test's database and Redis."""
    import redis

    if connection.vendor != "postgresql":
        pytest.skip("the command's portal process shares the test database only on PostgreSQL")
    url = os.environ.get("TAILGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Redis at {url}: {exc}")
        pytest.skip(f"Redis not reachable at {url}")
    client.flushdb()
    monkeypatch.setenv("DATABASE_URL", _database_url())
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    monkeypatch.setenv("CELERY_TASK_ALWAYS_EAGER", "false")
    try:
        yield url
    finally:
        client.flushdb()


def _ops() -> User:
    return User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)


def _tune_args(model: Path, trace: Path, out: Path, *extra: str) -> list[str]:
    return [
        "tune",
        "--trace",
        str(trace),
        "--model",
        str(model),
        "--slo",
        SLO,
        "--peak-rps",
        "1",
        "--duration-s",
        "5",
        "--repeats",
        "1",
        "--confirm-repeats",
        "0",
        "--json",
        str(out),
        *extra,
    ]


def test_an_unknown_pool_and_a_pool_with_no_live_host_are_refused_before_any_trial(
    portal_env: str, model_dir: Path, shared_traces: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    trace = shared_traces / "mooncake_synthetic.jsonl"
    out = tmp_path / "report.json"
    idle = services.pool_create(actor=_ops(), name="cpu-idle", region="local", accelerator="local-cpu")
    assert tailguard(_tune_args(model_dir, trace, out, "--pool", "no-such-pool")) == 2
    err = capfd.readouterr().err
    assert "no pool named 'no-such-pool'; known: cpu-idle" in err
    # A host that registered once and went silent is no live host: the command says so and how
    # to start one, and runs nothing.
    Host.objects.create(pool=idle, name="gone", state=Host.State.STOPPED)
    assert tailguard(_tune_args(model_dir, trace, out, "--pool", "cpu-idle")) == 1
    err = capfd.readouterr().err
    assert "pool cpu-idle has no live host" in err and "tailguard agent --pool cpu-idle" in err
    # A pool's hardware is the pool's: another --hardware is refused.
    assert tailguard(_tune_args(model_dir, trace, out, "--pool", "cpu-idle", "--hardware", "h200")) == 2
    assert "pool cpu-idle is local-cpu, not h200" in capfd.readouterr().err
    assert not out.exists() and not (tmp_path / "report.json.work").exists()


def test_a_trial_held_by_a_live_host_is_not_measured_twice_and_a_dead_hosts_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from portal.pools import trials
    from portal.pools.selectors import AGENT_HOST_ENV

    pool = services.pool_create(actor=_ops(), name="cpu-claims", region="local", accelerator="local-cpu")
    now = timezone.now()
    a, b = (
        Host.objects.create(pool=pool, name=n, state=Host.State.ACTIVE, last_heartbeat_at=now)
        for n in ("host-a", "host-b")
    )
    folder = tmp_path / "work" / "trial-1"
    folder.mkdir(parents=True)
    (folder / "claim.json").write_text(json.dumps({"host_id": str(a.id), "host": "host-a", "pid": 1}))
    # A second delivery of trial 1 reaches host B while host A measures it: B leaves it alone.
    monkeypatch.setenv(AGENT_HOST_ENV, str(b.id))
    assert (
        trials.cli_trial_run(work_dir=str(tmp_path / "work"), number=1) == "trial 1: measured by host host-a"
    )
    assert not (folder / "result.json").exists()
    # Host A stopped reporting: B takes the trial over. The job's files are missing here, which
    # fails the trial with the host and the cause, never silently.
    Host.objects.filter(pk=a.pk).update(last_heartbeat_at=now - timedelta(days=1))
    assert trials.cli_trial_run(work_dir=str(tmp_path / "work"), number=1) == "trial 1: failed"
    result = json.loads((folder / "result.json").read_text())
    assert (
        result["error"].startswith("on host host-b: FileNotFoundError") and result["host"]["name"] == "host-b"
    )
    assert json.loads((folder / "claim.json").read_text())["host"] == "host-b"


def _agent(pool: str, name: str, broker: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    child = dict(os.environ)
    child.update(
        DATABASE_URL=_database_url(),
        CELERY_BROKER_URL=broker,
        CELERY_TASK_ALWAYS_EAGER="false",
        AGENT_HEARTBEAT_S="1",
        # Each agent is its own engine host: its own measuring lock.
        TAILGUARD_HOST_LOCK=str(tmp_path / f"{name}.lock"),
        **env,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tailguard.cli", "agent", "--pool", pool, "--name", name],
        cwd=REPO_ROOT,
        env=child,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[str]) -> str:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output


@pytest.mark.slow
@pytest.mark.celery_worker
def test_a_pool_of_two_hosts_measures_a_batch_at_once_one_trial_per_host_recorded_in_order(
    portal_env: str, model_dir: Path, shared_traces: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pool = services.pool_create(actor=_ops(), name="cpu-pair", region="local", accelerator="local-cpu")
    trace = shared_traces / "mooncake_synthetic.jsonl"
    out, work = tmp_path / "report.json", tmp_path / "work"
    argv = _tune_args(
        model_dir, trace, out, "--pool", "cpu-pair", "--budget-trials", "2", "--work-dir", str(work)
    )
    # The reference is recorded already (as a resumed job's would be), so the first thing left is
    # the search: a batch of two on two idle hosts.
    args = build_parser().parse_args(argv)
    spec = spec_from_args(args, hardware=pool.accelerator, price_per_hour_usd=0.0)
    prepared = plan_job(spec, work)
    captured = {"status": "ok", "capture": {"prompt_logprobs": [], "greedy": []}, "phase": REFERENCE}
    reference = TrialRecord(0, dict(prepared.reference), captured)
    state_file(work).write_text(json.dumps({"spec": spec.to_dict(), "trials": [reference.__dict__]}))
    rendezvous = tmp_path / "rendezvous"
    engine = {
        "TAILGUARD_ENGINE_COMMAND": f"{sys.executable} -m tests.tuning.pool_rendezvous",
        "TAILGUARD_TEST_RENDEZVOUS": str(rendezvous),
        "TAILGUARD_TEST_RENDEZVOUS_N": "2",
    }
    agents = [_agent("cpu-pair", f"colocated-{x}", portal_env, tmp_path, **engine) for x in "ab"]
    outputs: list[str] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while Host.objects.filter(pool=pool, state=Host.State.ACTIVE).count() < 2:
            assert time.monotonic() < deadline and all(a.poll() is None for a in agents), (
                "agents not registered"
            )
            time.sleep(0.5)
        assert tailguard(argv) == 0, capfd.readouterr().err
    finally:
        outputs = [_stop(a) for a in agents]
    err = capfd.readouterr().err
    report = json.loads(out.read_text())
    trials = report["trials"]
    # History in trial-number order: the reference, then the batch's two trials.
    assert [t["number"] for t in trials] == [0, 1, 2]
    assert [t["phase"] for t in trials] == [REFERENCE, SEARCH, SEARCH]
    search = [t["result"] for t in trials[1:]]
    # Each host measured one: both engines were up together (the rendezvous's status 3, not 4).
    assert {r["host"]["name"] for r in search} == {"colocated-a", "colocated-b"}, err
    for result in search:
        assert result["status"] == "failed"
        assert "engine exited with status 3 during start-up" in result["error"], result["error"]
    assert len(list(rendezvous.glob("engine-*"))) == 2
    assert "measuring on host colocated-" in err
    # Saved as it went: re-running the command finds the job complete and runs nothing more.
    saved = json.loads(state_file(work).read_text())
    assert [t["number"] for t in saved["trials"]] == [0, 1, 2]
    assert all("cli_trial_run" in output for output in outputs), outputs


@pytest.mark.engine
@pytest.mark.celery_worker
def test_a_pool_job_from_the_command_line_is_measured_on_the_pools_host_by_its_agent(
    portal_env: str, shared_traces: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The reference and two search trials (the smallest budget), each on a real vLLM engine
    started by the pool's agent (not by the command's process); the report names the host that
    measured them."""
    from serving.models.tiny import build_tiny_model

    model = tmp_path / "llama-xs"
    build_tiny_model(arch="llama", size="xs", out_dir=model, seed=0)
    pool = services.pool_create(actor=_ops(), name="cpu-one", region="local", accelerator="local-cpu")
    out = tmp_path / "report.json"
    argv = [
        *_tune_args(model, shared_traces / "mooncake_synthetic.jsonl", out, "--pool", "cpu-one"),
        *("--budget-trials", "2", "--confirm-repeats", "0"),
        *("--max-prompt-tokens", "128", "--max-output-tokens", "8"),
        *("--max-model-len", "512", "--slo", "ttft_p50_ms<=1"),  # missed: no capacity steps
    ]
    agent = _agent("cpu-one", "engine-one", portal_env, tmp_path)
    try:
        deadline = time.monotonic() + WAIT_S
        while not Host.objects.filter(pool=pool, state=Host.State.ACTIVE).exists():
            assert time.monotonic() < deadline and agent.poll() is None, "agent not registered"
            time.sleep(0.5)
        status = tailguard(argv)
    finally:
        output = _stop(agent)
    err = capfd.readouterr().err
    assert status == 0, err[-3000:]
    trials = json.loads(out.read_text())["trials"]
    assert [(t["number"], t["phase"]) for t in trials] == [(0, REFERENCE), (1, SEARCH), (2, SEARCH)]
    for t in trials:
        assert t["result"]["status"] == "ok", t["result"].get("error")
        assert t["result"]["host"]["name"] == "engine-one" and t["result"]["host"]["pool"] == "cpu-one"
    measured = trials[1]["result"]
    # Measured and gated there (whether the gate passes depends on this CPU's fastest dtype).
    assert measured["load"] and measured["slo_met"] is False and "passed" in measured["correctness"]
    assert output.count("cli_trial_run") >= 2
