"""Which addresses requests to customer-supplied URLs may reach, and connecting only there
(benchmark targets, alert webhooks; the same rule suits any URL a user types that the platform
then calls).

A URL's host is resolved (a literal address in any of the spellings the system resolver accepts,
such as `0x7f000001`, `2130706433`, `0177.0.0.1`, `127.1` or `[::ffff:127.0.0.1]`, counts as that
address) and every address it gives must be publicly routable: loopback, private, link-local
(where cloud metadata services answer), shared, multicast, unspecified and reserved addresses are
refused, as is an IPv6 address that embeds one (IPv4-mapped, 6to4, Teredo, NAT64), unless it lies
in one of the networks the operator allows.

Checking a name and then letting the HTTP client look it up again is open to DNS rebinding: a
name with a zero TTL answers a public address to the check and 127.0.0.1 or 169.254.169.254 to
the connection. So a request is made through `resolve_pinned`: the name is resolved once, every
address is checked, and the connection goes to a checked address while the request keeps the
URL's own name (Host header, TLS SNI and certificate check). `stream` does that for one request
with httpx, each redirect hop (if it follows any) pinned the same way; the load generator gets
the pinned addresses and connects only to those (serving.loadgen, `connect_to`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Spellings of an IPv4 address that inet_aton (and so the system resolver) reads as one.
_LEGACY_IPV4 = re.compile(r"[0-9a-fA-FxX.]+")


def parse_networks(values: Iterable[object]) -> list[IPNetwork]:
    return [ipaddress.ip_network(str(value), strict=False) for value in values]


def literal_address(host: str) -> IPAddress | None:
    """The address a host name spells literally, or None for a name to look up."""
    host = host.strip().strip("[]")
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if _LEGACY_IPV4.fullmatch(host.rstrip(".")):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
        except OSError:
            return None
    return None


def _embedded(address: IPAddress) -> list[IPAddress]:
    """The address and any IPv4 address an IPv6 one carries."""
    found: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        for inner in (address.ipv4_mapped, address.sixtofour, *(address.teredo or ())):
            if inner is not None:
                found.append(inner)
        if address in _NAT64:
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def _kind(address: IPAddress) -> str | None:
    """Why `address` is not a public destination, or None when it is."""
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (cloud metadata)"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if not address.is_global or address.is_reserved:
        return "non-public"
    return None


def address_problem(address: IPAddress, allowed: Iterable[IPNetwork]) -> str | None:
    """Why a connection to `address` is refused, or None."""
    allowed = list(allowed)
    for candidate in _embedded(address):
        if any(candidate.version == net.version and candidate in net for net in allowed):
            return None
    for candidate in _embedded(address):
        kind = _kind(candidate)
        if kind is not None:
            return f"{address} is a {kind} address"
    return None


class OutboundRefused(RuntimeError):
    """A request to a customer-supplied URL refused before anything was sent (the message says
    why: an internal address, a name that does not resolve, a redirect elsewhere)."""


class OutboundUnresolved(OutboundRefused):
    """The URL's host name does not resolve (now): nothing to check, nothing sent."""


@dataclass(frozen=True)
class Pinned:
    """Where a request to a URL connects: its host name as written and the checked addresses."""

    host: str  # the URL's host name, lower case (what Host, SNI and the certificate name)
    port: int
    addresses: tuple[str, ...]  # every address the name resolved to, each one checked


def _resolve(url: str) -> tuple[str, int, IPAddress | None, list[IPAddress]]:
    """(host, port, the literal address or None, the addresses); OSError when it does not resolve."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    literal = literal_address(host)
    if literal is not None:
        return host, port, literal, [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (UnicodeError, ValueError) as exc:
        raise OSError(str(exc)) from exc
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return host, port, None, found


def _problem(
    host: str, literal: IPAddress | None, addresses: list[IPAddress], allowed: list[IPNetwork]
) -> str | None:
    for address in sorted(addresses, key=str):
        problem = address_problem(address, allowed)
        if problem is not None:
            where = "" if literal is not None else f"{host} resolves to {address}: "
            return f"{where}{problem}"
    return None


def url_problem(url: str, *, allowed: Iterable[IPNetwork], require_resolution: bool) -> str | None:
    """Why requests to `url` are refused, or None. A host name that does not resolve is a
    problem only with `require_resolution` (at the moment of connecting; a target entered now
    may be set up later). For the check when the URL is entered: connect with `resolve_pinned`."""
    try:
        host, _port, literal, addresses = _resolve(url)
    except OSError:
        host = urlsplit(url.strip()).hostname or ""
        return f"the host name {host!r} does not resolve" if require_resolution else None
    return _problem(host, literal, addresses, list(allowed))


def resolve_pinned(url: str, *, allowed: Iterable[IPNetwork]) -> Pinned:
    """Resolves `url`'s host once and checks every address; the connection must then go to
    these addresses only. Raises OutboundRefused saying why when any address is refused or the
    name does not resolve."""
    try:
        host, port, literal, addresses = _resolve(url)
    except OSError:
        host = urlsplit(url.strip()).hostname or ""
        raise OutboundUnresolved(f"the host name {host!r} does not resolve") from None
    if not addresses:
        raise OutboundUnresolved(f"the host name {host!r} does not resolve")
    problem = _problem(host, literal, addresses, list(allowed))
    if problem is not None:
        raise OutboundRefused(problem)
    return Pinned(host=host, port=port, addresses=tuple(str(a) for a in addresses))


_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _send_pinned(
    client: httpx.Client,
    method: str,
    url: str,
    pinned: Pinned,
    *,
    headers: Mapping[str, str],
    content: bytes | None,
) -> httpx.Response:
    """One request to `url` over a connection to one of `pinned.addresses` (the next is tried
    when one refuses the connection), naming the URL's host in Host and SNI. Streamed."""
    original = httpx.URL(url)
    last: Exception | None = None
    for address in pinned.addresses:
        request = client.build_request(
            method,
            original.copy_with(host=address),
            headers={**headers, "Host": original.netloc.decode("ascii")},
            content=content,
            extensions={"sni_hostname": pinned.host} if original.scheme == "https" else {},
        )
        try:
            return client.send(request, stream=True, follow_redirects=False)
        except httpx.ConnectError as exc:
            last = exc
    assert last is not None
    raise last


@contextmanager
def stream(
    method: str,
    url: str,
    *,
    allowed: Iterable[IPNetwork],
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    max_redirects: int = 0,
) -> Iterator[httpx.Response]:
    """An httpx request to a customer-supplied URL, connected only to addresses checked for it:
    the response, streamed (its body is the caller's to read or not). Up to `max_redirects`
    redirects are followed, each to an http(s) URL whose name is resolved and checked again
    (303, and 301/302 after a POST, continue as a GET without the body, as browsers do); with
    none, a redirect is the response. Raises OutboundRefused before sending to a refused one."""
    networks = list(allowed)
    current, verb, body = url, method.upper(), content
    sent_headers: dict[str, Any] = dict(headers or {})
    with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
        for hop in range(max_redirects + 1):
            if urlsplit(current).scheme not in {"http", "https"}:
                raise OutboundRefused(
                    f"a redirect to {urlsplit(current).scheme or 'a relative'} URL is not followed"
                )
            pinned = resolve_pinned(current, allowed=networks)
            response = _send_pinned(client, verb, current, pinned, headers=sent_headers, content=body)
            location = response.headers.get("Location")
            if response.status_code not in _REDIRECTS or not location or hop == max_redirects:
                try:
                    yield response
                finally:
                    response.close()
                return
            response.close()
            following = urljoin(current, location)
            if urlsplit(following).hostname != urlsplit(current).hostname:
                # Credentials meant for one host are not handed to another.
                sent_headers = {
                    k: v for k, v in sent_headers.items() if k.lower() not in {"authorization", "cookie"}
                }
            if response.status_code == 303 or (response.status_code in {301, 302} and verb == "POST"):
                verb, body = "GET", None
                sent_headers = {
                    k: v
                    for k, v in sent_headers.items()
                    if k.lower() not in {"content-type", "content-length"}
                }
            current = following
