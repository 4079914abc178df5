"""Outbound requests to customer-supplied URLs connect only where they were checked (issue 27
finding 4, issue 23 item 6).

Alert webhooks and benchmark targets resolve the URL's name once, refuse loopback, private,
link-local and metadata addresses (unless ALERT_WEBHOOK_ALLOWED_NETWORKS or
BENCHMARK_ALLOWED_NETWORKS lists the network), and connect to the address they checked. A name
that answers a harmless address to the check and an internal one to the connection (DNS
rebinding) gets the request to the harmless one only; redirects are checked the same way.
Receivers are real HTTP servers on loopback; "localhost" is a name that resolves to them.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from django.core.exceptions import ValidationError

from portal import outbound
from portal.accounts.models import Organization, User
from portal.alerts import services as alerts
from portal.alerts.models import AlertDelivery, AlertKind
from portal.benchmarks import services as benchmarks
from serving.loadgen.client import PreparedRequest
from serving.loadgen.runner import run_prepared

REBIND = "rebind.customer.test"


class Server:
    """An HTTP server on one loopback address that records what reaches it and answers with
    `status` (and `location`, for a redirect)."""

    def __init__(self, host: str, port: int = 0, *, status: int = 200, location: str = "") -> None:
        self.seen: list[dict[str, str]] = []
        self.status, self.location = status, location
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.seen.append({"method": self.command, "path": self.path, "host": self.headers["Host"]})
                self.send_response(server.status)
                if server.location:
                    self.send_header("Location", server.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pair() -> Iterator[tuple[Server, Server]]:
    """A harmless server on 127.0.0.1 and an "internal" one on 127.0.0.2, on the same port."""
    harmless = Server("127.0.0.1")
    internal = Server("127.0.0.2", harmless.port)
    yield harmless, internal
    harmless.close()
    internal.close()


@pytest.fixture
def rebinding(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """REBIND answers 127.0.0.1 to its first lookup and 127.0.0.2 to every later one (a zero-TTL
    name under an attacker's control). Returns the log of its lookups."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def resolver(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == REBIND:
            address = "127.0.0.1" if not lookups else "127.0.0.2"
            lookups.append(address)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 80)))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    return lookups


# --- The guard itself -----------------------------------------------------------------------------


def test_localhost_is_refused_unless_the_operator_allows_it() -> None:
    with pytest.raises(outbound.OutboundRefused, match=r"localhost resolves to .*loopback"):
        outbound.resolve_pinned("http://localhost:8000/hook", allowed=[])
    pinned = outbound.resolve_pinned(
        "http://LocalHost:8000/hook", allowed=outbound.parse_networks(["127.0.0.0/8", "::1/128"])
    )
    assert pinned.host == "localhost" and pinned.port == 8000
    assert "127.0.0.1" in pinned.addresses
    with pytest.raises(outbound.OutboundUnresolved):
        outbound.resolve_pinned("http://does-not-resolve.invalid/", allowed=[])


def test_a_request_goes_to_the_address_checked_with_the_names_host_header(
    pair: tuple[Server, Server], rebinding: list[str]
) -> None:
    harmless, internal = pair
    allowed = outbound.parse_networks(["127.0.0.1/32"])
    with outbound.stream(
        "POST", f"http://{REBIND}:{harmless.port}/hook", allowed=allowed, timeout_s=5
    ) as response:
        assert response.status_code == 200
    assert rebinding == ["127.0.0.1"]  # looked up once
    assert harmless.seen == [{"method": "POST", "path": "/hook", "host": f"{REBIND}:{harmless.port}"}]
    assert internal.seen == []
    # The next request looks the name up again, gets the internal address, and is refused.
    with (
        pytest.raises(outbound.OutboundRefused, match=r"127\.0\.0\.2 is a loopback address"),
        outbound.stream("POST", f"http://{REBIND}:{harmless.port}/hook", allowed=allowed, timeout_s=5),
    ):
        pass
    assert internal.seen == []


def test_redirects_are_checked_hop_by_hop() -> None:
    internal = Server("127.0.0.2")
    target = Server("127.0.0.1", status=200)
    hop = Server("127.0.0.1", status=302, location=f"http://localhost:{target.port}/landed")
    inside = Server("127.0.0.1", status=307, location=f"http://127.0.0.2:{internal.port}/admin")
    try:
        allowed = outbound.parse_networks(["127.0.0.1/32", "::1/128"])
        # Followed to an allowed address: the POST becomes a GET (302), Host names the new host.
        with outbound.stream(
            "POST",
            f"http://localhost:{hop.port}/",
            allowed=allowed,
            timeout_s=5,
            content=b"{}",
            max_redirects=2,
        ) as response:
            assert response.status_code == 200
        assert target.seen == [{"method": "GET", "path": "/landed", "host": f"localhost:{target.port}"}]
        # A redirect to an address outside the allowed networks is refused before it is sent.
        with (
            pytest.raises(outbound.OutboundRefused, match=r"127\.0\.0\.2 is a loopback address"),
            outbound.stream(
                "POST", f"http://127.0.0.1:{inside.port}/", allowed=allowed, timeout_s=5, max_redirects=2
            ),
        ):
            pass
        # Not following at all: the redirect is the answer.
        with outbound.stream(
            "POST", f"http://127.0.0.1:{inside.port}/", allowed=allowed, timeout_s=5
        ) as response:
            assert response.status_code == 307
        assert internal.seen == []
    finally:
        for server in (internal, target, hop, inside):
            server.close()


def _tls_files(tmp_path: Any, name: str) -> tuple[str, str, str]:
    """A test CA and a certificate for `name` that it signed: (CA file, certificate, key)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Tailguard test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = (tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem")
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(files[0]), str(files[1]), str(files[2])


def test_over_tls_the_pinned_connection_names_the_host_and_checks_its_certificate(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, pair: tuple[Server, Server], rebinding: list[str]
) -> None:
    import ssl

    import certifi

    harmless, internal = pair
    ca_file, cert, key = _tls_files(tmp_path, REBIND)
    monkeypatch.setattr(certifi, "where", lambda: ca_file)  # the platform trusts the test CA
    server_names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: server_names.append(name)  # type: ignore[assignment,func-returns-value]
    tls = Server("127.0.0.1")
    tls.httpd.socket = context.wrap_socket(tls.httpd.socket, server_side=True)
    try:
        allowed = outbound.parse_networks(["127.0.0.1/32"])
        with outbound.stream(
            "POST", f"https://{REBIND}:{tls.port}/hook", allowed=allowed, timeout_s=5
        ) as response:
            assert response.status_code == 200
        # Connected to the checked address, yet TLS named the host (SNI) and its certificate
        # was checked against that name, not against the address.
        assert server_names == [REBIND] and rebinding == ["127.0.0.1"]
        assert tls.seen == [{"method": "POST", "path": "/hook", "host": f"{REBIND}:{tls.port}"}]
        assert harmless.seen == [] and internal.seen == []
    finally:
        tls.close()
    # A certificate for another name is refused: the pinned address does not bypass the check.
    (tmp_path / "other").mkdir()
    other_ca, other_cert, other_key = _tls_files(tmp_path / "other", "someone-else.test")
    impostor = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    impostor.load_cert_chain(other_cert, other_key)
    monkeypatch.setattr(certifi, "where", lambda: other_ca)
    fake = Server("127.0.0.1")
    fake.httpd.socket = impostor.wrap_socket(fake.httpd.socket, server_side=True)
    try:
        rebinding.clear()
        with (
            pytest.raises(httpx.ConnectError, match="certificate"),
            outbound.stream(
                "POST",
                f"https://{REBIND}:{fake.port}/hook",
                allowed=outbound.parse_networks(["127.0.0.0/8"]),
                timeout_s=5,
            ),
        ):
            pass
        assert fake.seen == []
    finally:
        fake.close()


# --- Alert webhooks -------------------------------------------------------------------------------


def _channel(alice: User, org: Organization, url: str) -> Any:
    return alerts.alert_channel_create(
        actor=alice, organization=org, kind="webhook", name="hook", target=url, kinds=list(AlertKind.values)
    )


def _raise(org: Organization, subject: str) -> AlertDelivery:
    alerts.alert_raise(
        organization=org, kind=AlertKind.SLA_BREACHED, subject=subject, summary="SLA breached", data={}
    )
    return AlertDelivery.objects.filter(alert__subject=subject).get()


@pytest.mark.django_db
def test_a_webhook_to_localhost_is_refused_unless_allowed(
    settings: Any, alice: User, alice_org: Organization
) -> None:
    receiver = Server("127.0.0.1")
    try:
        url = f"http://localhost:{receiver.port}/hook"
        settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = []
        with pytest.raises(ValidationError, match="loopback"):
            _channel(alice, alice_org, url)
        settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]
        _channel(alice, alice_org, url)
        delivery = _raise(alice_org, "s:1")
        assert alerts.alert_delivery_send(delivery_id=delivery.id) == "delivered"
        assert [r["host"] for r in receiver.seen] == [f"localhost:{receiver.port}"]

        # The operator withdraws the allowance: the next alert is refused at send time.
        settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = []
        refused = _raise(alice_org, "s:2")
        assert alerts.alert_delivery_send(delivery_id=refused.id) == "retry"
        refused.refresh_from_db()
        assert "Alerts are not sent to internal addresses" in refused.last_error
        assert "loopback" in refused.last_error
        assert len(receiver.seen) == 1
    finally:
        receiver.close()


@pytest.mark.django_db
def test_a_rebinding_webhook_name_reaches_only_the_address_checked(
    settings: Any, alice: User, alice_org: Organization, pair: tuple[Server, Server], rebinding: list[str]
) -> None:
    harmless, internal = pair
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    _channel(alice, alice_org, f"http://{REBIND}:{harmless.port}/hook")
    rebinding.clear()  # the check when the channel was made does not count: the send's does
    delivery = _raise(alice_org, "s:rebind")
    assert alerts.alert_delivery_send(delivery_id=delivery.id) == "delivered"
    assert rebinding == ["127.0.0.1"] and len(harmless.seen) == 1 and internal.seen == []


# --- Benchmark targets -----------------------------------------------------------------------------


def _replay_cell(url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def replay_trace(**kwargs: Any) -> Any:
        calls.append(kwargs)
        raise RuntimeError("stops here: the load generator's pins are what is checked")

    monkeypatch.setattr("serving.loadgen.api.replay_trace", replay_trace)
    monkeypatch.setattr(benchmarks, "_api_key", lambda target: "")
    report = SimpleNamespace(id="r", max_prompt_tokens=None, max_output_tokens=None, request_timeout_s=5)
    target = SimpleNamespace(id="t", base_url=url, position=0, model="m", send_ignore_eos=False)
    cell = benchmarks._replay_cell(report, target, None, None, level=0, planned=3)  # type: ignore[arg-type]
    return cell, calls


def _posts(server: Server) -> list[dict[str, str]]:
    """The requests `server` saw, without the load generator's connection warm-up GETs."""
    return [r for r in server.seen if r["method"] == "POST"]


def _send(url: str, connect_to: dict[str, Any]) -> list[Any]:
    request = PreparedRequest(
        index=0, scheduled_s=0.0, url=url, body=b"{}", num_prompt_tokens=1, max_output_tokens=1
    )
    results, _, _ = asyncio.run(
        run_prepared([request], headers={}, request_timeout_s=5, connect_to=connect_to)
    )
    return results


def test_a_benchmark_target_on_localhost_is_refused_unless_allowed(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Server("127.0.0.1")
    try:
        url = f"http://localhost:{receiver.port}/v1"
        settings.BENCHMARK_ALLOWED_NETWORKS = []
        cell, calls = _replay_cell(url, monkeypatch)
        assert calls == [] and cell["errors"] == {"client": 3}
        assert cell["error_examples"]["client"].startswith("Not sent: localhost resolves to")

        settings.BENCHMARK_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]
        _cell, calls = _replay_cell(url, monkeypatch)
        (pins,) = [c["connect_to"] for c in calls]
        assert set(pins) == {"localhost"} and "127.0.0.1" in pins["localhost"]
        # The load generator with those pins reaches the receiver, naming the host it was given.
        _send(f"http://localhost:{receiver.port}/v1/chat/completions", pins)
        # The connection it opened ahead (GET /v1/models) and the request, both to that host.
        assert [(r["method"], r["path"]) for r in receiver.seen] == [
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
        ]
        assert {r["host"] for r in receiver.seen} == {f"localhost:{receiver.port}"}
    finally:
        receiver.close()


def test_the_load_generator_connects_only_to_the_pinned_addresses(
    settings: Any, monkeypatch: pytest.MonkeyPatch, pair: tuple[Server, Server], rebinding: list[str]
) -> None:
    harmless, internal = pair
    settings.BENCHMARK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    _cell, calls = _replay_cell(f"http://{REBIND}:{harmless.port}/v1", monkeypatch)
    (pins,) = [c["connect_to"] for c in calls]
    assert pins == {REBIND: ("127.0.0.1",)} and rebinding == ["127.0.0.1"]
    # The name would now answer 127.0.0.2; the load generator never asks it again.
    _send(f"http://{REBIND}:{harmless.port}/v1/chat/completions", pins)
    assert rebinding == ["127.0.0.1"] and len(_posts(harmless)) == 1 and internal.seen == []
    # A name the run was not pinned to is not looked up or connected to at all.
    (result,) = _send(f"http://localhost:{internal.port}/v1/chat/completions", pins)
    assert result.error and result.error.startswith("ClientConnectorDNSError")
    assert len(_posts(harmless)) == 1 and internal.seen == []
