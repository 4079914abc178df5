"""`{% onboarding_checklist organization %}`: the first-steps list on the dashboard.

A template tag, so the dashboard (in `portal.accounts`, which the traffic, jobs and endpoints
apps import) shows it without importing them back.
"""

from __future__ import annotations

from typing import Any

from django import template

from portal.onboarding.selectors import onboarding_checklist as checklist_for

register = template.Library()


@register.inclusion_tag("onboarding/_checklist.html")
def onboarding_checklist(organization: Any) -> dict[str, Any]:
    return {"checklist": checklist_for(organization=organization)}
