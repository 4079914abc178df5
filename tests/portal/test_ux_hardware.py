"""One name per hardware everywhere, and a local machine priced only by its operator (issue 24
item 4).

The local CPU was `local-cpu` to tuning, pools and the job form and had another name in the
catalog, bridged by a map; it is `local-cpu` everywhere now, and stored price overrides moved with a data
migration. The catalog gives it no price: pages say "not priced" until an admin sets one, and
its trials cost 0 per token, so cost never ranks its configurations.
"""

from __future__ import annotations

import importlib
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from portal.accounts.models import User
from portal.catalog import selectors as catalog_selectors
from portal.catalog import services as catalog_services
from portal.catalog.models import HardwarePriceOverride
from portal.endpoints.selectors import deploy_summary
from portal.jobs.models import Trial, TuningJob
from portal.pools.models import Pool
from serving.catalog import HARDWARE, UnknownHardware, get_hardware
from tests.conftest import PASSWORD
from tests.factories import finished_job
from tuning.search.job import HARDWARE as TUNING_TARGETS
from tuning.search.selection import Candidate, select
from tuning.search.space import LOCAL_CPU

REPO = Path(settings.BASE_DIR)
OLD_NAME = "cpu" + "-local"  # spelled apart so that the search below does not find this file
# Files that must name the old name: the data migration that moves rows away from it.
HISTORY = ("portal/catalog/migrations/0002_local_cpu_one_name.py",)


@pytest.fixture
def operator(db) -> User:  # type: ignore[no-untyped-def]
    """A platform admin: who may price hardware."""
    return User.objects.create_user(
        email="pat@tailguard.test", password=PASSWORD, is_staff=True, staff_role=User.StaffRole.PLATFORM_ADMIN
    )


def test_tuning_targets_and_the_catalog_share_one_name_per_hardware() -> None:
    assert LOCAL_CPU.name == "local-cpu" and get_hardware("local-cpu").name == "local-cpu"
    assert set(TUNING_TARGETS) <= set(HARDWARE)
    for name, target in TUNING_TARGETS.items():
        assert get_hardware(name).name == name and target.catalog_name in (None, name)
    with pytest.raises(UnknownHardware, match="local-cpu"):
        get_hardware(OLD_NAME)  # the old name is gone, and the error names the one to use
    assert Pool._meta.get_field("accelerator").help_text.endswith("e.g. local-cpu.")


def test_no_code_or_page_uses_the_old_name() -> None:
    tracked = subprocess.run(
        ["git", "grep", "-l", "-I", OLD_NAME, "--", "*.py", "*.html", "*.js", "*.md", "serving/perf/data"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert [path for path in tracked if path not in HISTORY] == []


@pytest.mark.django_db
def test_the_data_migration_moves_stored_overrides_to_the_one_name(operator) -> None:  # type: ignore[no-untyped-def]
    migration = importlib.import_module("portal.catalog.migrations.0002_local_cpu_one_name")
    HardwarePriceOverride.objects.create(
        hardware_name=OLD_NAME, price_per_hour_usd=Decimal("0.35"), set_by=operator, set_at=timezone.now()
    )
    HardwarePriceOverride.objects.create(
        hardware_name="h200", price_per_hour_usd=Decimal("4"), set_by=operator, set_at=timezone.now()
    )
    migration.forwards(apps, None)
    rows = dict(HardwarePriceOverride.objects.values_list("hardware_name", "price_per_hour_usd"))
    assert rows == {"local-cpu": Decimal("0.3500"), "h200": Decimal("4.0000")}
    assert catalog_selectors.effective_price_per_hour("local-cpu") == (
        0.35,
        catalog_selectors.PRICE_SOURCE_OVERRIDE,
    )
    migration.backwards(apps, None)
    assert set(HardwarePriceOverride.objects.values_list("hardware_name", flat=True)) == {OLD_NAME, "h200"}
    # Both names stored (never through the service): the row under the name that stays wins.
    HardwarePriceOverride.objects.create(
        hardware_name="local-cpu", price_per_hour_usd=Decimal("1"), set_by=operator, set_at=timezone.now()
    )
    migration.forwards(apps, None)
    assert dict(HardwarePriceOverride.objects.values_list("hardware_name", "price_per_hour_usd")) == {
        "local-cpu": Decimal("1.0000"),
        "h200": Decimal("4.0000"),
    }


def _priced_job(org, user, *, price: float | None, cost: float) -> TuningJob:  # type: ignore[no-untyped-def]
    job = finished_job(org, user, name=f"price {price}")
    job.spec = {**job.spec, "hardware": "local-cpu", "price_per_hour_usd": price}
    job.save(update_fields=["spec"])
    Trial.objects.create(
        organization=org,
        job=job,
        number=1,
        assignment={"max_num_seqs": 64},
        label="max_num_seqs=64",
        status=Trial.Status.DONE,
        result={"status": "ok", "phase": "search", "cost_per_mtok_usd": cost, "slo_met": True},
    )
    return job


@pytest.mark.django_db
def test_the_local_machine_is_not_priced_until_an_admin_prices_it(  # type: ignore[no-untyped-def]
    alice, alice_org, alice_client, operator
) -> None:
    assert LOCAL_CPU.price_per_hour_usd == 0 and HARDWARE["local-cpu"].price_per_hour_usd.value == 0
    assert catalog_selectors.effective_price_per_hour("local-cpu") == (
        0.0,
        catalog_selectors.PRICE_SOURCE_UNPRICED,
    )
    assert catalog_selectors.effective_price_per_hour("h200")[1] == catalog_selectors.PRICE_SOURCE_DATASHEET
    assert catalog_selectors.job_price_per_hour("local-cpu") is None  # a job carries no invented price
    detail = alice_client.get(reverse("catalog:hardware_detail", args=["local-cpu"])).content.decode()
    assert 'data-source="unpriced"><strong>not priced</strong>' in detail and "0 USD/h" not in detail
    listing = alice_client.get(reverse("catalog:hardware_list")).content.decode()
    assert 'data-source="unpriced"><strong>not priced</strong>' in listing

    # Its jobs show no cost per token; deploying one names no price.
    unpriced = _priced_job(alice_org, alice, price=None, cost=0.0)
    trials = alice_client.get(reverse("jobs:trials", args=[unpriced.id])).content.decode()
    assert "not priced" in trials and "0.0000" not in trials
    assert deploy_summary(job=unpriced)["price"] is None
    # A price the operator set is a price; 0 (a pool without a price) is none.
    priced = _priced_job(alice_org, alice, price=0.35, cost=0.0123)
    trials = alice_client.get(reverse("jobs:trials", args=[priced.id])).content.decode()
    assert "0.0123" in trials and "not priced" not in trials
    zero = _priced_job(alice_org, alice, price=0.0, cost=0.0)
    trials = alice_client.get(reverse("jobs:trials", args=[zero.id])).content.decode()
    assert "not priced" in trials and "0.0000" not in trials

    # Its report draws no cost chart (every cost is 0) and says why.
    report = alice_client.get(reverse("jobs:report", args=[unpriced.id])).content.decode()
    assert (
        "The hardware is not priced (an admin may set a price in the catalog), so no trial has a cost."
        in report
    )

    catalog_services.hardware_price_override_set(
        actor=operator, hardware_name="local-cpu", price_per_hour_usd="0.35"
    )
    assert catalog_selectors.job_price_per_hour("local-cpu") == 0.35
    assert deploy_summary(job=unpriced)["price"] == "$0.35 per device-hour"
    detail = alice_client.get(reverse("catalog:hardware_detail", args=["local-cpu"])).content.decode()
    assert "<strong>0.35 USD/h</strong>" in detail and "(otherwise not priced)" in detail


def test_selection_on_unpriced_hardware_still_chooses_by_latency_then_simplicity() -> None:
    def candidate(trial: int, p95: float, ci: tuple[float, float], knobs: int) -> Candidate:
        return Candidate(trial, f"t{trial}", knobs, True, (), True, (), 0.0, p95 / 2, p95, ci)

    clear = select([candidate(1, 800, (780, 820), 0), candidate(2, 300, (280, 320), 2)])
    assert clear.winner == 2 and not clear.tie
    noisy = select([candidate(1, 500, (400, 600), 0), candidate(2, 480, (420, 620), 2)])
    assert noisy.winner == 1 and noisy.tie
