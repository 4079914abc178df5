"""Headless Chromium for the browser tests: Debian's package, driven by Playwright.

`browser` is one Chromium per test; `page_factory` makes pages in fresh contexts, fails the test
when the Content-Security-Policy refused anything on any of them, and keeps screenshots of a
failed test's pages in test-artifacts/. tests/conftest.py offers both to every test package.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def _chromium() -> str:
    path = (
        os.environ.get("TAILGUARD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if path is None:
        pytest.fail("Debian's chromium package is required for browser tests (make test installs it)")
    return path


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # around it are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from django.db import connections
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # Entering Playwright's sync API leaves this thread in another contextvars context, and
        # Django keeps its connections per context: the ORM calls of a browser test use
        # connections of their own, which outlive the test unless closed here (a session the
        # server ended meanwhile, as the fault tests do on purpose, would come back broken).
        connections.close_all()
        instance = pw.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()
            connections.close_all()


@pytest.fixture
def page_factory(browser, request: pytest.FixtureRequest) -> Iterator[object]:  # type: ignore[no-untyped-def]
    pages = []
    # Whatever the Content-Security-Policy refused on any page: each is a page the policy broke
    # (or an inline script that crept in), so a browser test that saw one fails.
    refused: list[str] = []

    def make():  # type: ignore[no-untyped-def]
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.on(
            "console",
            lambda message: (
                refused.append(f"{page.url}: {message.text}")
                if "Content Security Policy" in message.text
                else None
            ),
        )
        pages.append(page)
        return page

    yield make
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        for i, page in enumerate(pages):
            page.screenshot(path=str(Path(ARTIFACTS) / f"{request.node.name}-{i}.png"), full_page=True)
    for page in pages:
        page.context.close()
    assert not refused, "the Content-Security-Policy refused:\n" + "\n".join(refused)


def watched(page: Any, problems: list[str]) -> Any:
    """Collects the page's console errors and uncaught exceptions (Chromium's own request for
    /favicon.ico, which the portal does not serve, aside)."""

    def on_console(msg: Any) -> None:
        if msg.type == "error" and not str(msg.location.get("url", "")).endswith("/favicon.ico"):
            problems.append(f"{msg.text} at {msg.location.get('url', '')}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    return page


def sign_in(page: Any, base: str, email: str, password: str) -> None:
    """Signs in through the sign-in page, as a person does."""
    page.goto(base + "/login/")
    page.fill("#id_username", email)
    page.fill("#id_password", password)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/(dashboard|organizations/new)/$"))
