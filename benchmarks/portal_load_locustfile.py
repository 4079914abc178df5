"""Locust users for `benchmarks/portal_load.py` (run by it; not on its own).

Two kinds of user, each on its own seeded account (read from the JSON file that
`PORTAL_LOAD_SEED` names): people in a browser, signed in with their password, who open the
dashboard, a traffic profile, a tuning job (polling its trials every 2 s while it runs, as the
page's htmx does), a job report and an endpoint dashboard (its live panel refreshed every 15 s,
as on the page), with a few seconds' reading between pages; and API clients with a bearer
token walking the main list and detail routes. Every request is written, with its start time,
to the JSONL file `PORTAL_LOAD_OUT` when locust quits, so the driver computes the figures from
raw latencies (and leaves out the warm-up).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import threading
import time
from typing import Any

from locust import HttpUser, between, events, task

SEED = json.loads(open(os.environ["PORTAL_LOAD_SEED"]).read())  # noqa: SIM115 (read once at import)
OUT = os.environ["PORTAL_LOAD_OUT"]
BROWSERS = SEED["browsers"]  # [{"email", "password", "org": index}]
API_CLIENTS = SEED["api_clients"]  # [{"token", "org": index}]
ORGS = SEED["orgs"]  # [{"samples": [...], "jobs": [...], "running_jobs": [...], "endpoints": [...]}]

_records: list[tuple[float, str, str, float, int, str]] = []
_lock = threading.Lock()
_browser_ids = itertools.count()
_api_ids = itertools.count()
_CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@events.request.add_listener
def _record(  # type: ignore[no-untyped-def]
    request_type, name, response_time, response_length, exception, context, start_time=None, **kw
) -> None:
    kind = (context or {}).get("kind", "page")
    with _lock:
        _records.append(
            (
                start_time or time.time(),
                kind,
                name,
                float(response_time),
                int(response_length or 0),
                "" if exception is None else str(exception)[:300],
            )
        )


@events.quitting.add_listener
def _dump(environment: Any, **kw: Any) -> None:
    with _lock, open(OUT, "w") as f:
        for started, kind, name, ms, length, error in _records:
            f.write(
                json.dumps(
                    {"t": started, "kind": kind, "name": name, "ms": ms, "bytes": length, "error": error}
                )
                + "\n"
            )


def _check(response: Any, *, login_page_ok: bool = False) -> None:
    """A request that lands on the sign-in page lost its session: an error, not a page."""
    if response.status_code >= 400:
        response.failure(f"HTTP {response.status_code}")
    elif not login_page_ok and "/login/" in response.url:
        response.failure("redirected to the sign-in page")
    else:
        response.success()


class Browser(HttpUser):
    """A customer in the portal: reads a page, clicks on, sometimes stays on a live page."""

    fixed_count = int(os.environ.get("PORTAL_LOAD_BROWSERS", "35"))
    wait_time = between(2, 6)

    def on_start(self) -> None:
        account = BROWSERS[next(_browser_ids) % len(BROWSERS)]
        self.org = ORGS[account["org"]]
        with self.client.get(
            "/login/", name="login page", catch_response=True, context={"kind": "login"}
        ) as r:
            _check(r, login_page_ok=True)
            token = _CSRF.search(r.text)
        with self.client.post(
            "/login/",
            data={
                "username": account["email"],
                "password": account["password"],
                "csrfmiddlewaretoken": token.group(1) if token else "",
            },
            headers={"Referer": self.host + "/login/"},
            name="login",
            catch_response=True,
            context={"kind": "login"},
        ) as r:
            _check(r)
        # A browser fetches the page assets once and then has them cached.
        for asset in ("/vendor/plotly.min.js", *SEED["static"]):
            self.client.get(asset, name="static", context={"kind": "static"})

    def _page(self, url: str, name: str, **headers: str) -> None:
        with self.client.get(
            url,
            name=name,
            headers=headers or None,
            catch_response=True,
            context={"kind": "partial" if headers else "page"},
        ) as r:
            _check(r)

    def _htmx(self, url: str, name: str, current: str) -> None:
        self._page(url, name, **{"HX-Request": "true", "HX-Current-URL": self.host + current})

    @task(4)
    def dashboard(self) -> None:
        self._page("/dashboard/", "/dashboard/")

    @task(2)
    def traffic(self) -> None:
        self._page("/traffic/", "/traffic/")
        sample = random.choice(self.org["samples"])
        self._page(f"/traffic/{sample}/", "/traffic/[id]/")

    @task(3)
    def job(self) -> None:
        self._page("/jobs/", "/jobs/")
        job = random.choice(self.org["jobs"])
        self._page(f"/jobs/{job}/", "/jobs/[id]/")

    @task(2)
    def running_job(self) -> None:
        # The job page of a running job polls its trials every 2 s while someone watches it.
        job = random.choice(self.org["running_jobs"])
        self._page(f"/jobs/{job}/", "/jobs/[id]/")
        for _ in range(random.randint(2, 5)):
            time.sleep(2)
            self._htmx(f"/jobs/{job}/trials/", "/jobs/[id]/trials/ (htmx)", f"/jobs/{job}/")

    @task(2)
    def report(self) -> None:
        job = random.choice(self.org["jobs"])
        self._page(f"/jobs/{job}/report/", "/jobs/[id]/report/")

    @task(3)
    def endpoint(self) -> None:
        self._page("/endpoints/", "/endpoints/")
        endpoint = random.choice(self.org["endpoints"])
        rng = random.choices(["1h", "6h", "24h", "7d"], weights=[6, 2, 2, 1])[0]
        url = f"/endpoints/{endpoint}/" + ("" if rng == "1h" else f"?range={rng}")
        self._page(url, f"/endpoints/[id]/?range={rng}")
        # The live panel refreshes itself every 15 s; some people leave the page open.
        if random.random() < 0.3:
            time.sleep(15)
            self._htmx(f"/endpoints/{endpoint}/?range={rng}", f"/endpoints/[id]/?range={rng} (htmx)", url)

    @task(1)
    def compliance(self) -> None:
        self._page("/compliance/", "/compliance/")


class ApiClient(HttpUser):
    """A script or CI job using an API token."""

    fixed_count = int(os.environ.get("PORTAL_LOAD_API_CLIENTS", "15"))
    wait_time = between(1, 3)

    def on_start(self) -> None:
        account = API_CLIENTS[next(_api_ids) % len(API_CLIENTS)]
        self.org = ORGS[account["org"]]
        self.client.headers["Authorization"] = f"Bearer {account['token']}"

    def _get(self, url: str, name: str) -> None:
        with self.client.get(url, name=name, catch_response=True, context={"kind": "api"}) as r:
            _check(r)

    @task(2)
    def me(self) -> None:
        self._get("/api/v1/me/", "/api/v1/me/")

    @task(3)
    def samples(self) -> None:
        self._get("/api/v1/traffic-samples/", "/api/v1/traffic-samples/")
        sample = random.choice(self.org["samples"])
        self._get(f"/api/v1/traffic-samples/{sample}/", "/api/v1/traffic-samples/[id]/")

    @task(4)
    def jobs(self) -> None:
        self._get("/api/v1/tuning-jobs/", "/api/v1/tuning-jobs/")
        job = random.choice(self.org["jobs"] + self.org["running_jobs"])
        self._get(f"/api/v1/tuning-jobs/{job}/", "/api/v1/tuning-jobs/[id]/")

    @task(1)
    def models(self) -> None:
        self._get("/api/v1/models/", "/api/v1/models/")

    @task(1)
    def members(self) -> None:
        self._get("/api/v1/members/", "/api/v1/members/")

    @task(1)
    def audit(self) -> None:
        self._get("/api/v1/compliance/audit-events/", "/api/v1/compliance/audit-events/")

    @task(1)
    def sla(self) -> None:
        endpoint = random.choice(self.org["endpoints"])
        self._get(f"/api/v1/compliance/endpoints/{endpoint}/sla/", "/api/v1/compliance/endpoints/[id]/sla/")
