"""API fuzzing: schemathesis against the portal's own OpenAPI schema, in-process.

The schema is loaded from `/api/schema/` through Django's WSGI application, and every operation
in it is fuzzed with positive and negative examples (schemathesis' generators), authenticated as
Alice with her API token (the benchmark reports, a staff tool, as Sam: a sales engineer who is a
member of her organization). Operations on one object are tried on each of Alice's real objects of
that kind (the isolation sweep's world: one of every kind) as well as on generated ids. Checks:

- no response is a server error (5xx);
- every response conforms to the schema: a documented status code, content type and headers,
  and a body valid against the documented schema; input that breaks the schema is refused with
  a 4xx (sent as JSON wherever an operation reads JSON; see `_strategies`);
- every request that succeeded as Alice is replayed, unchanged, with Charlie's token (owner of
  another organization): on Alice's objects it must be refused (403/404, or 400 where her id is
  in the body), and whatever he gets back must not show any of Alice's ids, names or emails.

Failures are collected rather than raised inside Hypothesis (no shrinking: every request acts
on the same database), then reported together. The examples are seeded, so a run in CI is
repeatable; `TAILGUARD_FUZZ_SEED` and `TAILGUARD_FUZZ_EXAMPLES` explore further by hand.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus

import hypothesis
import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import got_request_exception, request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS
from schemathesis.core.failures import FailureGroup

from portal.accounts import services as account_services
from tests.portal.sweep import World

pytestmark = pytest.mark.django_db

SEED = int(os.environ.get("TAILGUARD_FUZZ_SEED", "12"))
# Per operation, per object it is tried on, per generation mode.
EXAMPLES = int(os.environ.get("TAILGUARD_FUZZ_EXAMPLES", "8"))
CHECK_NAMES = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)
# Refusals of another tenant's object; 400 where the object is named in the body ("no such sample").
REFUSED = frozenset({403, 404})
REFUSED_IN_BODY = REFUSED | {400}
# Operations under this prefix are staff tools: fuzzed as Sam (a sales engineer in Alice's organization).
STAFF_PREFIX = "/api/v1/benchmark-reports/"


class InTransactionWSGI:
    """Django's WSGI application, inside the test's transaction.

    Django closes "old" database connections when a request starts and finishes; inside the
    test's atomic block that would end the transaction holding Alice's world. Django's own test
    client detaches the same handler for the same reason. Exceptions a view raises become 500
    responses as in production; their tracebacks are kept for the report.
    """

    def __init__(self) -> None:
        self.handler = WSGIHandler()
        self.tracebacks: list[str] = []
        got_request_exception.connect(self._keep, weak=False)

    def _keep(self, sender: Any, request: Any = None, **kwargs: Any) -> None:
        self.tracebacks.append(traceback.format_exc())

    def close(self) -> None:
        got_request_exception.disconnect(self._keep)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            response = self.handler(environ, start_response)
            try:
                body = b"".join(response)
            finally:
                response.close()
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)
        return [body]


@dataclass
class Tally:
    operations: set[str] = field(default_factory=set)
    requests: Counter[str] = field(default_factory=Counter)
    replays: Counter[str] = field(default_factory=Counter)  # Charlie's, per operation
    replays_on_alice: Counter[str] = field(default_factory=Counter)  # ... naming Alice's objects
    succeeded_on_alice: Counter[str] = field(default_factory=Counter)  # Alice's own successes on them
    nothing_invalid: set[str] = field(default_factory=set)  # negative variants with nothing to break
    failures: dict[tuple[str, str], str] = field(default_factory=dict)

    def fail(self, operation: str, kind: str, detail: str) -> None:
        # One report per operation and kind of failure; the first example found is kept.
        self.failures.setdefault((operation, kind), detail)


def _alice_objects(w: World) -> dict[str, list[str]]:
    """Alice's object ids by the API path that reads them (the `{id}` in the schema)."""
    return {
        "/api/v1/invitations/{id}/": [str(w.invitation.pk)],
        "/api/v1/tokens/{id}/": [str(w.token.pk)],
        "/api/v1/traffic-samples/{id}/": [str(w.sample.pk)],
        "/api/v1/tuning-jobs/{id}/": [str(w.job.pk), str(w.running_job.pk)],
        "/api/v1/tuning-jobs/{id}/cancel/": [str(w.job.pk), str(w.running_job.pk)],
        "/api/v1/compliance/baas/{id}/": [str(w.baa.pk)],
        "/api/v1/compliance/endpoints/{id}/sla/": [str(w.endpoint.pk)],
        "/api/v1/billing/usage-reports/{id}/": [str(w.usage_report.pk)],
        # Endpoints (issue 22). On commit nothing runs here, so a stop never finishes and the
        # running endpoint is never started again: no engine starts.
        "/api/v1/endpoints/{id}/": [str(w.endpoint.pk)],
        "/api/v1/endpoints/{id}/metrics/": [str(w.endpoint.pk)],
        "/api/v1/endpoints/{id}/policy/": [str(w.endpoint.pk)],
        "/api/v1/endpoints/{id}/promote/": [str(w.endpoint.pk)],
        "/api/v1/endpoints/{id}/stop/": [str(w.endpoint.pk)],
        "/api/v1/endpoints/{id}/start/": [str(w.running_endpoint.pk)],
        "/api/v1/tuning-jobs/{id}/deploy/": [str(w.job.pk), str(w.running_job.pk)],
        # Benchmark reports, as Sam (see STAFF_PREFIX); the share link's own id is generated.
        "/api/v1/benchmark-reports/{id}/": [str(w.bench_report.pk)],
        "/api/v1/benchmark-reports/{id}/result/": [str(w.bench_report.pk)],
        "/api/v1/benchmark-reports/{id}/share-links/": [str(w.bench_report.pk)],
        "/api/v1/benchmark-reports/{id}/share-links/{link_id}/": [str(w.bench_report.pk)],
    }


def _alice_body_ids(w: World) -> dict[str, dict[str, str]]:
    """Bodies that name Alice's objects (besides the generated ones)."""
    return {
        "POST /api/v1/tuning-jobs/": {
            "traffic_sample": str(w.sample.pk),
            "served_model": str(w.model.pk),
            "slo": "ttft_p50_ms<=600,ttft_p95_ms<=1500",
            "peak_rps": 2.0,
            "hardware": "h100",  # in Alice's allowed region (us)
        },
        "PUT /api/v1/me/active-organization/": {"organization": str(w.org.pk)},
        "POST /api/v1/endpoints/{id}/promote/": {"job": str(w.job.pk)},
    }


def _markers(w: World) -> set[str]:
    """What of Alice's no outsider may see: ids, names, emails, slugs."""
    values: set[str] = {str(w.org.pk), w.org.name, w.org.slug, w.alice.email, w.bob.email}
    for obj in w.objects.values():
        pk = getattr(obj, "pk", None)
        # Integer keys (a membership's) are no secret and, as text, would match any digit.
        if pk is not None and not isinstance(pk, int) and getattr(obj, "organization_id", None) == w.org.pk:
            values.add(str(pk))
        for attr in ("name", "counterparty", "idempotency_key", "email"):
            text = getattr(obj, attr, None)
            if isinstance(text, str) and len(text) >= 6 and getattr(obj, "organization_id", None) == w.org.pk:
                values.add(text)
    return values


def _sent(response: Any) -> str:
    """The request as sent, raw and URL-decoded (what it names may be echoed back)."""
    request = response.request
    body = request.body or b""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    raw = f"{request.method} {request.url}\n{body}"
    return f"{raw}\n{unquote_plus(raw)}"


def _strategies(operation: Any, w: World, headers: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """Hypothesis strategies for one operation, each with a label for the report.

    The Authorization header is fixed (Alice's token), so that a negative example is never
    "invalid" only in a header the test replaces anyway. Invalid bodies go as JSON wherever the
    operation reads JSON: a form encoding cannot say what the schema says (an empty value is
    how a form sends null; it has no nested objects or numbers), so there a "violation" would be
    the encoding's, not the server's.
    """
    path = operation.path
    label = f"{operation.method.upper()} {path}"
    objects = _alice_objects(w).get(path, [])
    variants: list[dict[str, Any] | None] = [{"id": pk} for pk in objects]
    if "{" in path:
        variants.append(None)  # generated ids too
    else:
        variants = [None]
    negative_media = (
        "application/json" if "application/json" in operation.get_request_payload_content_types() else None
    )
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        media = negative_media if mode is GenerationMode.NEGATIVE else None
        for params in variants:
            strategy = operation.as_strategy(
                generation_mode=mode, path_parameters=params, headers=headers, media_type=media
            )
            yield f"{label} [{mode.value}{' on ' + params['id'] if params else ''}]", strategy
    body = _alice_body_ids(w).get(label)
    if body is not None:
        # A positive example with Alice's ids (and otherwise valid values) filled in.
        def with_ids(case: Any) -> Any:
            if isinstance(case.body, dict):
                case.body = {**case.body, **body}
            return case

        yield f"{label} [positive, with Alice's ids]", operation.as_strategy(headers=headers).map(with_ids)


def _fuzz(strategy: Any, exercise: Any) -> None:
    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=EXAMPLES,
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        exercise(case)

    run()


def _fuzz_negative(strategy: Any, exercise: Any) -> bool:
    """False where the operation has nothing to make invalid (no parameters, no body: the
    Authorization header is fixed), which Hypothesis reports as unsatisfiable."""
    try:
        _fuzz(strategy, exercise)
    except hypothesis.errors.Unsatisfiable:
        return False
    return True


def test_api_fuzz_schema_conformance_and_tenant_replay(
    world: World,
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = world
    app = InTransactionWSGI()
    tally = Tally()
    try:
        schema = schemathesis.openapi.from_wsgi("/api/schema/", app)
        checks = [CHECKS.get_one(name) for name in CHECK_NAMES]
        conformance_checks = [
            CHECKS.get_one(name) for name in CHECK_NAMES if name != "negative_data_rejection"
        ]
        alice_secret = account_services.api_token_create(
            actor=w.alice, organization=w.org, name="fuzz-alice"
        ).secret
        alice_headers = {"Authorization": f"Bearer {alice_secret}"}
        # Benchmark reports are the sales engineers' (a 404 to Alice): Sam, a member of her
        # organization, acts on them in her place, so their successes are fuzzed and replayed too.
        sam_secret = account_services.api_token_create(
            actor=w.sam, organization=w.org, name="fuzz-sam"
        ).secret
        sam_headers = {"Authorization": f"Bearer {sam_secret}"}

        def owner_headers(path: str) -> dict[str, str]:
            return sam_headers if path.startswith(STAFF_PREFIX) else alice_headers

        charlie_headers = {"Authorization": f"Bearer {w.charlie_token}"}
        markers = _markers(w)
        body_ids = _alice_body_ids(w)
        object_ids = {pk for ids in _alice_objects(w).values() for pk in ids}

        def exercise(label: str, case: Any) -> None:
            operation = f"{case.method.upper()} {case.operation.path}"
            tally.requests[operation] += 1
            before = len(app.tracebacks)
            try:
                headers = owner_headers(case.operation.path)
                response = case.call(headers=headers)
                # A form body cannot carry every violation the generator means (an empty value
                # is "not given" in a form, a file part is bytes whatever its "format"): there
                # the answer must still conform and never be a 5xx, but need not be a refusal.
                form = bool(case.media_type) and not case.media_type.endswith("json")
                case.validate_response(
                    response, checks=conformance_checks if form else checks, headers=headers
                )
            except FailureGroup as exc:
                detail = f"({label})\n{exc}"
                if len(app.tracebacks) > before:
                    detail += "\n" + app.tracebacks[-1]
                for failure in exc.exceptions:
                    tally.fail(operation, getattr(failure, "title", type(failure).__name__), detail)
                return
            on_alice = (case.path_parameters or {}).get("id") in object_ids
            in_body = isinstance(case.body, dict) and any(
                str(case.body.get(k)) == v for k, v in body_ids.get(operation, {}).items()
            )
            # Replay as Charlie, with his own token: what succeeded for Alice, and whatever acts
            # on her objects (that may fail for Alice for other reasons, e.g. deleting a sample a
            # job uses; for Charlie it must fail because the object is not his).
            succeeded = 200 <= response.status_code < 300
            if succeeded and on_alice:
                tally.succeeded_on_alice[operation] += 1
            if not (succeeded or on_alice or in_body):
                return
            tally.requests[operation] += 1
            tally.replays[operation] += 1
            if on_alice or in_body:
                tally.replays_on_alice[operation] += 1
            replay = case.call(headers=charlie_headers)
            sent = _sent(replay)
            try:
                case.validate_response(replay, checks=conformance_checks, headers=charlie_headers)
            except FailureGroup as exc:
                title = getattr(exc.exceptions[0], "title", "check failed")
                tally.fail(operation, f"Charlie's replay: {title}", f"({label})\n{exc}")
            if on_alice and replay.status_code not in REFUSED:
                tally.fail(
                    operation,
                    "Charlie's replay acted on Alice's object",
                    f"{sent}\n-> {replay.status_code} {replay.text[:500]}",
                )
            elif in_body and replay.status_code not in REFUSED_IN_BODY:
                tally.fail(
                    operation,
                    "Charlie's replay used Alice's object named in the body",
                    f"{sent}\n-> {replay.status_code} {replay.text[:500]}",
                )
            # Bytes decoded leniently: a download (the evidence pack's zip) is not UTF-8 text.
            body = replay.content.decode(errors="replace")
            shown = [m for m in markers if m in body and m not in sent]
            if shown:
                tally.fail(
                    operation,
                    "Charlie's replay shows Alice's data",
                    f"{sent}\n-> {replay.status_code} shows {shown}: {body[:500]}",
                )

        for result in schema.get_all_operations():
            operation = result.ok()
            tally.operations.add(f"{operation.method.upper()} {operation.path}")
            for label, strategy in _strategies(operation, w, owner_headers(operation.path)):

                def run(case: Any, label: str = label) -> None:
                    exercise(label, case)

                if "[negative" in label:
                    if not _fuzz_negative(strategy, run):
                        tally.nothing_invalid.add(label)
                else:
                    _fuzz(strategy, run)
    finally:
        app.close()
    total = sum(tally.requests.values())
    with capsys.disabled():
        print(
            f"\nAPI fuzz (seed {SEED}, {EXAMPLES} examples per variant): {len(tally.operations)} operations, "
            f"{total} requests checked, of which {sum(tally.replays.values())} replays as Charlie "
            f"({sum(tally.replays_on_alice.values())} on Alice's objects); "
            f"{len(tally.nothing_invalid)} negative variants had no input to make invalid"
        )
    report = "\n\n".join(
        f"== {op}: {kind}\n{detail}" for (op, kind), detail in sorted(tally.failures.items())
    )
    assert not tally.failures, f"{len(tally.failures)} failures:\n\n{report}"
    # Not vacuous: every operation ran; each that reads, changes or names one of Alice's objects
    # was replayed as Charlie on her object; each read of one succeeded for Alice first.
    assert len(tally.operations) >= 40
    assert set(tally.requests) == tally.operations
    named = {op for op in tally.operations if op.split(" ", 1)[1] in _alice_objects(w)} | set(body_ids)
    assert {op for op in named if tally.replays_on_alice[op] == 0} == set()
    reads = {op for op in named if op.startswith("GET ")}
    assert len(reads) == 13 and {op for op in reads if tally.succeeded_on_alice[op] == 0} == set()
