"""Admins' price overrides for the hardware catalog (serving.catalog.hardware).

The catalog itself is code (datasheet figures with their sources); only what an admin decides
about it lives in the database. An override replaces the catalog's indicative hourly price
everywhere the product prices hardware, until it is cleared.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models

MAX_PRICE_PER_HOUR_USD = Decimal("1000")  # above this a device-hour price is a typo, not a price
NOTE_MAX_CHARS = 500


class HardwarePriceOverride(models.Model):
    # A key of serving.catalog.HARDWARE (the one hardware name, e.g. "local-cpu").
    hardware_name = models.CharField(max_length=64, unique=True)
    price_per_hour_usd = models.DecimalField(max_digits=10, decimal_places=4)  # per device-hour
    note = models.CharField(
        max_length=NOTE_MAX_CHARS, blank=True
    )  # why: the quote, contract or page it is from
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    set_at = models.DateTimeField()

    class Meta:
        ordering = ("hardware_name",)
        constraints = [
            models.CheckConstraint(
                condition=models.Q(price_per_hour_usd__gte=0)
                & models.Q(price_per_hour_usd__lte=MAX_PRICE_PER_HOUR_USD),
                name="catalog_price_override_in_range",
            )
        ]

    def __str__(self) -> str:
        return f"{self.hardware_name}: {self.price_per_hour_usd} USD/h"
