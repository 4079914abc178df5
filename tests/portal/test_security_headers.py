"""Content-Security-Policy and companion headers (issue 27 finding 14).

The attack: markup that reaches a page (a stored name, a reflected parameter, a compromised
partial) runs as script. The policy allows scripts only from the portal's origin or with the
response's nonce; no page needs more (the browser tests fail on any refusal the policy makes,
see tests/portal/test_browser.py), and no template may bring an inline script or handler back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db

TEMPLATES = Path(settings.BASE_DIR) / "templates"
# Saved by the person and opened from disk, where no header applies (plotly.js is inlined).
OFFLINE_FILES = {"jobs/report_standalone.html"}
_INLINE_SCRIPT = re.compile(r"<script\b(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I)
_HANDLER = re.compile(r"<[a-z][^>]*\son[a-z]+\s*=", re.I)


def _directives(header: str) -> dict[str, list[str]]:
    out = {}
    for part in header.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def test_pages_carry_a_policy_that_runs_only_the_portals_scripts(alice_client: Client) -> None:
    seen_nonces = set()
    for path in ("/", "/login/", "/dashboard/", "/members/", "/api/v1/me/"):
        response = alice_client.get(path)
        assert response.status_code < 400, path
        policy = _directives(response["Content-Security-Policy"])
        scripts = policy["script-src"]
        assert "'self'" in scripts and "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
        nonce = next(v for v in scripts if v.startswith("'nonce-"))
        seen_nonces.add(nonce)
        assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]
        assert policy["frame-ancestors"] == ["'none'"]
        assert policy["form-action"][0] == "'self'"
        assert "camera=()" in response["Permissions-Policy"]
        assert response["Cross-Origin-Resource-Policy"] == "same-origin"
    assert len(seen_nonces) == 5  # a new nonce every response


def test_an_injected_script_in_stored_data_is_neither_markup_nor_allowed(alice_client: Client) -> None:
    payload = "<script>fetch('/api/v1/tokens/')</script>"
    from portal.accounts.models import Organization

    Organization.objects.update(name=payload)
    body = alice_client.get("/dashboard/").content.decode()
    assert payload not in body and "&lt;script&gt;" in body


def test_the_api_pages_start_their_inline_scripts_with_the_nonce(client: Client) -> None:
    response = client.get("/api/docs/")
    assert response.status_code == 200
    nonce = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"]).group(1)  # type: ignore[union-attr]
    body = response.content.decode()
    inline = _INLINE_SCRIPT.findall(body)
    assert inline and all(f'nonce="{nonce}"' in tag for tag in inline)
    redoc = client.get("/api/redoc/").content.decode()
    assert "fonts.googleapis.com" not in redoc


def test_no_template_brings_an_inline_script_or_event_handler() -> None:
    problems = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        name = path.relative_to(TEMPLATES).as_posix()
        if name in OFFLINE_FILES:
            continue
        text = path.read_text()
        for tag in _INLINE_SCRIPT.findall(text):
            if "nonce=" not in tag:
                problems.append(f"{name}: inline script {tag}")
        if _HANDLER.search(text):
            problems.append(f"{name}: an on...= event handler attribute")
        if "javascript:" in text.lower():
            problems.append(f"{name}: a javascript: URL")
    assert not problems, "\n".join(problems)
