"""The portal under load: gunicorn + PostgreSQL on this machine, 50 concurrent users.

Builds its own PostgreSQL database (`tailguard_load`, dropped and re-created), migrates it and
seeds a tenant set through the portal's services (10 organizations of 5 people; per
organization real traffic samples ingested and profiled from the shared traces, finished
tuning jobs with their trials, selection and winner, running jobs, endpoints with their SLA
terms and 15-second metric snapshots (a week for the two big tenants' first endpoints, a day
for the others), and the audit events all of that writes).
Then starts gunicorn (`portal.wsgi`, production settings: DEBUG=false, static files through
whitenoise) and drives it with locust, headless: browser users sign in and read the dashboard,
traffic profiles, job pages (polling a running job's trials like its htmx does), job reports
and endpoint dashboards (with their 15 s live refresh); API clients walk the main list and
detail routes with a bearer token. After a ramp-up and warm-up, the requests of a fixed window
are kept.

Side by side in one run (the default, `--web-role both`): windows with gunicorn connecting as
the application role, which row-level security binds (production), and as the tables' owner,
which it does not (the baseline for its cost), interleaved app, owner, owner, app (`--rounds`
windows each), every window on a fresh gunicorn and locust over the same seeded database.

Summary (the application role's windows): `p95_page_ms` (full pages and htmx partials),
`p95_api_ms`, `error_rate` (failed / all requests in the window, sign-in included), `rps`, each
with a 95% bootstrap interval over 10-second blocks of the windows; and
`rls_cost_app_over_owner`, the same figures' ratios with intervals. Target: p95 <= 300 ms (the
interval's upper end), 0 errors. Also recorded per window: how busy the machine was (load
average; CPU cores used by gunicorn, locust, our PostgreSQL backends and everybody else).

    .venv/bin/python benchmarks/portal_load.py   # ~12 min on 2 cores: ~3 seeding (collectstatic
                                                 # compressing included), 4 windows of ~2 min
    .venv/bin/python benchmarks/portal_load.py --keep-db --no-write --web-role app --rounds 1
    .venv/bin/python benchmarks/portal_load.py --reuse-db --keep-db --no-write --web-role app --rounds 1
        # (a reused seed's snapshots end when it was seeded: fine for profiling, not for the record)

writes benchmarks/results/portal_load.json. Everything it starts (gunicorn, locust, its
database connections) is stopped on the way out, failure or not; the database is dropped
unless `--keep-db`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._machine import git_state, machine_facts  # noqa: E402
from benchmarks._machine import versions as common_versions  # noqa: E402
from benchmarks._stats import pooled_interval, pooled_ratio_interval  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "portal_load.json"
LOCUSTFILE = REPO / "benchmarks" / "portal_load_locustfile.py"
TRACES = REPO / "data" / "traces"
DB_NAME = "tailguard_load"
SERVER_URL = "postgres://postgres@127.0.0.1:5432"
PASSWORD = "load-test-password-9f3k"
TARGET_P95_MS = 300.0

NUM_ORGS = 10
PEOPLE_PER_ORG = 5  # owner, admin, two members, a viewer
SAMPLES_PER_ORG = 3
FINISHED_JOBS_PER_ORG = 6
RUNNING_JOBS_PER_ORG = 2
SNAPSHOT_INTERVAL_S = 15  # the beat schedule's endpoints-watch
SNAPSHOT_HISTORY = timedelta(days=7)  # the longest range the endpoint page offers
BIG_ORGS = 2  # these have a second endpoint
AUDIT_EVENTS_PER_ORG = 300  # besides the ones seeding writes


def versions() -> dict[str, str]:
    out = common_versions(
        "django", "djangorestframework", "gunicorn", "locust", "psycopg", "whitenoise", "tailguard"
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        # Others commit to this checkout meanwhile: the portal measured is this commit's (plus
        # whatever is uncommitted in the working tree then).
        out["tailguard_commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out["postgresql"] = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc", "show server_version"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    return out


def app_database_url(role: str) -> str:
    """The benchmark database as `role` (the server trusts loopback connections here)."""
    scheme, rest = SERVER_URL.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[-1]}/{DB_NAME}"


def environment(var_dir: Path, secret_key: str) -> dict[str, str]:
    """Production settings as the README lists them; TLS would end at a proxy in front, so the
    benchmark speaks plain HTTP on loopback with the HTTPS redirect and secure cookies off."""
    return {
        "DEBUG": "false",
        "SECRET_KEY": secret_key,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DATABASE_URL": f"{SERVER_URL}/{DB_NAME}",
        "SITE_URL": "http://127.0.0.1",
        "SECURE_SSL_REDIRECT": "false",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "TAILGUARD_VAR_DIR": str(var_dir),
        "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }


# --- The database ---------------------------------------------------------------------------


def recreate_database() -> None:
    import psycopg

    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")


def drop_database() -> None:
    import psycopg

    with psycopg.connect(f"{SERVER_URL}/postgres", autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def _trace_slices(rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """Real uploads: windows of the shared Azure and Mooncake traces (a few thousand requests)."""
    azure = (TRACES / "azure2023_conv.csv").read_bytes().splitlines(keepends=True)
    mooncake = (TRACES / "mooncake_synthetic.jsonl").read_bytes().splitlines(keepends=True)
    out = []
    for i in range(NUM_ORGS * SAMPLES_PER_ORG):
        if i % 3 == 2:
            start = int(rng.integers(0, len(mooncake) - 600))
            out.append((f"mooncake-{i}.jsonl", b"".join(mooncake[start : start + 600])))
        else:
            start = int(rng.integers(1, len(azure) - 3000))
            out.append((f"azure-{i}.csv", azure[0] + b"".join(azure[start : start + 3000])))
    return out


def _windows(rng: np.random.Generator, count: int) -> list[dict[str, Any]]:
    """Scrape windows (the interval's length histograms) as `endpoint_refresh` stores them; a
    pool drawn once, since building one per snapshot made seeding slow."""
    from serving.metrics import Histogram
    from tuning.continual import LiveWindow

    prompt_bounds = (128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, float("inf"))
    output_bounds = (16.0, 32.0, 64.0, 128.0, 256.0, float("inf"))
    out = []
    for _ in range(count):
        n = int(rng.integers(15, 60))
        prompts = np.cumsum(rng.multinomial(n, [0.1, 0.25, 0.3, 0.2, 0.1, 0.05, 0.0]))
        outputs = np.cumsum(rng.multinomial(n, [0.2, 0.3, 0.3, 0.15, 0.05, 0.0]))
        out.append(
            LiveWindow(
                interval_s=float(SNAPSHOT_INTERVAL_S),
                num_requests=float(n),
                prompt_tokens=Histogram(prompt_bounds, tuple(float(c) for c in prompts), 700.0 * n, float(n)),
                output_tokens=Histogram(output_bounds, tuple(float(c) for c in outputs), 60.0 * n, float(n)),
                prefix_queries_tokens=700.0 * n,
                prefix_hits_tokens=280.0 * n,
                ttft_p95_ms=float(rng.normal(900, 80)),
            ).to_dict()
        )
    return out


def _snapshots(
    org: Any, endpoint: Any, history: timedelta, now: datetime, rng: np.random.Generator
) -> list[Any]:
    """Scrapes every 15 s over `history`: a daily cycle, noise, and a gap now and then."""
    from portal.endpoints.models import MetricSnapshot

    n = int(history.total_seconds() // SNAPSHOT_INTERVAL_S)
    t = np.arange(n)
    diurnal = 1.0 + 0.5 * np.sin(2 * np.pi * t * SNAPSHOT_INTERVAL_S / 86400)
    rps = (diurnal * 2.0 * rng.uniform(0.8, 1.2, n)).tolist()
    p50 = (300.0 + 120.0 * diurnal + rng.normal(0, 20, n)).tolist()
    gaps = (rng.random(n) < 0.002).tolist()
    pool = _windows(rng, 32)
    picks = rng.integers(0, len(pool), n).tolist()
    first = now - timedelta(seconds=SNAPSHOT_INTERVAL_S * n)
    step = timedelta(seconds=SNAPSHOT_INTERVAL_S)
    rows = []
    for i in range(n):
        taken_at = first + i * step
        if gaps[i]:
            rows.append(
                MetricSnapshot(
                    organization=org,
                    endpoint=endpoint,
                    taken_at=taken_at,
                    gap=True,
                    gap_reason="metrics unavailable: ConnectTimeout",
                )
            )
            continue
        rows.append(
            MetricSnapshot(
                organization=org,
                endpoint=endpoint,
                taken_at=taken_at,
                ttft_p50_ms=p50[i],
                ttft_p95_ms=p50[i] * 2.2,
                requests_per_s=rps[i],
                prompt_tokens_per_s=rps[i] * 700,
                generation_tokens_per_s=rps[i] * 60,
                prefix_cache_hit_rate=0.4,
                window=pool[picks[i]],
            )
        )
    return rows


def seed(rng: np.random.Generator) -> dict[str, Any]:
    """The tenant set, written through the portal's services where they exist; what only a
    running engine or worker would write (finished trials, snapshots) through the same models."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.utils import timezone

    from compliance import services as compliance_services
    from compliance.services import audit_record
    from portal.accounts import services as accounts
    from portal.accounts.models import Membership, Role
    from portal.endpoints.models import Endpoint, EndpointRevision, LoopIteration, MetricSnapshot
    from portal.jobs.models import ServedModel, Trial, TuningJob
    from portal.traffic import services as traffic
    from portal.traffic.models import TrafficSample
    from tests.portal.test_job_report import HEADROOM, PEAK_RPS, SLO, TRIALS, _selection

    browsers: list[dict[str, Any]] = []
    api_clients: list[dict[str, Any]] = []
    orgs: list[dict[str, Any]] = []
    uploads = _trace_slices(rng)
    selection = _selection()
    now = timezone.now()
    port = 40000
    started = time.monotonic()
    for o in range(NUM_ORGS):
        print(f"seeding organization {o + 1}/{NUM_ORGS} ({time.monotonic() - started:.0f} s)", flush=True)
        owner = accounts.user_signup(email=f"owner{o}@org{o}.test", password=PASSWORD, full_name=f"Owner {o}")
        org = accounts.organization_create(actor=owner, name=f"Tenant {o:02d} Voice")
        people = [owner]
        for p, role in enumerate((Role.ADMIN, Role.MEMBER, Role.MEMBER, Role.VIEWER), start=1):
            user = accounts.user_signup(
                email=f"user{p}@org{o}.test", password=PASSWORD, full_name=f"User {o}.{p}"
            )
            Membership.objects.create(organization=org, user=user, role=role)
            people.append(user)
        print(f"  people {time.monotonic() - started:.0f} s", flush=True)
        samples = []
        for s in range(SAMPLES_PER_ORG):
            name, data = uploads[o * SAMPLES_PER_ORG + s]
            sample = traffic.traffic_sample_create(
                actor=owner,
                organization=org,
                name=f"calls week {s + 1}",
                upload=SimpleUploadedFile(name, data),
            )
            sample.refresh_from_db()
            if sample.status != TrafficSample.Status.READY:
                raise RuntimeError(f"seed sample {name} did not ingest: {sample.error}")
            samples.append(sample)
        print(f"  samples {time.monotonic() - started:.0f} s", flush=True)
        model = ServedModel.objects.create(organization=org, name="llama-3.1-8b", path="/models/llama-3.1-8b")
        jobs = []
        for j in range(FINISHED_JOBS_PER_ORG + RUNNING_JOBS_PER_ORG):
            running = j >= FINISHED_JOBS_PER_ORG
            job = TuningJob.objects.create(
                organization=org,
                name=f"{'nightly' if running else 'voice agent'} tuning {j + 1}",
                traffic_sample=samples[j % len(samples)],
                served_model=model,
                spec={
                    "slo": SLO,
                    "peak_rps": PEAK_RPS,
                    "headroom": HEADROOM,
                    "hardware": "local-cpu",
                    "strategy": "tpe",
                    "budget_trials": 6,
                },
                status=TuningJob.Status.RUNNING if running else TuningJob.Status.SUCCEEDED,
                report=None if running else {"selection": selection},
                winner_trial=None if running else selection["winner"],
                created_by=owner,
            )
            for number, (assignment, label, result) in TRIALS.items():
                if running and number >= 2:
                    break
                Trial.objects.create(
                    organization=org,
                    job=job,
                    number=number,
                    assignment=assignment,
                    label=label,
                    status=Trial.Status.DONE,
                    result=result,
                )
            jobs.append(job)
        finished = [j for j in jobs if j.status == TuningJob.Status.SUCCEEDED]
        endpoints = []
        for e in range(2 if o < BIG_ORGS else 1):
            job = finished[e]
            port += 1
            endpoint = Endpoint.objects.create(
                organization=org,
                name=f"voice-endpoint-{e + 1}",
                served_model=model,
                job=job,
                config=TRIALS[job.winner_trial][0] | {"dtype": "float32"},
                port=port,
                api_key_prefix=secrets.token_hex(4),
                api_key_hash=secrets.token_hex(32),
                status=Endpoint.Status.HEALTHY,
                created_by=owner,
            )
            EndpointRevision.objects.create(
                organization=org,
                endpoint=endpoint,
                generation=1,
                config=endpoint.config,
                reason=f"deployed the winner of tuning job '{job.name}'",
                job=job,
                trial_number=job.winner_trial,
                measured_ttft_p50_ms=400.0,
                measured_ttft_p95_ms=900.0,
                measured_tokens_per_s=315.0,
            )
            compliance_services.sla_terms_set(
                actor=owner,
                endpoint=endpoint,
                target_ms=800,
            )
            for k in range(3):
                LoopIteration.objects.create(
                    organization=org,
                    endpoint=endpoint,
                    number=k + 1,
                    status=LoopIteration.Status.KEPT,
                    trigger="prompt lengths drifted",
                    job=job,
                    verdict="the running configuration stayed faster",
                    finished_at=now - timedelta(days=k + 1),
                )
            # A week of scrapes for the first endpoint of the big tenants, a day for the rest.
            history = SNAPSHOT_HISTORY if (o < BIG_ORGS and e == 0) else timedelta(days=1)
            rows = _snapshots(org, endpoint, history, now, rng)
            MetricSnapshot.objects.bulk_create(rows, batch_size=2000)
            endpoints.append(endpoint)
        print(f"  jobs, endpoints, snapshots {time.monotonic() - started:.0f} s", flush=True)
        for a in range(AUDIT_EVENTS_PER_ORG):
            audit_record(
                actor=people[a % len(people)],
                organization=org,
                action="endpoint.viewed" if a % 2 else "tuning_job.viewed",
                target=endpoints[a % len(endpoints)] if a % 2 else jobs[a % len(jobs)],
                data={"n": a},
            )
        # Four people use the browser; the owner's token is the API client (plus one more).
        for user in people[:4]:
            browsers.append({"email": user.email, "password": PASSWORD, "org": o})
        for user in (people[0], people[4]) if o < 5 else (people[0],):
            issued = accounts.api_token_create(actor=owner, organization=org, name=f"ci {user.email}")
            api_clients.append({"token": issued.secret, "org": o})
        orgs.append(
            {
                "samples": [str(s.id) for s in samples],
                "jobs": [str(j.id) for j in finished],
                "running_jobs": [str(j.id) for j in jobs if j.status == TuningJob.Status.RUNNING],
                "endpoints": [str(e.id) for e in endpoints],
            }
        )
    return {"browsers": browsers, "api_clients": api_clients, "orgs": orgs}


def seed_counts() -> dict[str, int]:
    from compliance.models import AuditEvent
    from portal.accounts.models import Organization, User
    from portal.endpoints.models import Endpoint, MetricSnapshot
    from portal.jobs.models import Trial, TuningJob
    from portal.traffic.models import TrafficSample

    return {
        "organizations": Organization.objects.count(),
        "users": User.objects.count(),
        "traffic_samples": TrafficSample.objects.count(),
        "tuning_jobs": TuningJob.objects.count(),
        "trials": Trial.objects.count(),
        "endpoints": Endpoint.objects.count(),
        "metric_snapshots": MetricSnapshot.objects.count(),
        "audit_events": AuditEvent.objects.count(),
    }


def static_assets() -> list[str]:
    """The hashed static URLs a page links to (the manifest whitenoise serves)."""
    from django.templatetags.static import static

    out = []
    for path in sorted((REPO / "static").rglob("*")):
        if path.is_file() and path.suffix in {".js", ".css"}:
            out.append(static(path.relative_to(REPO / "static").as_posix()))
    return out


# --- Watching the machine -------------------------------------------------------------------


def _busy_jiffies() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return user + nice + system + irq + softirq + steal


def _jiffies(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _group(pgid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rfind(")") + 2 :].split()[2]) == pgid:
                    out.add(int(entry.name))
    return out


class MachineWatch:
    """CPU cores used over the window: ours by part, and everybody else's."""

    def __init__(self, groups: dict[str, int]) -> None:
        self.groups = groups  # name -> process group id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._pids: dict[str, set[int]] = {name: set() for name in groups}
        self._db_pids: set[int] = set()
        self._last: dict[int, int] = {}
        self.used: dict[str, int] = {name: 0 for name in [*groups, "postgres (our database)"]}

    def _db_backends(self) -> set[int]:
        with contextlib.suppress(Exception):
            out = subprocess.run(
                [
                    "psql",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-Atc",
                    f"select pid from pg_stat_activity where datname = '{DB_NAME}'",  # noqa: S608 (a constant)
                ],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split()
            return {int(p) for p in out}
        return set()

    def _sample(self) -> None:
        for name, pgid in self.groups.items():
            self._pids[name] |= _group(pgid)
        self._db_pids |= self._db_backends()
        for name, pids in [*self._pids.items(), ("postgres (our database)", self._db_pids)]:
            for pid in pids:
                now = _jiffies(pid)
                if now:
                    self.used[name] += now - self._last.get(pid, 0)
                    self._last[pid] = now

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def __enter__(self) -> MachineWatch:
        self._sample()
        self.used = {name: 0 for name in self.used}  # only what the window uses
        self._start = (time.monotonic(), _busy_jiffies(), os.getloadavg())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall_s = time.monotonic() - self._start[0]
        self.busy = _busy_jiffies() - self._start[1]
        self.load_before = self._start[2]
        self.load_after = os.getloadavg()

    def report(self) -> dict[str, Any]:
        tck = os.sysconf("SC_CLK_TCK")
        ours = {name: round(j / tck / self.wall_s, 2) for name, j in self.used.items()}
        total = self.busy / tck / self.wall_s
        return {
            "window_s": round(self.wall_s, 1),
            "cores": os.cpu_count(),
            "machine_busy_cores": round(total, 2),
            "ours_cores": ours,
            "others_cores": round(max(0.0, total - sum(ours.values())), 2),
            "load_average_1m_before": round(self.load_before[0], 2),
            "load_average_1m_after": round(self.load_after[0], 2),
        }


# --- Running it ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {proc.returncode} before it answered")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"gunicorn did not answer {url} within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _p95(values: np.ndarray) -> float:
    return float(np.percentile(values, 95)) if values.size else float("nan")


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else float("nan")


BLOCK_S = 10.0  # the unit the intervals resample: requests close in time share the server's state


def _blocks(windows: list[dict[str, Any]], pick: Any) -> list[list[float]]:
    """Each window's kept requests cut into BLOCK_S-second blocks, `pick(record)` of each
    (records for which it gives None are left out); empty blocks stay (an idle stretch)."""
    out = []
    for w in windows:
        count = max(1, int(w["window_s"] // BLOCK_S))
        cut: list[list[float]] = [[] for _ in range(count)]
        for r in w["kept"]:
            value = pick(r)
            if value is not None:
                cut[min(count - 1, int((r["t"] - w["start"]) // BLOCK_S))].append(value)
        out += cut
    return out


def _page_ms(r: dict[str, Any]) -> float | None:
    return r["ms"] if r["kind"] in {"page", "partial"} else None


def _api_ms(r: dict[str, Any]) -> float | None:
    return r["ms"] if r["kind"] == "api" else None


def _failed(r: dict[str, Any]) -> float:
    return 1.0 if r["error"] else 0.0


def _rate(windows: list[dict[str, Any]]) -> list[list[float]]:
    """Requests per second of each block, as a one-value block."""
    return [[len(b) / BLOCK_S] for b in _blocks(windows, lambda r: 1.0)]


def figures(windows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary (each figure with its 95% interval over time blocks) and the per-route rows."""
    records = [r for w in windows for r in w["kept"]]
    summary: dict[str, Any] = {}
    for key, fig in (
        ("p95_page_ms", pooled_interval(_blocks(windows, _page_ms), _p95, digits=1)),
        ("p95_api_ms", pooled_interval(_blocks(windows, _api_ms), _p95, digits=1)),
        ("error_rate", pooled_interval(_blocks(windows, _failed), _mean, digits=5)),
        ("rps", pooled_interval(_rate(windows), _mean, digits=2)),
    ):
        summary[key] = fig["value"]
        summary[f"{key}_ci_low"] = fig["ci_low"]
        summary[f"{key}_ci_high"] = fig["ci_high"]
    cases = []
    for key in sorted({(r["kind"], r["name"]) for r in records}):
        rows = [r for r in records if (r["kind"], r["name"]) == key]
        ms = [r["ms"] for r in rows]
        failed = [r["error"] for r in rows if r["error"]]
        cases.append(
            {
                "kind": key[0],
                "route": key[1],
                "requests": len(rows),
                "errors": len(failed),
                "error_examples": sorted(set(failed))[:3],
                "p50_ms": _pct(ms, 50),
                "p95_ms": _pct(ms, 95),
                "p99_ms": _pct(ms, 99),
                "max_ms": round(max(ms), 1),
                "mean_bytes": round(float(np.mean([r["bytes"] for r in rows]))),
            }
        )
    return summary, cases


def rls_cost(app: list[dict[str, Any]], owner: list[dict[str, Any]]) -> dict[str, Any]:
    """Application role (row-level security binding) over table owner (not binding), per figure,
    with 95% intervals (each role's time blocks resampled on their own)."""
    out: dict[str, Any] = {}
    for key, pick, stat in (("p95_page_ms", _page_ms, _p95), ("p95_api_ms", _api_ms, _p95)):
        out[f"{key}_ratio"] = pooled_ratio_interval(_blocks(app, pick), _blocks(owner, pick), stat)
    out["rps_ratio"] = pooled_ratio_interval(_rate(app), _rate(owner), _mean)
    for fig in out.values():
        low, high = fig["ci_low"], fig["ci_high"]
        fig["verdict"] = (
            "no interval"
            if low is None or high is None
            else "app role slower"
            if low > 1.0
            else "app role faster"
            if high < 1.0
            else "no significant difference"
        )
    return out


def _schedule(role: str, rounds: int) -> list[str]:
    """The windows' roles: ABBA... for both (the order alternates by round), else one role."""
    if role != "both":
        return [role] * rounds
    return [r for i in range(rounds) for r in (("app", "owner") if i % 2 == 0 else ("owner", "app"))]


def load_window(
    *, role: str, args: argparse.Namespace, env: dict[str, str], tmp: Path, data: dict[str, Any]
) -> dict[str, Any]:
    """One measured window: gunicorn connecting as `role`, driven by locust; both stopped after."""
    from portal.accounts import rls

    gunicorn: subprocess.Popen[bytes] | None = None
    locust: subprocess.Popen[bytes] | None = None
    try:
        port = free_port()
        host = f"http://127.0.0.1:{port}"
        web_url = app_database_url(rls.DEFAULT_APP_ROLE) if role == "app" else env["DATABASE_URL"]
        server_env = {**os.environ, **env, "DATABASE_URL": web_url}
        server_env.pop("CELERY_TASK_ALWAYS_EAGER", None)
        gunicorn_cmd = [
            str(Path(sys.executable).with_name("gunicorn")),
            "portal.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(args.workers),
            "--worker-class",
            "gthread",
            "--threads",
            str(args.threads),
            "--max-requests",
            "0",
            "--error-logfile",
            str(tmp / "gunicorn.log"),
        ]
        gunicorn = subprocess.Popen(gunicorn_cmd, cwd=REPO, env=server_env, start_new_session=True)
        wait_until_up(f"{host}/healthz", gunicorn)

        browsers = min(len(data["browsers"]), round(args.users * 0.7))
        ramp_s = args.users / args.spawn_rate
        run_s = int(ramp_s + args.warmup_s + args.duration_s) + 1
        locust_env = {
            **server_env,
            "PORTAL_LOAD_SEED": str(tmp / "seed.json"),
            "PORTAL_LOAD_OUT": str(tmp / "requests.jsonl"),
            "PORTAL_LOAD_BROWSERS": str(browsers),
            "PORTAL_LOAD_API_CLIENTS": str(args.users - browsers),
        }
        locust_cmd = [
            str(Path(sys.executable).with_name("locust")),
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--host",
            host,
            "--users",
            str(args.users),
            "--spawn-rate",
            str(args.spawn_rate),
            "--run-time",
            f"{run_s}s",
            "--stop-timeout",
            "20",
            "--only-summary",
            "--loglevel",
            "WARNING",
        ]
        started = time.time()
        (tmp / "requests.jsonl").unlink(missing_ok=True)
        with (tmp / "locust.log").open("wb") as log:  # the child keeps its own descriptor
            locust = subprocess.Popen(
                locust_cmd, cwd=REPO, env=locust_env, start_new_session=True, stdout=log, stderr=log
            )
        window_start = started + ramp_s + args.warmup_s
        time.sleep(max(0.0, window_start - time.time()))
        with MachineWatch({"gunicorn": gunicorn.pid, "locust": locust.pid}) as watch:
            time.sleep(args.duration_s)
        window_end = time.time()
        locust.wait(timeout=run_s + 120)
        if not (tmp / "requests.jsonl").exists():
            raise RuntimeError(
                f"locust wrote no requests; see {tmp / 'locust.log'}:\n"
                + (tmp / "locust.log").read_text()[-3000:]
            )
        records = [json.loads(line) for line in (tmp / "requests.jsonl").read_text().splitlines()]
        kept = [r for r in records if window_start <= r["t"] < window_end and r["kind"] != "static"]
        sign_ins = [r for r in records if r["kind"] == "login"]
        return {
            "role": role,
            "start": window_start,
            "window_s": window_end - window_start,
            "kept": kept,
            "browsers": browsers,
            "gunicorn": " ".join(gunicorn_cmd[1:2] + gunicorn_cmd[4:10]),
            "web_database_url": web_url,
            "machine_load": watch.report(),
            "sign_in": {
                "requests": len(sign_ins),
                "errors": sum(1 for r in sign_ins if r["error"]),
                "p95_ms": _pct([r["ms"] for r in sign_ins], 95),
            },
        }
    finally:
        stop(locust)
        stop(gunicorn)


ROW_LEVEL_SECURITY = {
    "app": "binding (the web role owns nothing and has no BYPASSRLS)",
    "owner": "not binding (the baseline: the web processes connect as the superuser)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--spawn-rate", type=float, default=5.0, help="users started per second")
    parser.add_argument("--warmup-s", type=int, default=30, help="after the last user started")
    parser.add_argument("--duration-s", type=int, default=60, help="one measured window")
    parser.add_argument("--rounds", type=int, default=2, help="windows per role (1 to 6)")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--keep-db", action="store_true", help="leave tailguard_load in place")
    parser.add_argument(
        "--reuse-db", action="store_true", help="use the database a --keep-db run left (no seeding)"
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not write the result file")
    parser.add_argument(
        "--web-role",
        choices=("both", "app", "owner"),
        default="both",
        help=(
            "what gunicorn connects as: the application role, which row-level security binds "
            "(production), the tables' owner, which it does not (the baseline for its cost), or "
            "both in interleaved windows (app, owner, owner, app, ...) with the ratios"
        ),
    )
    args = parser.parse_args()
    if not (1 <= args.rounds <= 6 and 1 <= args.users <= 500 and 10 <= args.duration_s <= 1800):
        parser.error("--rounds must be 1 to 6, --users 1 to 500 and --duration-s 10 to 1800")

    # State that outlives one run when --keep-db is given, so --reuse-db can skip the seeding.
    tmp = REPO / "var" / "portal_load"
    reuse = args.reuse_db and (tmp / "seed.json").exists() and (tmp / "secret_key").exists()
    if not reuse:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "secret_key").write_text(secrets.token_urlsafe(50))
    env = environment(tmp / "var", (tmp / "secret_key").read_text())
    os.environ.update(env)
    os.environ["CELERY_TASK_ALWAYS_EAGER"] = "true"  # the seed's uploads ingest in this process
    try:
        t0 = time.monotonic()
        if not reuse:
            recreate_database()
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        if reuse:
            data = json.loads((tmp / "seed.json").read_text())
        else:
            call_command("migrate", verbosity=0)
            call_command("collectstatic", interactive=False, verbosity=0)
            data = seed(np.random.default_rng(12))
            data["static"] = static_assets()
            data["seed_s"] = round(time.monotonic() - t0, 1)
            (tmp / "seed.json").write_text(json.dumps(data))
        counts = seed_counts()
        # The web processes connect as production's: the application role, which row-level
        # security binds (every request sets its tenant in its own transaction).
        call_command("db_app_role", verbosity=0)
        connections.close_all()
        print(f"seeded in {data['seed_s']:.0f} s{' (reused)' if reuse else ''}: {counts}", flush=True)

        windows = []
        for i, role in enumerate(_schedule(args.web_role, args.rounds)):
            windows.append(load_window(role=role, args=args, env=env, tmp=tmp, data=data))
            print(f"window {i + 1} ({role}): {len(windows[-1]['kept'])} requests", flush=True)
        roles = {r: [w for w in windows if w["role"] == r] for r in dict.fromkeys(w["role"] for w in windows)}
        # The record's figures are production's (the application role) where it ran.
        measured = roles.get("app") or roles["owner"]
        summary, cases = figures(measured)
        summary["target_p95_ms"] = TARGET_P95_MS
        summary["target_met"] = bool(
            summary["error_rate"] == 0
            and all(
                (summary[f"{k}_ci_high"] if summary[f"{k}_ci_high"] is not None else summary[k] or 0)
                <= TARGET_P95_MS
                for k in ("p95_page_ms", "p95_api_ms")
            )
        )
        summary["target_rule"] = "no errors and each p95's 95% interval upper end within the target"
        out: dict[str, Any] = {
            "machine": machine_facts(),
            **git_state(REPO),
            "date": datetime.now(UTC).date().isoformat(),
            "versions": versions(),
            "command": "python " + " ".join(["benchmarks/portal_load.py", *sys.argv[1:]]),
            "summary": summary,
            "interval": f"95% bootstrap over {BLOCK_S:.0f}-second blocks of the measured windows "
            "(whole blocks resampled, their requests pooled: benchmarks/_stats.py)",
            "setup": {
                "users": args.users,
                "browser_users": windows[0]["browsers"],
                "api_users": args.users - windows[0]["browsers"],
                "spawn_rate_per_s": args.spawn_rate,
                "warmup_s": args.warmup_s,
                "windows": [
                    {
                        "role": w["role"],
                        "window_s": round(w["window_s"], 1),
                        "requests_in_window": len(w["kept"]),
                        "web_database_url": w["web_database_url"],
                        "row_level_security": ROW_LEVEL_SECURITY[w["role"]],
                        "sign_in": w["sign_in"],
                    }
                    for w in windows
                ],
                "gunicorn": windows[0]["gunicorn"],
                "settings": {k: v for k, v in env.items() if k not in {"SECRET_KEY", "TAILGUARD_VAR_DIR"}},
                "seed": counts,
                "seed_s": data["seed_s"],
                "seed_reused": bool(reuse),
                "sign_in_note": "during each window's ramp-up and warm-up (each user signs in once), outside it",
            },
            # How busy the machine was in each window: ours by part, and everybody else's.
            "machine_load": [w["machine_load"] for w in windows],
            "cases": cases,
        }
        if "app" in roles and "owner" in roles:
            owner_summary, _ = figures(roles["owner"])
            out["as_owner_summary"] = owner_summary
            out["rls_cost_app_over_owner"] = rls_cost(roles["app"], roles["owner"])
        print(json.dumps({k: out.get(k) for k in ("summary", "rls_cost_app_over_owner")}, indent=1))
        for c in cases:
            print(
                f"{c['kind']:<8} {c['route']:<48} n={c['requests']:<5} err={c['errors']:<3} "
                f"p50={c['p50_ms']:>7} p95={c['p95_ms']:>7} p99={c['p99_ms']:>7}"
            )
        if not args.no_write:
            result_file = RESULT if "app" in roles else RESULT.with_name("portal_load_as_owner.json")
            result_file.parent.mkdir(parents=True, exist_ok=True)
            result_file.write_text(json.dumps(out, indent=1) + "\n")
            print(f"wrote {result_file}")
        return 0
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if not args.keep_db:
            with contextlib.suppress(Exception):
                drop_database()


if __name__ == "__main__":
    raise SystemExit(main())
