"""A running trial's engine log on its job page (issue 24 item 3: no silent waits): the step that
measures the trial keeps the log's last lines in the trial's row, bounded and with the server's
paths shortened; the job page's trials panel shows them, escaped, as it polls; only members of
the job's organization see them."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.jobs import services
from portal.jobs.models import Trial, TuningJob
from tests.conftest import PASSWORD
from tests.factories import finished_job

SERVER_LINES = [
    "[tailguard] command: /opt/venv/bin/python -m vllm.entrypoints.openai.api_server --model /models/llama-xs "
    "--port 41234 --api-key tgk_abcd1234_secretsecret",
    "INFO 12-02 06:10:00 [api_server.py:1] non-default args: {'model': '/models/llama-xs', 'api_key': 'sk-live'}",
    '  File "/opt/venv/lib/python3.11/site-packages/vllm/engine/arg_utils.py", line 953, in create',
    "INFO Route: /v1/completions, Methods: POST",
    "INFO Starting server on http://127.0.0.1:41234/v1 (prefix cache in /var/lib/tailguard/jobs/other-job/cache)",
    "<script>alert('x')</script> & done",
]


def test_engine_log_lines_are_bounded_and_keep_no_server_path() -> None:
    lines = services.engine_log_for_customer(
        [f"noise {i}" for i in range(30)] + SERVER_LINES + ["x" * 1000],
        replacements={"/models/llama-xs": "<model llama-xs>", "/var/lib/tailguard/jobs/this-job": "job"},
    )
    assert len(lines) == services.ENGINE_LOG_LINES and lines[0] == "noise 17"
    text = "\n".join(lines)
    assert (
        "[tailguard] command: …/python -m vllm.entrypoints.openai.api_server --model <model llama-xs> "
        "--port 41234 --api-key ***"
    ) in text
    assert "'model': '<model llama-xs>', 'api_key': '***'" in text
    assert 'File "…/arg_utils.py", line 953' in text
    assert "Route: /v1/completions" in text and "http://127.0.0.1:41234/v1" in text
    assert "(prefix cache in …/cache)" in text
    for leak in ("/opt/venv", "/models/", "site-packages", "other-job", "secretsecret", "sk-live"):
        assert leak not in text, leak
    assert len(lines[-1]) == services.ENGINE_LOG_LINE_CHARS and lines[-1].endswith("…")
    # The job's own work folder reads as "job".
    assert services.engine_log_for_customer(
        ["log /var/lib/tailguard/jobs/this-job/trial-3/engine.log"],
        replacements={"/var/lib/tailguard/jobs/this-job": "job"},
    ) == ["log job/trial-3/engine.log"]


def _running(org: Any, user: Any) -> tuple[TuningJob, Trial]:
    job = finished_job(org, user)
    job.status, job.started_at, job.finished_at, job.winner_trial = (
        TuningJob.Status.RUNNING,
        timezone.now(),
        None,
        None,
    )
    job.phase = "trial 1: search"
    job.save()
    trial = Trial.objects.create(
        organization=org,
        job=job,
        number=1,
        assignment={},
        label="max_num_seqs=64",
        status=Trial.Status.RUNNING,
    )
    return job, trial


@pytest.mark.django_db
def test_the_running_trials_log_shows_escaped_on_its_job_page_to_members_only(  # type: ignore[no-untyped-def]
    alice, alice_org, bob_client, alice_client, charlie_client, settings, tmp_path: Path
) -> None:
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    job, trial = _running(alice_org, alice)
    url = reverse("jobs:trials", args=[job.id])
    assert 'id="engine-log"' not in alice_client.get(url).content.decode()  # nothing written yet
    log = tmp_path / "jobs" / str(job.id) / "trial-1" / "engine.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(SERVER_LINES) + "\n")
    replacements = services._log_replacements(job)
    assert services.trial_engine_log_record(trial=trial, log_path=log, replacements=replacements)
    assert not services.trial_engine_log_record(trial=trial, log_path=log, replacements=replacements)
    for client in (alice_client, bob_client):  # the owner and a viewer of the organization
        html = client.get(url).content.decode()
        assert 'id="engine-log"' in html and "Engine log, trial 1" in html
        assert (
            "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; done" in html
            and "<script>alert" not in html
        )
        assert "…/arg_utils.py" in html and "/opt/venv" not in html and str(tmp_path) not in html
    # The detail page carries the same panel (it polls the fragment above).
    assert 'id="engine-log"' in alice_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
    # Another organization's member gets a 404 like a missing job, and nothing of the log.
    for other in (url, reverse("jobs:detail", args=[job.id])):
        response = charlie_client.get(other)
        assert response.status_code == 404 and b"arg_utils" not in response.content
    # A finished trial keeps its lines; the page shows the log only while a trial runs.
    Trial.objects.filter(pk=trial.pk).update(status=Trial.Status.DONE)
    log.write_text("later\n")
    assert not services.trial_engine_log_record(trial=trial, log_path=log, replacements=replacements)
    assert "later" not in Trial.objects.get(pk=trial.pk).engine_log
    assert 'id="engine-log"' not in alice_client.get(url).content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_step_keeps_the_log_current_while_its_trial_runs(  # type: ignore[no-untyped-def]
    alice, alice_org, settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's watcher thread copies the engine log into the trial's row during the trial
    (everything around the trial is stubbed: its own tests run real engines)."""
    settings.TUNING_WORK_DIR = tmp_path / "jobs"
    job = finished_job(alice_org, alice)
    job.trials.all().delete()
    TuningJob.objects.filter(pk=job.pk).update(
        status=TuningJob.Status.RUNNING, started_at=timezone.now(), finished_at=None, winner_trial=None
    )
    planned = SimpleNamespace(assignment={"max_num_seqs": 64}, describe=lambda: "search: max_num_seqs=64")
    monkeypatch.setattr(services, "_ENGINE_LOG_POLL_S", 0.05)
    monkeypatch.setattr(services.JobSpec, "from_dict", classmethod(lambda cls, data: None))
    monkeypatch.setattr(services, "plan_job", lambda *a, **k: object())
    monkeypatch.setattr(
        services, "next_trials", lambda prepared, history, slots: [] if history else [planned]
    )
    monkeypatch.setattr(services, "report", lambda prepared, history: {})
    monkeypatch.setattr(services, "_step_owe", lambda job: None)
    seen: list[str] = []

    def execute(prepared, planned, history, work_dir: Path, **kwargs) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        work_dir.mkdir(parents=True, exist_ok=True)
        with (work_dir / "engine.log").open("a") as log:
            log.write(f"INFO loading weights from {work_dir}/weights\n")
            log.flush()
            deadline = time.monotonic() + 10
            while not seen and time.monotonic() < deadline:
                time.sleep(0.05)
                stored = Trial.objects.get(job_id=job.pk, number=0).engine_log
                if stored:
                    seen.append(stored)
        return {"status": "ok", "phase": "search"}

    monkeypatch.setattr(services, "execute", execute)
    assert services.tuning_job_step(job_id=str(job.pk), owner="test-step") == "trial 0"
    assert seen == ["INFO loading weights from job/trial-0/weights"]
    assert Trial.objects.get(job_id=job.pk, number=0).status == Trial.Status.DONE


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_job_page_in_a_browser_follows_the_log_as_it_grows(  # type: ignore[no-untyped-def]
    alice, alice_org, live_server, page_factory
) -> None:
    """Real Chromium on the job page: new lines arrive with the panel's htmx polling, as text."""
    job, trial = _running(alice_org, alice)
    Trial.objects.filter(pk=trial.pk).update(engine_log="INFO starting the engine")
    page = page_factory()
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", alice.email)
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/dashboard/$"))
    page.goto(live_server.url + reverse("jobs:detail", args=[job.id]))
    assert "INFO starting the engine" in (page.text_content("#engine-log pre") or "")
    Trial.objects.filter(pk=trial.pk).update(engine_log="INFO starting the engine\n<b>INFO</b> warming up")
    page.wait_for_function(
        "() => (document.querySelector('#engine-log pre') || {}).textContent.includes('<b>INFO</b> warming up')",
        timeout=15_000,
    )
    assert page.locator("#engine-log b").count() == 0  # shown as text, never as markup
    # The job ends: the page reloads itself without the panel.
    TuningJob.objects.filter(pk=job.pk).update(status=TuningJob.Status.SUCCEEDED, finished_at=timezone.now())
    page.wait_for_function("() => !document.querySelector('#engine-log')", timeout=15_000)
