"""The three user journeys of issue 12, each driven end to end in a real headless Chromium.

1. A healthcare customer signs up, creates an organization, records a BAA (and so enrols a
   second factor) and US-only residency, uploads a shared trace flagged as PHI and reads its
   profile, states an SLO and runs a tuning job on the local engine, reads the report, deploys
   the winner, calls it with the OpenAI client and watches its dashboard pick the calls up.
2. A sales engineer builds a benchmark report comparing two OpenAI-compatible endpoints on a
   prospect's sample and shares it by link; the customer opens the link without signing in.
3. A platform admin finds the tenant in breach on the SLA console and reads its audit trail.

Everything the user starts runs where it would in production: uploads, tuning steps, the
endpoint's start, metric scrapes and benchmark runs go through Redis to a real Celery worker
(with its beat) on the test database; the trial and the endpoint are real vLLM engines on the
smallest tiny model. Screenshots of every page are kept in test-artifacts/ when a journey fails
(the `page_factory` fixture).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.accounts.models import User
from portal.sla import services as sla_services
from tests.browser import sign_in, watched
from tests.conftest import PASSWORD
from tests.db_roles import application_role, database_url
from tests.portal.benchmarks import FakeOpenAI
from tests.portal.faults import fault_worker, fault_worker_env, fresh_connections_after, redis_url  # noqa: F401 (fixtures)
from tests.workers import sending_to

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# A long wait is one for an engine: the trial's (start, golden set, load at five rates) or the
# endpoint's start. Generous, because the machine is shared; nothing asserts how long it took.
ENGINE_WAIT_MS = 600_000
# The whole tuning job: three engines one after the other (reference, baseline, candidate).
JOB_WAIT_MS = 900_000


@contextmanager
def _real_worker(settings: Any, broker_url: str, models: Path, tmp_path: Path, **env: str) -> Iterator[Path]:
    """This process sends its tasks to Redis; a Celery worker with its beat takes them. Yields
    the worker's log. Production timings for leases and redispatch (this is no fault test)."""
    worker_env = {
        **fault_worker_env(broker_url, settings, models),
        "TUNING_LEASE_S": "120",
        "REDISPATCH_INTERVAL_S": "30",
        "ENDPOINTS_DIR": str(settings.ENDPOINTS_DIR),
        "COMPLIANCE_REGIONS": ",".join(settings.COMPLIANCE_REGIONS),
        "COMPLIANCE_DEFAULT_REGIONS": ",".join(settings.COMPLIANCE_DEFAULT_REGIONS),
        **env,
    }
    with sending_to(broker_url, settings.REDIS_BROKER_TIMEOUTS), fault_worker(worker_env, tmp_path) as log:
        yield log


def _wait_for(page: Any, selector: str, timeout_ms: float, log: Path) -> None:
    """Waits for what the worker's work will show; a timeout fails with the worker's log."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(selector, timeout=timeout_ms)
    except PlaywrightTimeout:
        pytest.fail(f"{selector} did not appear in {timeout_ms / 1000:.0f} s; worker log:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-5000:] if log.exists() else "(no worker log)"


# --- Journey 1: the healthcare customer -------------------------------------------------------


@pytest.mark.engine
@pytest.mark.celery_worker
def test_healthcare_customer_from_signup_to_a_watched_endpoint(  # type: ignore[no-untyped-def]
    live_server,
    page_factory,
    settings,
    shared_traces: Path,
    model_root: Path,
    redis_url: str,  # noqa: F811
    postgres: None,
    tmp_path: Path,
) -> None:
    import openai

    from compliance import totp
    from compliance.models import AuditEvent
    from portal.accounts import rls
    from portal.endpoints import services as endpoint_services
    from portal.endpoints.models import Endpoint
    from portal.traffic.models import TrafficSample

    # A deployment with a US and an EU region beside this machine ("local"), whose home region
    # (the default for new organizations) is this machine.
    settings.COMPLIANCE_REGIONS = ["local", "us", "eu"]
    settings.COMPLIANCE_DEFAULT_REGIONS = ["local"]
    settings.TUNING_MODEL_ROOTS = [model_root]
    base = live_server.url
    page = page_factory()
    errors: list[str] = []
    watched(page, errors)

    # As in production: the portal connects as the application role, which row-level security
    # binds (each request declares its tenant), the worker as the workers' role. The test's own
    # reads of stored state are platform work.
    platform = rls.platform_transaction
    with (
        application_role(),
        _real_worker(
            settings, redis_url, model_root, tmp_path, DATABASE_URL=database_url(rls.DEFAULT_WORKER_ROLE)
        ) as log,
    ):
        endpoint = None
        try:
            # Sign up and create the organization.
            page.goto(base + "/signup/")
            page.fill("#id_email", "dana@clinic.test")
            page.fill("#id_full_name", "Dana")
            page.fill("#id_password", PASSWORD)
            page.click("button:has-text('Sign up')")
            page.wait_for_url(re.compile(r"/organizations/new/$"))
            page.fill("#id_name", "Sunrise Clinics")
            page.click("button:has-text('Create organization')")
            page.wait_for_url(re.compile(r"/dashboard/$"))
            assert page.text_content("#org-name") == "Sunrise Clinics"

            # Record the BAA. From then on the owner's account needs a second factor: the portal
            # asks for it before anything else, and the user enrols an authenticator.
            page.click("nav >> text=Compliance")
            assert "No BAA is in effect" in (page.text_content("main") or "")
            today = timezone.localdate().isoformat()
            page.fill("#id_counterparty", "Tailguard Inc.")
            page.fill("#id_version", "BAA-2026-1")
            page.fill("#id_signed_on", today)
            page.fill("#id_effective_on", today)
            page.click("button:has-text('Record BAA')")
            page.wait_for_url(re.compile(r"/compliance/2fa/"))
            assert "business associate agreement" in (page.text_content("main") or "")
            page.click("#start-enrol-form button[type=submit]")
            secret = (page.text_content("#totp-secret") or "").strip()
            page.fill("#id_code", totp.code_at(secret, int(time.time() // totp.STEP_S)))
            page.click("button:has-text('Verify')")
            # Enrolled: the one-time recovery codes are shown once, then on to the page asked for.
            page.wait_for_selector("#recovery-codes")
            page.click("#recovery-continue")
            page.wait_for_url(re.compile(r"/(compliance|dashboard)/$"))
            page.click("nav >> text=Compliance")
            # Recorded by the customer alone, the BAA is not in effect: the provider (a platform
            # admin) countersigns it and sets its dates, as the compliance console's form does.
            assert "awaiting the provider's countersignature" in (page.text_content("main") or "")
            from compliance import services as compliance_services
            from compliance.models import BAARecord

            with platform():
                record = BAARecord.objects.get(version="BAA-2026-1")
                provider = User.objects.create_user(
                    email="pat@tailguard.test", password=PASSWORD, staff_role=User.StaffRole.PLATFORM_ADMIN
                )
                compliance_services.baa_countersign(
                    actor=provider, baa=record, effective_on=record.effective_on
                )
            page.reload()
            assert "In effect: BAA-2026-1 with Tailguard Inc." in (page.text_content("main") or "")

            # US-only data residency.
            for region in ("local", "eu"):
                page.uncheck(f"input[name=allowed_regions][value={region}]")
            page.check("input[name=allowed_regions][value=us]")
            page.click("button:has-text('Save residency')")
            page.wait_for_selector("text=Data residency updated.")
            assert re.search(r"may only be in:\s*us\.", page.text_content("main") or "")

            # Upload a shared trace, flagged as PHI (accepted: the BAA is in effect), and read
            # its profile once the worker has validated it.
            page.click("nav >> text=Traffic")
            page.fill("#id_name", "clinic calls")
            page.set_input_files("#id_file", str(shared_traces / "mooncake_synthetic.jsonl"))
            page.check("#id_contains_phi")
            page.click("button:has-text('Upload')")
            _wait_for(page, "#sample-status[data-status='ready']", 120_000, log)
            assert page.text_content("#num-requests") == "3993"
            for chart in ("arrival", "input", "output", "interarrival", "reuse", "concurrency"):
                page.wait_for_selector(f"#chart-{chart}[data-rendered='true'] .main-svg")
            with platform():
                sample = TrafficSample.objects.select_related("organization").get(name="clinic calls")
                # The upload (PHI) was stored in the only allowed region (and, prompt text not
                # being kept, deleted once read).
                stored = list(
                    AuditEvent.objects.filter(organization=sample.organization, action="object.store")
                )
            assert [e.data["region"] for e in stored] == ["us"] and stored[0].data["contains_phi"] is True

            # Register the model, then state the SLO and start a job.
            page.click("nav >> text=Tuning")
            page.fill("#model-form [name=name]", "llama-xs")
            page.fill("#model-form [name=path]", str(model_root / "llama-xs"))
            page.click("button:has-text('Register model')")
            page.wait_for_selector("text=Registered llama-xs.")

            def fill_job_form(duration_s: str = "5", capacity_steps: str = "1.5") -> None:
                page.fill("#job-form [name=name]", "clinic voice agent")
                page.select_option("#job-form [name=traffic_sample]", label="clinic calls")
                page.select_option("#job-form [name=served_model]", label="llama-xs")
                page.fill("#job-form [name=ttft_p50_ms]", "2000")
                page.fill("#job-form [name=ttft_p95_ms]", "8000")
                page.fill("#job-form [name=peak_rps]", "1")
                page.select_option("#job-form [name=hardware]", "local-cpu")
                # The smallest search the form takes: the competent baseline (vLLM's defaults
                # with this host's fastest dtype) and one candidate, each judged against the
                # captured reference, without confirmation rounds. 5 s per load level (the least), once.
                page.fill("#job-form [name=budget_trials]", "2")
                page.fill("#job-form [name=confirm_repeats]", "0")
                page.fill("#job-form [name=duration_s]", duration_s)
                page.fill("#job-form [name=repeats]", "1")
                page.fill("#job-form [name=capacity_steps]", capacity_steps)
                page.click("button:has-text('Start tuning job')")

            # A trial length out of range, and load steps that do not rise, are named on their
            # fields; nothing is created.
            fill_job_form(duration_s="2", capacity_steps="2, 1.5")
            assert "greater than or equal to 5" in (
                page.text_content("#job-form [data-field='duration_s']") or ""
            )
            assert "load steps must rise" in (
                page.text_content("#job-form [data-field='capacity_steps']") or ""
            )
            # On US-only residency this machine's engine is refused, naming the rule.
            fill_job_form()
            refusal = page.text_content("#job-form") or ""
            assert "region 'local', outside the organization's allowed regions (us)" in refusal
            with platform():
                assert not sample.organization.tuning_jobs.exists()
            # Chromium logs each refused form's 400 answer; nothing else may have failed so far.
            assert len(errors) == 2 and all("status of 400" in e and e.endswith("/jobs/") for e in errors), (
                errors
            )
            errors.clear()

            # The owner allows this machine as well (data stays in the US bucket) and starts
            # the job again; its trial arrives on the page while the worker runs it.
            page.click("nav >> text=Compliance")
            page.check("input[name=allowed_regions][value=local]")
            page.click("button:has-text('Save residency')")
            page.wait_for_selector("text=Data residency updated.")
            page.click("nav >> text=Tuning")
            fill_job_form()
            page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]+/$"))
            _wait_for(page, "#trials-panel [data-trial='0']", ENGINE_WAIT_MS, log)
            # When the job ends the panel stops polling and the page reloads with the outcome.
            _wait_for(page, "#deploy-form, #trials-panel[data-status='failed']", JOB_WAIT_MS, log)
            with platform():
                job = sample.organization.tuning_jobs.get()
            assert page.text_content("#job-status") == "Finished", (job.error, _tail(log))
            # The winner is the baseline or the candidate, whichever the measurements chose.
            assert job.winner_trial in (1, 2), job.report
            winner = job.winner_trial
            assert (page.text_content("#selection-summary") or "").startswith(f"Trial {winner} (")
            assert "reference" in (page.text_content("#trials [data-trial='0']") or "")
            # The caps are stated in one line, with the share of requests they clip.
            caps_line = page.text_content("#job-caps") or ""
            assert "Replayed at full length" in caps_line or "capped" in caps_line
            row = page.text_content(f"#trials [data-trial='{winner}']") or ""
            assert "met" in row and "pass" in row and "winner" in row

            # The report: the winner, its gate verdicts and every chart drawn.
            page.click("#job-report-link")
            assert (page.text_content("#report-winner") or "").startswith(f"Trial {winner}:")
            chart_ids = page.eval_on_selector_all(".report-chart .chart", "els => els.map(e => e.id)")
            assert "chart-ttft-cdf" in chart_ids and "chart-latency-load" in chart_ids
            for chart in chart_ids:
                page.wait_for_selector(f"#{chart}.js-plotly-plot[data-rendered='true'] svg.main-svg")
            assert "pass" in (page.text_content("#gates") or "")

            # Deploy the winner: the key is shown once, then the endpoint page reports health.
            page.click("text=Back to the job")
            page.click("#deploy-form button")
            page.click("#deploy-confirm button")  # the summary: name, hardware, price, configuration
            page.wait_for_selector("#endpoint-key")
            api_key = (page.text_content("#endpoint-key") or "").strip()
            # The serving host picks the port when it starts the engine: the address is shown once
            # it has reported it (the start may or may not have run by the time this page renders).
            assert api_key.startswith("tgk_")
            assert page.is_visible("#endpoint-url-pending") or (
                page.text_content("#endpoint-url") or ""
            ).strip().endswith("/v1")
            with platform():
                endpoint = Endpoint.objects.select_related("served_model", "created_by").get(
                    organization=sample.organization
                )
            page.click("text=Watch the endpoint")
            _wait_for(
                page,
                "#endpoint-status[data-status='healthy'], #endpoint-status[data-status='failed']",
                ENGINE_WAIT_MS,
                log,
            )
            assert page.get_attribute("#endpoint-status", "data-status") == "healthy", (
                page.text_content("#endpoint-health"),
                (settings.ENDPOINTS_DIR / str(endpoint.id) / "supervisor.log").read_text(errors="replace")[
                    -3000:
                ],
            )
            base_url = (page.text_content("#endpoint-url") or "").strip()
            assert base_url.endswith("/v1"), base_url
            assert api_key not in page.content()
            assert "deployed the winner" in (page.text_content("#revisions") or "")

            # The user's own code calls it with the OpenAI client; the next scrapes show the
            # calls on the dashboard (the page polls its live panel every 15 s).
            client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=120)
            for prompt in ("Patient asks about", "Reschedule my", "Is the clinic open"):
                answer = client.completions.create(
                    model=endpoint.served_model.name, prompt=prompt, max_tokens=4
                )
                assert answer.usage is not None and answer.usage.completion_tokens == 4
            page.wait_for_function(
                "() => { const c = document.getElementById('chart-ttft');"
                " return c && c.data && c.data.some(t => (t.y || []).some(v => v !== null)); }",
                timeout=120_000,
            )
            page.wait_for_selector("#chart-ttft[data-rendered='true'] svg.main-svg")
            assert re.search(r"[1-9]\d* snapshots? in the", page.text_content("#endpoint-live") or "")
            assert errors == []
        finally:
            if endpoint is not None:
                with platform():
                    endpoint.refresh_from_db()
                    if endpoint.is_active:
                        endpoint_services.endpoint_stop(actor=endpoint.created_by, endpoint=endpoint)
        if endpoint is not None:
            # Stopping is a background task of the worker still running here: wait for its verdict.
            deadline = time.monotonic() + 120
            while True:
                with platform():
                    endpoint.refresh_from_db()
                if endpoint.status != Endpoint.Status.STOPPING or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert endpoint.status == Endpoint.Status.STOPPED
            assert not endpoint_services._supervisor_alive(endpoint)


# --- Journey 2: the sales engineer ------------------------------------------------------------


@pytest.mark.celery_worker
def test_sales_engineer_compares_two_endpoints_and_shares_the_report(  # type: ignore[no-untyped-def]
    live_server,
    page_factory,
    settings,
    sam,
    sample,
    serve,
    model_root: Path,
    redis_url: str,  # noqa: F811
    postgres: None,
    tmp_path: Path,
) -> None:
    from compliance.models import AuditEvent

    # The prospect's current provider answers its first token after 200 ms; the tuned endpoint
    # at once. Both stream real SSE chunks from local servers.
    provider = serve(FakeOpenAI(ttft_s=0.2, tpot_s=0.005))
    tuned = serve(FakeOpenAI(ttft_s=0.0, tpot_s=0.0))
    problems: list[str] = []
    page = watched(page_factory(), problems)
    # Both endpoints are on this machine: the operator allows loopback targets (portal and worker).
    settings.BENCHMARK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    with _real_worker(
        settings,
        redis_url,
        model_root,
        tmp_path,
        BENCHMARK_TOKENIZER_DIR=str(settings.BENCHMARK_TOKENIZER_DIR),
        BENCHMARK_ALLOWED_NETWORKS="127.0.0.0/8",
    ) as log:
        sign_in(page, live_server.url, sam.email, PASSWORD)
        page.click("nav >> text=Benchmarks")
        page.click("#new-report")
        page.fill("#id_name", "Acme Voice: provider vs tuned")
        page.select_option("#id_traffic_sample", value=str(sample.id))
        page.fill("#id_load_multipliers", "1")
        page.fill("#id_duration_s", "3")
        page.fill("#id_request_timeout_s", "20")
        page.fill("#id_targets-0-name", "Current provider")
        page.fill("#id_targets-0-base_url", provider.base_url)
        page.fill("#id_targets-0-model", "gpt-x")
        page.fill("#id_targets-0-api_key", "sk-prospect-secret-0123456789")
        page.select_option("#id_targets-0-pricing", "per_token")
        page.fill("#id_targets-0-price_input_per_mtok_usd", "0.5")
        page.fill("#id_targets-0-price_output_per_mtok_usd", "1.5")
        page.fill("#id_targets-1-name", "Tailguard tuned")
        page.fill("#id_targets-1-base_url", tuned.base_url)
        page.fill("#id_targets-1-model", "acme-chat")
        page.select_option("#id_targets-1-pricing", "hourly")
        page.fill("#id_targets-1-price_per_hour_usd", "4.5")
        page.click("button:has-text('Start benchmark')")
        page.wait_for_url(re.compile(r"/benchmarks/[0-9a-f-]+/$"))
        # The page polls until the worker has measured both targets, then reloads.
        _wait_for(page, "#report-status[data-status='succeeded']", 180_000, log)

    level = page.locator("#level-0")
    for name in ("Current provider", "Tailguard tuned"):
        cells = level.locator(f"tr[data-target='{name}'] td")
        ok, sent = (cells.nth(1).text_content() or "").split(" / ")
        assert int(ok) == int(sent) > 0, name
        assert (cells.nth(2).text_content() or "").strip().startswith("0"), name  # no failures
        assert "$" in (level.locator(f"tr[data-target='{name}'] td.cost").text_content() or "")
    # What the provider's server waits before its first token is a floor for what was measured.
    provider_p50 = level.locator("tr[data-target='Current provider'] td.ttft-p50").text_content() or ""
    assert float(re.match(r"\s*([\d,.]+)\s*ms", provider_p50).group(1).replace(",", "")) >= 200  # type: ignore[union-attr]
    for chart_id in page.eval_on_selector_all("#charts .chart", "els => els.map(e => e.id)"):
        page.wait_for_selector(f"#{chart_id}[data-rendered='true'] .main-svg")
    assert page.locator("#chart-ttft-cdf-0 .scatterlayer .trace").count() == 2
    assert len(provider.received) > 0 and len(tuned.received) > 0
    assert provider.received[0]["authorization"] == "Bearer sk-prospect-secret-0123456789"

    # Share it for a week; the link is shown once.
    page.fill("#share-form [name=days]", "7")
    page.click("button:has-text('Create share link')")
    link = (page.text_content("#new-share-url") or "").strip()
    assert link.startswith(live_server.url)
    assert page.locator("#share-links tr[data-state='active']").count() == 1

    # The customer opens it without an account: the same results, none of the addresses or keys.
    customer = watched(page_factory(), problems)
    customer.goto(link)
    for name in ("Current provider", "Tailguard tuned"):
        customer.wait_for_selector(f"#level-0 tr[data-target='{name}']")
    for chart_id in customer.eval_on_selector_all("#charts .chart", "els => els.map(e => e.id)"):
        customer.wait_for_selector(f"#{chart_id}[data-rendered='true'] .main-svg")
    shared = customer.content()
    for hidden in (provider.base_url, tuned.base_url, "sk-prospect-secret", "share-form", "Revoke"):
        assert hidden not in shared
    assert AuditEvent.objects.filter(action="benchmark_share.view").count() == 1
    assert problems == []


# --- Journey 3: the platform admin ------------------------------------------------------------


def _tenant_with_endpoint(name: str, email: str, values_ms: list[float], *, baa: bool) -> Any:
    """A tenant whose endpoint has SLA terms (TTFT p50 <= 800 ms) and a scrape every 30 s this
    month with the given p50s; seeded through the services where there is one."""
    from compliance import services as compliance_services
    from compliance import sla
    from portal.accounts import services as account_services
    from portal.endpoints.models import Endpoint, MetricSnapshot
    from portal.jobs.models import ServedModel

    owner = account_services.user_signup(email=email, password=PASSWORD)
    org = account_services.organization_create(actor=owner, name=name)
    if baa:
        compliance_services.baa_record_create(
            actor=owner,
            organization=org,
            counterparty="Tailguard Inc.",
            version="BAA-7",
            signed_on=timezone.localdate(),
            effective_on=timezone.localdate(),
            ends_on=None,
            document=None,
        )
    model = ServedModel.objects.create(organization=org, name="llama-xs", path="/models/llama-xs")
    endpoint = Endpoint.objects.create(
        organization=org,
        name=f"{name} agent",
        served_model=model,
        config={},
        port=59200 + Endpoint.objects.count(),
        api_key_prefix="abcd1234",
        api_key_hash="0" * 64,
        status=Endpoint.Status.HEALTHY,
        created_by=owner,
    )
    sla_services.sla_terms_set(
        actor=owner,
        endpoint=endpoint,
        target_ms=800,
    )
    now = timezone.now()
    month_start, _end = sla.month_window(now)
    # The scrapes end now and stay inside this month (however early in the month it runs).
    step = min(timedelta(seconds=30), (now - month_start) / (len(values_ms) + 2))
    start = now - step * len(values_ms)
    MetricSnapshot.objects.create(organization=org, endpoint=endpoint, taken_at=start, gap=True)
    for i, value in enumerate(values_ms, start=1):
        MetricSnapshot.objects.create(
            organization=org,
            endpoint=endpoint,
            taken_at=start + step * i,
            ttft_p50_ms=value,
            ttft_p95_ms=value * 2,
            requests_per_s=1.0,
        )
    return org


@pytest.mark.parametrize("through", ["superuser", "application role"])
def test_platform_admin_finds_the_tenant_in_breach_and_reads_its_audit_trail(  # type: ignore[no-untyped-def]
    live_server,
    page_factory,
    settings,
    through: str,
) -> None:
    """Also run with the portal connected as the application role (row-level security binding
    every query): the console and the admin's audit trail declare the platform scope."""
    from compliance.models import AuditEvent
    from portal.accounts import rls

    settings.COMPLIANCE_REGIONS = ["us", "eu"]
    settings.COMPLIANCE_DEFAULT_REGIONS = ["us"]
    breached = _tenant_with_endpoint(
        "Northwind Health", "nora@northwind.test", [500.0] * 12 + [1400.0] * 4 + [500.0] * 4, baa=True
    )
    _tenant_with_endpoint("Acme Voice", "alice@acme.test", [400.0] * 20, baa=False)
    admin = User.objects.create_superuser(email="pat@tailguard.test", password=PASSWORD)
    assert admin.staff_role == User.StaffRole.PLATFORM_ADMIN

    role = application_role() if through == "application role" else nullcontext()
    with role:
        page = page_factory()
        problems: list[str] = []
        watched(page, problems)
        sign_in(page, live_server.url, admin.email, PASSWORD)
        page.goto(live_server.url + reverse("compliance:console"))
        # Northwind recorded its BAA; the admin countersigns it from the console first.
        awaiting = page.locator("#baa-awaiting tbody tr")
        assert awaiting.count() == 1 and "Northwind Health" in (awaiting.first.text_content() or "")
        awaiting.first.locator("button:has-text('Countersign')").click()
        page.wait_for_selector("text=BAA BAA-7 of Northwind Health countersigned")
        assert "None." in (page.text_content("#baa-awaiting") or "")
        rows = page.locator("#console-rows tbody tr")
        assert rows.count() == 2
        page.select_option("#id_sla", "breached")
        page.click("button:has-text('Filter')")
        page.wait_for_url(re.compile(r"sla=breached"))
        assert rows.count() == 1
        row = rows.first
        text = row.text_content() or ""
        assert "Northwind Health" in text and "Acme Voice" not in text
        assert "BAA-7" in text and "Northwind Health agent" in text
        assert row.locator("strong.sla-breached").text_content() == "breached"
        assert "breaches 1" in text

        # From the row to the tenant's audit trail (the read-only admin list of its chain).
        row.locator("a:has-text('Audit trail')").click()
        page.wait_for_url(re.compile(r"/admin/compliance/auditevent/\?chain="))
        trail = page.text_content("#result_list") or ""
        for action in ("organization.create", "baa.record", "baa.countersign", "sla.terms_set"):
            assert action in trail, trail[:2000]
        assert "nora@northwind.test" in trail and "alice@acme.test" not in trail
        shown = page.locator("#result_list tbody tr").count()
        with rls.platform_transaction():
            assert shown == AuditEvent.objects.filter(organization=breached).count()
            # Reading tenants' records is itself in the platform's audit trail.
            staff = AuditEvent.objects.filter(action="staff.access", actor_label=admin.email)
            assert staff.filter(data__what="compliance console", data__sla="breached").exists()
            assert any("/admin/compliance/auditevent/" in str(e.data) for e in staff)
        assert problems == []
