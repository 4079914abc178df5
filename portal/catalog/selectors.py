"""Reads of the catalog app: the hardware and model catalogs as pages show them, and prices.

The effective price of a device is an admin's override where one is set, else the catalog's
datasheet price. Tuning targets and the catalog share one name per hardware (`local-cpu`, `h200`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from compliance.views import _is_platform_admin
from portal.catalog.models import HardwarePriceOverride
from serving.catalog import HARDWARE, MODELS, Figure, Hardware, UnknownHardware, get_hardware

PRICE_SOURCE_OVERRIDE = "override"
PRICE_SOURCE_DATASHEET = "datasheet"
# The operator's own machine (the catalog's `local-cpu`) has no datasheet price: it is priced
# only when an admin sets one. Its price reads as 0 where a number is needed (cost per token then
# ties at 0 and never ranks configurations) and as "not priced" wherever a person reads it.
PRICE_SOURCE_UNPRICED = "unpriced"
FORMATS = ("bf16", "fp8", "fp4")  # throughput columns and weight-size columns, in this order


def user_is_platform_admin(user: Any) -> bool:
    """Who may change catalog prices: exactly who may open the compliance console (its own check,
    imported so the two staff pages cannot drift apart)."""
    return _is_platform_admin(user)


def catalog_hardware(name: str) -> Hardware:
    """The catalog entry for a hardware name; `UnknownHardware` otherwise."""
    return get_hardware(name)


def price_override_get(*, hardware_name: str) -> HardwarePriceOverride | None:
    return HardwarePriceOverride.objects.select_related("set_by").filter(hardware_name=hardware_name).first()


def _datasheet_priced(hardware: Hardware) -> bool:
    return hardware.price_per_hour_usd.value > 0


def effective_price_per_hour(hardware_name: str) -> tuple[float, str]:
    """(USD per device-hour, "override", "datasheet" or "unpriced") for a hardware name;
    unpriced hardware reads 0."""
    hardware = catalog_hardware(hardware_name)
    override = price_override_get(hardware_name=hardware.name)
    if override is not None:
        return float(override.price_per_hour_usd), PRICE_SOURCE_OVERRIDE
    if not _datasheet_priced(hardware):
        return 0.0, PRICE_SOURCE_UNPRICED
    return hardware.price_per_hour_usd.value, PRICE_SOURCE_DATASHEET


def job_price_per_hour(hardware_name: str) -> float | None:
    """The price a new tuning job on this target carries: an admin's override, else None.

    Without an override a job keeps its tuning target's own price (None in `JobSpec`); a target
    the catalog does not know has no override (the job's own validation names the target).
    """
    try:
        price, source = effective_price_per_hour(hardware_name)
    except UnknownHardware:
        return None
    return price if source == PRICE_SOURCE_OVERRIDE else None


@dataclass(frozen=True)
class PriceView:
    """What a page shows about one device's price."""

    effective_usd: Decimal
    source: str  # PRICE_SOURCE_OVERRIDE, PRICE_SOURCE_DATASHEET or PRICE_SOURCE_UNPRICED
    datasheet: Figure  # the catalog's price and its provenance, shown beside an override
    override: HardwarePriceOverride | None

    @property
    def is_override(self) -> bool:
        return self.override is not None

    @property
    def is_priced(self) -> bool:
        # An override of 0 (the service refuses one now; older rows may hold it) is no price.
        return self.source != PRICE_SOURCE_UNPRICED and self.effective_usd > 0

    @property
    def effective_text(self) -> str:
        return usd_text(self.effective_usd)

    @property
    def datasheet_text(self) -> str:
        return usd_text(self.datasheet.value)


def usd_text(value: Decimal | float) -> str:
    """A price as written: no trailing zeros ("4.54", "0.35", "1000")."""
    return format(Decimal(str(value)).normalize(), "f")


def _price_view(hardware: Hardware, override: HardwarePriceOverride | None) -> PriceView:
    if override is not None:
        return PriceView(
            override.price_per_hour_usd, PRICE_SOURCE_OVERRIDE, hardware.price_per_hour_usd, override
        )
    value = Decimal(str(hardware.price_per_hour_usd.value))
    source = PRICE_SOURCE_DATASHEET if _datasheet_priced(hardware) else PRICE_SOURCE_UNPRICED
    return PriceView(value, source, hardware.price_per_hour_usd, None)


def _overrides() -> dict[str, HardwarePriceOverride]:
    return {o.hardware_name: o for o in HardwarePriceOverride.objects.select_related("set_by")}


def _row(hardware: Hardware, override: HardwarePriceOverride | None) -> dict[str, Any]:
    figures = [
        hardware.memory_gb,
        hardware.memory_bandwidth_gbps,
        hardware.interconnect_gbps,
        hardware.price_per_hour_usd,
        *hardware.dense_tflops.values(),
    ]
    return {
        "hardware": hardware,
        "tflops": [hardware.dense_tflops.get(fmt) for fmt in FORMATS],
        "price": _price_view(hardware, override),
        "all_confirmed": all(f.confirmed for f in figures),
        "num_unconfirmed": sum(not f.confirmed for f in figures),
        "region_codes": sorted(hardware.region_codes()),
    }


def hardware_rows() -> list[dict[str, Any]]:
    """Every catalog device with its figures and effective price, in catalog order."""
    overrides = _overrides()
    return [_row(hw, overrides.get(name)) for name, hw in HARDWARE.items()]


_FIGURE_LABELS = {
    "memory_gb": "Memory",
    "memory_bandwidth_gbps": "Memory bandwidth",
    "interconnect_gbps": "Interconnect bandwidth",
    "price_per_hour_usd": "Datasheet price per device-hour",
}


def hardware_detail(*, name: str) -> dict[str, Any]:
    """One device: every figure with its source, date and whether it is confirmed; its regions."""
    hardware = catalog_hardware(name)
    row = _row(hardware, price_override_get(hardware_name=hardware.name))
    figures = [
        {
            "key": key,
            "label": _FIGURE_LABELS.get(key) or f"Dense {key.removeprefix('dense_tflops.')} throughput",
            "figure": figure,
        }
        for key, figure in hardware.figures().items()
    ]
    return {**row, "figures": figures, "regions": hardware.regions}


def model_rows() -> list[dict[str, Any]]:
    """Every catalog model: size, weight bytes per format, KV-cache bytes per token."""
    return [
        {
            "model": spec,
            "num_parameters": spec.num_parameters(),
            "num_active_parameters": spec.num_active_parameters(),
            "weight_gb": [spec.weight_bytes(fmt) / 1e9 for fmt in FORMATS],
            "kv_bytes_per_token": {fmt: spec.kv_bytes_per_token(fmt) for fmt in ("bf16", "fp8")},
        }
        for spec in MODELS.values()
    ]
