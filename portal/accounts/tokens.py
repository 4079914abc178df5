"""Secrets in links and API tokens: generated here, stored only as sha256 digests."""

from __future__ import annotations

import hashlib
import hmac
import secrets

API_TOKEN_PREFIX = "tg_"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def matches(secret: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(secret), stored_digest)


def new_link_secret() -> str:
    return secrets.token_urlsafe(32)


def new_api_token() -> tuple[str, str]:
    """Returns (lookup prefix, full token). The prefix is public; the whole token is the secret."""
    prefix = secrets.token_hex(4)
    return prefix, f"{API_TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"


def split_api_token(token: str) -> str | None:
    """The lookup prefix of a well-formed token, or None."""
    if not token.startswith(API_TOKEN_PREFIX):
        return None
    prefix, sep, rest = token[len(API_TOKEN_PREFIX) :].partition("_")
    if not sep or len(prefix) != 8 or not rest:
        return None
    return prefix
