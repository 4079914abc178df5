"""Reads of the benchmarks app: who may use it, the report lists, and one report's view data."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from portal.accounts.models import User
from portal.benchmarks.attribution import attribution_for
from portal.benchmarks.measure import ERROR_KINDS, level_label, safe_error_example
from portal.benchmarks.models import BenchmarkReport, BenchmarkShareLink
from portal.traffic.models import TrafficSample

# Staff roles that build benchmark reports (the compliance console admits platform admins only).
_BENCHMARK_ROLES = {User.StaffRole.SALES_ENGINEER, User.StaffRole.PLATFORM_ADMIN}


def user_is_benchmark_staff(user: Any) -> bool:
    """Sales engineers and platform admins (and superusers): `is_staff` with a staff role."""
    if not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
        return False
    if getattr(user, "is_superuser", False):
        return True
    return bool(getattr(user, "is_staff", False) and getattr(user, "staff_role", "") in _BENCHMARK_ROLES)


def benchmark_report_list() -> QuerySet[BenchmarkReport]:
    """Every organization's reports, newest first (staff only; views check who asks)."""
    return (
        BenchmarkReport.objects.select_related("organization", "created_by")
        .prefetch_related("targets")
        .defer("results")
    )


def benchmark_sample_choices() -> QuerySet[TrafficSample]:
    """Samples a report can replay: validated ones, of any organization."""
    return (
        TrafficSample.objects.filter(status=TrafficSample.Status.READY)
        .select_related("organization")
        .defer("charts")
        .order_by("organization__name", "-created_at")
    )


def benchmark_share_links(*, report: BenchmarkReport) -> QuerySet[BenchmarkShareLink]:
    return report.share_links.select_related("created_by", "revoked_by")


def share_link_state(link: BenchmarkShareLink) -> str:
    if link.revoked_at is not None:
        return "revoked"
    return "expired" if link.expires_at <= timezone.now() else "active"


def _error_rows(cell: dict[str, Any]) -> list[dict[str, Any]]:
    errors = cell.get("errors") or {}
    examples = cell.get("error_examples") or {}
    return [
        {
            "kind": kind,
            "label": ERROR_KINDS.get(kind, kind),
            "count": count,
            # Reports stored before bodies were withheld still hold them: filtered here too.
            "example": safe_error_example(kind, str(examples.get(kind, ""))),
        }
        for kind, count in errors.items()
    ]


def benchmark_report_view(*, report: BenchmarkReport) -> dict[str, Any]:
    """What the report page and the charts need, targets in the order they were entered.

    `levels[i]["rows"]` has one row per target, with `cell` None where that replay has not run
    yet (a report in progress); a finished report has every cell, failures included."""
    targets = [
        {
            "id": str(t.id),
            "name": t.name,
            "model": t.model,
            "base_url": t.base_url,
            "pricing": t.pricing,
            "price_label": t.price_label,
            "has_api_key": t.has_api_key,
            "send_ignore_eos": t.send_ignore_eos,
        }
        for t in report.targets.all()
    ]
    results = report.results or {}
    levels = []
    for level in results.get("levels") or []:
        cells = level.get("cells") or {}
        rows = []
        for target in targets:
            cell = cells.get(target["id"])
            rows.append(
                {"target": target, "cell": cell, "error_rows": _error_rows(cell) if cell is not None else []}
            )
        levels.append(
            {
                "multiplier": level["multiplier"],
                "rate_rps": level["rate_rps"],
                "label": level_label(level["multiplier"], level["rate_rps"]),
                "num_requests_planned": level.get("num_requests_planned"),
                "rows": rows,
            }
        )
    return {
        "report": report,
        "targets": targets,
        "levels": levels,
        "conditions": results.get("conditions") or {},
        "attribution": attribution_for(report.traffic_source),
    }
