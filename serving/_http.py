"""Small blocking HTTP GET for health checks, model lists and /metrics (standard library only)."""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urlsplit


def http_get(url: str, *, timeout_s: float, api_key: str | None = None) -> tuple[int, bytes]:
    """GET `url` (http or https only); returns (status, body). HTTP errors return their status."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"only http(s) endpoints are supported, not {url!r}")
    request = urllib.request.Request(url)  # noqa: S310 (scheme checked above)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (scheme checked above)
            status: int = response.status
            return status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
