"""Which addresses requests to customer-supplied URLs may reach (benchmark targets; the same
rule suits any URL a user types that the platform then calls).

A URL's host is resolved (a literal address in any of the spellings the system resolver accepts,
such as `0x7f000001`, `2130706433`, `0177.0.0.1`, `127.1` or `[::ffff:127.0.0.1]`, counts as that
address) and every address it gives must be publicly routable: loopback, private, link-local
(where cloud metadata services answer), shared, multicast, unspecified and reserved addresses are
refused, as is an IPv6 address that embeds one (IPv4-mapped, 6to4, Teredo, NAT64), unless it lies
in one of the networks the operator allows.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

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


def url_problem(url: str, *, allowed: Iterable[IPNetwork], require_resolution: bool) -> str | None:
    """Why requests to `url` are refused, or None. A host name that does not resolve is a
    problem only with `require_resolution` (at the moment of connecting; a target entered now
    may be set up later)."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    allowed = list(allowed)
    literal = literal_address(host)
    if literal is not None:
        addresses: set[IPAddress] = {literal}
    else:
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError, ValueError):
            return f"the host name {host!r} does not resolve" if require_resolution else None
        addresses = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}
    for address in sorted(addresses, key=str):
        problem = address_problem(address, allowed)
        if problem is not None:
            where = "" if literal is not None else f"{host} resolves to {address}: "
            return f"{where}{problem}"
    return None
