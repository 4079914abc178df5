"""The continual loop's policy for one endpoint: whether it re-tunes on its own, and its limits.

`portal.endpoints.loop` reads these fields on every tick; this module is their only writer.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from compliance.services import audit_record
from portal.accounts.models import Role, User
from portal.accounts.services import require_role
from portal.endpoints.models import Endpoint

# Field -> (smallest, largest, what the error says). The cool-down's upper bound keeps the
# value inside the database's integer and is far beyond any useful pause (30 days).
POLICY_LIMITS: dict[str, tuple[int, int, str]] = {
    "retune_cooldown_s": (60, 30 * 86_400, "The cool-down must be between 60 s and 30 days (2592000 s)."),
    "retune_max_per_day": (0, 48, "Re-tuning jobs per day must be between 0 and 48."),
    "retune_budget_trials": (2, 20, "The budget must be between 2 and 20 trials per re-tuning job."),
    "detect_window_s": (30, 3600, "The detection window must be between 30 and 3600 s."),
}
POLICY_FIELDS = ("auto_retune", *POLICY_LIMITS)


def policy_values(endpoint: Endpoint) -> dict[str, Any]:
    return {name: getattr(endpoint, name) for name in POLICY_FIELDS}


def endpoint_policy_set(
    *,
    actor: User,
    endpoint: Endpoint,
    auto_retune: bool,
    retune_cooldown_s: int,
    retune_max_per_day: int,
    retune_budget_trials: int,
    detect_window_s: int,
) -> Endpoint:
    """Set the endpoint's re-tuning policy (members and above). Every value is checked before
    anything is written; a change is audited with the values before and after it."""
    require_role(
        actor=actor, organization=endpoint.organization, minimum=Role.MEMBER, doing="change re-tuning policy"
    )
    values: dict[str, Any] = {
        "auto_retune": auto_retune,
        "retune_cooldown_s": retune_cooldown_s,
        "retune_max_per_day": retune_max_per_day,
        "retune_budget_trials": retune_budget_trials,
        "detect_window_s": detect_window_s,
    }
    errors: dict[str, str] = {}
    if not isinstance(auto_retune, bool):
        errors["auto_retune"] = "Automatic re-tuning must be on or off."
    for name, (low, high, message) in POLICY_LIMITS.items():
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            errors[name] = message
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        # Only the policy's columns are written: the loop and the watcher update others meanwhile.
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        before = policy_values(locked)
        changed = {name: value for name, value in values.items() if before[name] != value}
        if changed:
            Endpoint.objects.filter(pk=endpoint.pk).update(**changed)
            audit_record(
                actor=actor,
                organization=endpoint.organization,
                action="endpoint.policy_set",
                target=endpoint,
                data={"changed": changed},
                before=before,
                after=values,
            )
    for name, value in values.items():
        setattr(endpoint, name, value)
    return endpoint
