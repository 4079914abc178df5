"""Accounts reaches compliance only through its port: filled at startup, loud when empty."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from compliance.accounts_port import AccountsCompliance
from compliance.models import AuditEvent
from portal.accounts import ports, services


def test_compliance_fills_the_port_when_django_starts() -> None:
    assert isinstance(ports.compliance(), AccountsCompliance)


@pytest.mark.django_db
def test_an_empty_port_refuses_the_change_instead_of_leaving_it_unaudited() -> None:
    filled = ports.compliance()
    ports._COMPLIANCE.clear()
    try:
        with pytest.raises(ImproperlyConfigured, match="INSTALLED_APPS"):
            services.user_signup(email="nobody@example.com", password="a long passphrase 9", full_name="")
    finally:
        ports.register(filled)
    # The signup's transaction rolled back with the missing audit event: no account, no event.
    assert not services.User.objects.filter(email="nobody@example.com").exists()
    assert not AuditEvent.objects.filter(action="user.signup").exists()


@pytest.mark.django_db
def test_account_events_reach_the_audit_chain_through_the_port() -> None:
    user = services.user_signup(email="ada@example.com", password="a long passphrase 9", full_name="Ada")
    organization = services.organization_create(actor=user, name="Analytical Engines")
    actions = list(AuditEvent.objects.order_by("created_at").values_list("action", flat=True))
    assert actions == ["user.signup", "organization.create"]
    recent = ports.compliance().recent_events(organization=organization, limit=10)
    assert [event.action for event in recent] == ["organization.create"]
