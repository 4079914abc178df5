"""How alert webhooks are signed, and how a receiver checks them (pure functions, no Django).

Header `Tailguard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, the scheme
Stripe uses: the timestamp inside the signed text lets the receiver refuse replays older than
its tolerance, and `v1` leaves room for a second scheme during a secret rotation.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

HEADER = "Tailguard-Signature"


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(24)


def sign(*, secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(*, secret: str, body: bytes, header: str, now: int, tolerance_s: int = 300) -> bool:
    """True when `header` signs `body` with `secret` within `tolerance_s` of `now`."""
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        fields.setdefault(key, []).append(value)
    stamps = fields.get("t", [])
    if len(stamps) != 1 or not stamps[0].isascii() or not stamps[0].isdigit() or len(stamps[0]) > 11:
        return False
    timestamp = int(stamps[0])
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret=secret, body=body, timestamp=timestamp).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, candidate) for candidate in fields.get("v1", []))
