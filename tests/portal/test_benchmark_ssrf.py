"""Issue 27, finding 4: benchmark targets were a server-side request forgery. Loopback,
link-local (cloud metadata), private, `[::1]` and hex- or decimal-spelled addresses were
accepted, and an internal service's response body appeared on the report page."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

from portal import outbound
from portal.benchmarks import measure, services
from portal.benchmarks.selectors import _error_rows

INTERNAL_URLS = [
    "http://127.0.0.1:8000/v1",
    "http://localhost:8000/v1",
    "http://[::1]:8000/v1",
    "http://0x7f000001/v1",
    "http://2130706433/v1",
    "http://0177.0.0.1/v1",
    "http://127.1/v1",
    "http://0.0.0.0:8000",
    "http://169.254.169.254/latest/meta-data",
    "http://[fe80::1]/v1",
    "http://10.0.0.5:8000",
    "http://192.168.1.1/v1",
    "http://172.16.0.1/v1",
    "http://100.100.100.200/v1",  # shared address space (a cloud's metadata service)
    "http://[::ffff:127.0.0.1]/v1",
    "http://[::ffff:7f00:1]/v1",
    "http://[64:ff9b::a9fe:a9fe]/v1",  # NAT64 spelling of 169.254.169.254
    "http://[2002:7f00:1::]/v1",  # 6to4 spelling of 127.0.0.1
    "http://[fd00:ec2::254]/v1",
    "http://224.0.0.1/v1",
]


def _spec(url: str) -> services.TargetSpec:
    return services.TargetSpec(
        name="Target", base_url=url, model="m", pricing="hourly", price_per_hour_usd=services.Decimal("2")
    )


@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_internal_targets_are_refused_when_entered(url: str, settings: Any) -> None:
    settings.BENCHMARK_ALLOWED_NETWORKS = []
    errors = services.target_spec_errors(_spec(url))
    assert "must be public endpoints" in errors.get("base_url", ""), (url, errors)


def test_public_and_not_yet_resolvable_targets_are_accepted(settings: Any) -> None:
    settings.BENCHMARK_ALLOWED_NETWORKS = []
    for url in ("http://8.8.8.8/v1", "https://[2606:4700:4700::1111]/v1", "https://api.provider.example/v1"):
        assert services.target_spec_errors(_spec(url)) == {}, url


def test_the_operator_allows_listed_networks_only(settings: Any) -> None:
    settings.BENCHMARK_ALLOWED_NETWORKS = ["127.0.0.0/8", "10.1.0.0/16"]
    for url in ("http://127.0.0.1:8000/v1", "http://0x7f000001/v1", "http://10.1.2.3/v1"):
        assert services.target_spec_errors(_spec(url)) == {}, url
    for url in ("http://10.2.0.1/v1", "http://169.254.169.254/", "http://[::1]/v1"):
        assert "base_url" in services.target_spec_errors(_spec(url)), url


def test_a_name_is_checked_again_when_the_replay_connects(settings: Any, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A name entered while it pointed elsewhere (or nowhere) is resolved again just before
    the replay: refused when it now points inside, or does not resolve; nothing is sent."""
    settings.BENCHMARK_ALLOWED_NETWORKS = []
    real = socket.getaddrinfo

    def rebinding(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.provider.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 80))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    url = "http://rebind.provider.example/v1"
    assert "link-local" in (services.target_address_problem(url, at_connect=True) or "")
    assert "does not resolve" in (
        services.target_address_problem("https://api.provider.example/v1", at_connect=True) or ""
    )

    def no_replay(**kwargs: Any) -> Any:
        raise AssertionError("the load generator was started against a refused address")

    monkeypatch.setattr("serving.loadgen.api.replay_trace", no_replay)
    report = SimpleNamespace(id="r", max_prompt_tokens=None, max_output_tokens=None, request_timeout_s=5)
    target = SimpleNamespace(id="t", base_url=url, position=0)
    cell = services._replay_cell(report, target, None, None, level=0, planned=7)  # type: ignore[arg-type]
    assert cell["errors"] == {"client": 7}
    assert cell["error_examples"]["client"].startswith("Not sent: rebind.provider.example resolves to")


def test_response_bodies_never_reach_the_report() -> None:
    from serving.loadgen.results import RequestResult

    secret = "internal-admin-token=hunter2"
    failures = [
        f"HTTP 500: <html>{secret}</html>",
        f"HTTP 403: {secret}",
        f"stream error: {{'message': '{secret}'}}",
        f"SomeError: {secret}",
    ]
    requests = [
        RequestResult(
            index=i,
            scheduled_s=0.0,
            send_lateness_ms=0.0,
            num_prompt_tokens=1,
            num_prompt_tokens_reported=None,
            max_output_tokens=1,
            num_output_tokens=0,
            ttft_ms=None,
            e2e_ms=None,
            tpot_ms=None,
            error=error,
        )
        for i, error in enumerate(failures)
    ]
    result = SimpleNamespace(
        requests=requests,
        started_at=None,
        summary=SimpleNamespace(
            num_requests=4,
            num_ok=0,
            num_errors=4,
            error_rate=1.0,
            duration_s=1.0,
            offered_rate_rps=4.0,
            request_throughput_rps=0.0,
            output_throughput_tps=0.0,
            input_throughput_tps=0.0,
            send_lateness_ms=SimpleNamespace(p99=0.0),
        ),
    )
    cell = measure.cell_from_replay(result, price=measure.Price(pricing="hourly", per_hour_usd=1.0), rng=None)  # type: ignore[arg-type]
    assert secret not in str(cell)
    assert cell["error_examples"] == {
        "stream_error": "error event in the stream",
        "http_4xx": "HTTP 403",
        "http_5xx": "HTTP 500",
        "other": "SomeError",
    }
    # A report stored before this fix still holds a body: the page shows the status only.
    stored = {"errors": {"http_5xx": 3}, "error_examples": {"http_5xx": f"HTTP 500: {secret}"}}
    assert [row["example"] for row in _error_rows(stored)] == ["HTTP 500"]


def test_literal_spellings() -> None:
    assert str(outbound.literal_address("0x7f000001")) == "127.0.0.1"
    assert str(outbound.literal_address("2130706433")) == "127.0.0.1"
    assert str(outbound.literal_address("0177.0.0.1")) == "127.0.0.1"
    assert str(outbound.literal_address("[::1]")) == "::1"
    assert outbound.literal_address("face.example") is None
    assert outbound.literal_address("api.provider.example") is None
