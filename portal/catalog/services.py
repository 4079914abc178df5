"""Writes of the catalog app: platform admins set and clear hardware price overrides.

Prices are platform-wide (every tenant's jobs are priced by them), so the audit events go to the
platform's chain, with the price before and after; the admin's note is kept on the row and only
digested into the trail.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from compliance.services import audit_record
from portal.accounts.models import User
from portal.catalog.models import MAX_PRICE_PER_HOUR_USD, NOTE_MAX_CHARS, HardwarePriceOverride
from portal.catalog.selectors import catalog_hardware, user_is_platform_admin
from serving.catalog import HARDWARE, UnknownHardware

_PLACES = Decimal("0.0001")  # the column's decimal places


def _require_platform_admin(actor: User, doing: str) -> None:
    if not user_is_platform_admin(actor):
        raise PermissionDenied(f"Only platform admins may {doing}.")


def _hardware_name(value: str) -> str:
    try:
        return catalog_hardware((value or "").strip()).name
    except UnknownHardware:
        raise ValidationError(
            {"hardware_name": f"Unknown hardware {value!r}; the catalog has: {', '.join(sorted(HARDWARE))}."}
        ) from None


def _price(value: Any) -> Decimal:
    try:
        price = value if isinstance(value, Decimal) else Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise ValidationError({"price_per_hour_usd": "Enter the price per device-hour in USD."}) from None
    if not price.is_finite():
        raise ValidationError({"price_per_hour_usd": "Enter the price per device-hour in USD."})
    if price < 0:
        raise ValidationError({"price_per_hour_usd": "A price cannot be negative."})
    if price == 0:
        # 0 is no price: costs per token would all be 0 and rank nothing. Clearing the override
        # returns the device to its datasheet price, or to "not priced" where it has none.
        raise ValidationError(
            {"price_per_hour_usd": "A price must be above 0 USD; to remove a price, clear the override."}
        )
    if price > MAX_PRICE_PER_HOUR_USD:
        raise ValidationError(
            {
                "price_per_hour_usd": f"{price} USD per device-hour is not a plausible price "
                f"(at most {MAX_PRICE_PER_HOUR_USD}); enter the price of one device, not of a node or a month."
            }
        )
    if price != price.quantize(_PLACES):
        raise ValidationError({"price_per_hour_usd": "Use at most 4 decimal places."})
    return price.quantize(_PLACES)


def _state(override: HardwarePriceOverride | None) -> dict[str, Any] | None:
    if override is None:
        return None
    return {"price_per_hour_usd": str(override.price_per_hour_usd), "note": override.note}


def hardware_price_override_set(
    *, actor: User, hardware_name: str, price_per_hour_usd: Decimal | str | float, note: str = ""
) -> HardwarePriceOverride:
    """Set (or replace) the price of one catalog device; every new job on it is priced by it."""
    _require_platform_admin(actor, "override hardware prices")
    # Every field's problem at once, so the form shows them all.
    errors: dict[str, list[str]] = {}
    name, price = "", Decimal(0)
    try:
        name = _hardware_name(hardware_name)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    try:
        price = _price(price_per_hour_usd)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    note = (note or "").strip()
    if len(note) > NOTE_MAX_CHARS:
        errors["note"] = [f"Keep the note to {NOTE_MAX_CHARS} characters."]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        before = HardwarePriceOverride.objects.select_for_update().filter(hardware_name=name).first()
        previous = _state(before)
        override, _created = HardwarePriceOverride.objects.update_or_create(
            hardware_name=name,
            defaults={"price_per_hour_usd": price, "note": note, "set_by": actor, "set_at": timezone.now()},
        )
        audit_record(
            actor=actor,
            action="catalog.price_override_set",
            target=override,
            data={
                "hardware": name,
                "price_per_hour_usd": str(price),
                "previous_override_usd": previous["price_per_hour_usd"] if previous else None,
                "datasheet_usd": HARDWARE[name].price_per_hour_usd.value,
            },
            before=previous,
            after=_state(override),
        )
    return override


def hardware_price_override_clear(*, actor: User, hardware_name: str) -> None:
    """Remove a device's override; its datasheet price applies again."""
    _require_platform_admin(actor, "override hardware prices")
    name = _hardware_name(hardware_name)
    with transaction.atomic():
        override = HardwarePriceOverride.objects.select_for_update().filter(hardware_name=name).first()
        if override is None:
            raise ValidationError({"hardware_name": f"{name} has no price override to clear."})
        previous = _state(override)
        audit_record(
            actor=actor,
            action="catalog.price_override_clear",
            target=override,
            data={
                "hardware": name,
                "previous_override_usd": str(override.price_per_hour_usd),
                "datasheet_usd": HARDWARE[name].price_per_hour_usd.value,
            },
            before=previous,
        )
        override.delete()
