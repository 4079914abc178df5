"""Time-based one-time passwords (RFC 6238: HMAC-SHA1, 6 digits, 30 s steps), pure functions."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct
from urllib.parse import quote, urlencode

STEP_S = 30
DIGITS = 6


def new_secret() -> str:
    """160 random bits, base32 (what authenticator apps take)."""
    return base64.b32encode(secrets.token_bytes(20)).decode().rstrip("=")


def _key(secret: str) -> bytes:
    padded = secret.upper() + "=" * (-len(secret) % 8)
    return base64.b32decode(padded)


def code_at(secret: str, step: int) -> str:
    digest = hmac.new(_key(secret), struct.pack(">Q", step), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    value = struct.unpack(">I", digest[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(value % 10**DIGITS).zfill(DIGITS)


def matching_step(
    secret: str, code: str, *, now_s: float, after_step: int = -1, drift_steps: int = 1
) -> int | None:
    """The time step the code belongs to (within +-drift), if it is later than `after_step`
    (a used code never works twice)."""
    code = (code or "").strip().replace(" ", "")
    if len(code) != DIGITS or not code.isdigit():
        return None
    current = int(now_s // STEP_S)
    for step in range(current - drift_steps, current + drift_steps + 1):
        if step > after_step and hmac.compare_digest(code_at(secret, step), code):
            return step
    return None


def provisioning_uri(secret: str, *, account: str, issuer: str = "Tailguard") -> str:
    label = quote(f"{issuer}:{account}")
    return f"otpauth://totp/{label}?" + urlencode(
        {"secret": secret, "issuer": issuer, "digits": DIGITS, "period": STEP_S}
    )
