"""Smoke journey in a real headless Chromium (Debian's package, driven by Playwright)."""

from __future__ import annotations

import re

import pytest
from django.core import mail

from tests.browser import browser, page_factory
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The names other browser tests still import from here; tests/conftest.py offers both to all.
__all__ = ["browser", "page_factory"]


def test_signup_org_invite_switch_and_tokens(live_server, page_factory, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SITE_URL = live_server.url
    base = live_server.url
    alice = page_factory()
    alice.goto(base + "/signup/")
    alice.fill("#id_email", "alice@acme.test")
    alice.fill("#id_full_name", "Alice")
    alice.fill("#id_password", PASSWORD)
    alice.click("button:has-text('Sign up')")
    alice.wait_for_url(re.compile(r"/organizations/new/$"))
    alice.fill("#id_name", "Acme Voice")
    alice.click("button:has-text('Create organization')")
    alice.wait_for_url(re.compile(r"/dashboard/$"))
    assert alice.text_content("#org-name") == "Acme Voice"

    # An API token, created through htmx and shown once, then revoked.
    alice.click("nav >> text=API tokens")
    alice.fill("#id_name", "deploy")
    alice.click("button:has-text('Create token')")
    secret = alice.text_content("#new-token-secret")
    assert secret is not None and secret.startswith("tg_")
    # Revoking is a confirmation step: it says which token, then a red button revokes it.
    alice.click("tr[data-token] summary:has-text('Revoke')")
    assert "cannot be restored" in (alice.text_content("tr[data-token] .confirm-box") or "")
    alice.click("tr[data-token] button.danger:has-text('Revoke')")
    alice.wait_for_selector("tr[data-token] >> text=revoked")
    alice.reload()
    assert secret not in alice.content()

    # Invite Bob by email link; he signs up through it and can switch organizations.
    alice.click("nav >> text=Members")
    alice.fill("#id_email", "bob@acme.test")
    alice.select_option("#id_role", "viewer")
    alice.click("button:has-text('Send invitation')")
    alice.wait_for_selector("text=Invitation sent to bob@acme.test")
    link = next(line for line in mail.outbox[-1].body.splitlines() if "/invitations/accept/" in line)
    link = link[link.index("http") :].strip()

    bob = page_factory()
    bob.goto(link)
    bob.click("a.button:has-text('Create an account')")
    bob.fill("#id_email", "bob@acme.test")
    bob.fill("#id_password", PASSWORD)
    bob.click("button:has-text('Sign up')")
    bob.wait_for_url(re.compile(r"/invitations/accept/"))
    bob.click("button:has-text('Accept invitation')")
    bob.wait_for_url(re.compile(r"/dashboard/$"))
    assert bob.text_content("#org-name") == "Acme Voice"
    assert "viewer" in (bob.text_content("main") or "")

    bob.click("a:has-text('New organization')")
    bob.fill("#id_name", "Bob Labs")
    bob.click("button:has-text('Create organization')")
    bob.wait_for_url(re.compile(r"/dashboard/$"))
    assert bob.text_content("#org-name") == "Bob Labs"
    bob.select_option("#org-select", label="Acme Voice (viewer)")
    bob.click("#org-switch button")
    bob.wait_for_selector("#org-name:has-text('Acme Voice')")

    # The used link now explains itself.
    bob.goto(link)
    bob.click("button:has-text('Accept invitation')")
    assert "already been used" in (bob.text_content("#invitation-error") or "")


def test_upload_a_shared_trace_and_read_its_profile(  # type: ignore[no-untyped-def]
    live_server, page_factory, shared_traces, settings, tmp_path
) -> None:
    from portal.accounts import services

    settings.TRAFFIC_STAGING_DIR = tmp_path / "staging"
    user = services.user_signup(email="carol@voice.test", password=PASSWORD)
    services.organization_create(actor=user, name="Voice Health")
    page = page_factory()
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", "carol@voice.test")
    page.fill("#id_password", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/dashboard/$"))
    # A new organization's dashboard says what to do first, and its button leads there.
    assert page.get_attribute("#step-sample-uploaded", "data-state") == "todo"
    page.click("#step-sample-uploaded a.button")
    page.wait_for_url(re.compile(r"/traffic/#upload-form$"))
    page.fill("#id_name", "mooncake sample")
    page.set_input_files("#id_file", str(shared_traces / "mooncake_synthetic.jsonl"))
    page.click("button:has-text('Upload')")
    page.wait_for_selector("#sample-status[data-status='ready']")
    assert page.text_content("#num-requests") == "3993"
    for chart in ("arrival", "input", "output", "interarrival", "reuse", "concurrency"):
        page.wait_for_selector(f"#chart-{chart}[data-rendered='true'] .main-svg")
    # The checklist has moved on: the sample is in and profiled; registering a model is next.
    page.click("nav >> text=Dashboard")
    page.wait_for_url(re.compile(r"/dashboard/$"))
    assert page.get_attribute("#step-sample-uploaded", "data-state") == "done"
    assert page.get_attribute("#step-sample-ready", "data-state") == "done"
    assert "step-next" in (page.get_attribute("#step-model", "class") or "")
