"""A pool created without a price is "not priced", exactly like the operator's own machine; a
set price is above 0, in the services, the API, the admin form and the database (issue 20,
issue 27: "prices validated > 0 where cost is computed")."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from rest_framework.test import APIClient

from compliance.models import AuditEvent
from portal.accounts.models import User
from portal.endpoints.selectors import deploy_summary
from portal.jobs.models import Trial, TuningJob
from portal.jobs.selectors import job_is_priced
from portal.pools import services
from portal.pools.admin import PoolAdmin, PoolAdminForm
from portal.pools.models import Pool
from tests.factories import finished_job

REFUSED = "Give a price above 0 and at most 10000 USD per device-hour, or leave it empty for a pool that is not priced."


@pytest.fixture
def platform_admin(db) -> User:  # type: ignore[no-untyped-def]
    return User.objects.create_superuser(email="ops@tailguard.test", password="x" * 20)


def _api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _state() -> tuple[list[tuple[str, Decimal | None]], int]:
    return list(Pool.objects.values_list("name", "price_per_device_hour_usd")), AuditEvent.objects.count()


@pytest.mark.django_db
def test_a_pool_without_a_price_is_not_priced(platform_admin) -> None:  # type: ignore[no-untyped-def]
    pool = services.pool_create(actor=platform_admin, name="cpu", region="local", accelerator="local-cpu")
    pool.refresh_from_db()
    assert pool.price_per_device_hour_usd is None and pool.price_per_host_hour_usd is None
    priced = services.pool_create(
        actor=platform_admin,
        name="cpu-priced",
        region="local",
        accelerator="local-cpu",
        devices_per_host=2,
        price_per_device_hour_usd="0.5",
    )
    assert priced.price_per_host_hour_usd == pytest.approx(1.0)
    # Set back to "not priced" with an empty value.
    assert (
        services.pool_update(
            actor=platform_admin, pool=priced, price_per_device_hour_usd=""
        ).price_per_host_hour_usd
        is None
    )


@pytest.mark.django_db
@pytest.mark.parametrize("price", ["0", "0.0000", "-1", "nan", "abc", "10001"])
def test_the_service_refuses_a_price_that_is_not_above_zero(platform_admin, price: str) -> None:  # type: ignore[no-untyped-def]
    pool = services.pool_create(actor=platform_admin, name="cpu", region="local", accelerator="local-cpu")
    state = _state()
    with pytest.raises(ValidationError) as info:
        services.pool_create(
            actor=platform_admin,
            name="cpu-b",
            region="local",
            accelerator="local-cpu",
            price_per_device_hour_usd=price,
        )
    assert info.value.message_dict == {"price_per_device_hour_usd": [REFUSED]}
    with pytest.raises(ValidationError):
        services.pool_update(actor=platform_admin, pool=pool, price_per_device_hour_usd=price)
    assert _state() == state


@pytest.mark.django_db
def test_the_api_refuses_a_zero_price_and_takes_none_as_not_priced(alice, alice_org, bob) -> None:  # type: ignore[no-untyped-def]
    body = {
        "name": "acme-cpu",
        "region": "local",
        "accelerator": "local-cpu",
        "price_per_device_hour_usd": "0",
    }
    state = _state()
    response = _api(alice).post("/api/v1/pools/", body, format="json")
    assert response.status_code == 400, response.content
    assert REFUSED in str(response.json())
    assert _state() == state
    # Bob (viewer) is refused before the price is looked at; nothing changes either.
    assert (
        _api(bob)
        .post("/api/v1/pools/", {**body, "price_per_device_hour_usd": "1"}, format="json")
        .status_code
        == 403
    )
    assert _state() == state

    created = _api(alice).post(
        "/api/v1/pools/", {k: v for k, v in body.items() if k != "price_per_device_hour_usd"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["price_per_device_hour_usd"] is None
    state = _state()
    refused = _api(alice).patch("/api/v1/pools/acme-cpu/", {"price_per_device_hour_usd": "0"}, format="json")
    assert refused.status_code == 400 and REFUSED in str(refused.json())
    assert _state() == state
    changed = _api(alice).patch(
        "/api/v1/pools/acme-cpu/", {"price_per_device_hour_usd": "2.5"}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["price_per_device_hour_usd"] == "2.5000"
    cleared = _api(alice).patch("/api/v1/pools/acme-cpu/", {"price_per_device_hour_usd": None}, format="json")
    assert cleared.status_code == 200 and cleared.json()["price_per_device_hour_usd"] is None


@pytest.mark.django_db
def test_the_admin_form_refuses_a_zero_price_and_leaves_it_empty_by_default(db) -> None:  # type: ignore[no-untyped-def]
    data = {
        "name": "cpu",
        "region": "local",
        "accelerator": "local-cpu",
        "devices_per_host": 1,
        "endpoint_url_template": "http://127.0.0.1:{port}",
        "bind_address": "127.0.0.1",
        "runner": "local",
        "enabled": True,
    }
    form = PoolAdminForm(data={**data, "price_per_device_hour_usd": "0"})
    assert not form.is_valid()
    assert form.errors == {"price_per_device_hour_usd": [REFUSED]}
    empty = PoolAdminForm(data=data)
    assert empty.is_valid(), empty.errors
    assert empty.cleaned_data["price_per_device_hour_usd"] is None
    assert PoolAdminForm().initial.get("price_per_device_hour_usd") is None
    # The admin's list says so, as the catalog does.
    listing = PoolAdmin(Pool, admin.site)
    assert listing.price(Pool(name="a", price_per_device_hour_usd=None)) == "not priced"
    assert listing.price(Pool(name="b", price_per_device_hour_usd=Decimal("2.5000"))) == "2.5 USD"


@pytest.mark.django_db
def test_the_database_refuses_a_zero_price() -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Pool.objects.create(name="cpu", region="local", accelerator="local-cpu", price_per_device_hour_usd=0)
    assert (
        Pool.objects.create(name="cpu", region="local", accelerator="local-cpu").price_per_device_hour_usd
        is None
    )


def _job_on(pool: Pool, org, user) -> TuningJob:  # type: ignore[no-untyped-def]
    job = finished_job(org, user, name=f"on {pool.name}")
    price = pool.price_per_host_hour_usd
    # What tuning_job_create stores for a pool: its price per host-hour, 0 when it has none.
    job.spec = {**job.spec, "hardware": pool.accelerator, "price_per_hour_usd": price or 0.0}
    job.pool = pool
    job.save(update_fields=["spec", "pool"])
    Trial.objects.create(
        organization=org,
        job=job,
        number=0,
        assignment={"max_num_seqs": 64},
        label="max_num_seqs=64",
        status=Trial.Status.DONE,
        result={
            "status": "ok",
            "phase": "search",
            "slo_met": True,
            "cost_per_mtok_usd": 0.0123 if price else None,
        },
    )
    return job


@pytest.mark.django_db
def test_jobs_on_an_unpriced_pool_show_no_cost(alice, alice_org, alice_client, platform_admin) -> None:  # type: ignore[no-untyped-def]
    # An H200 pool: the catalog has a datasheet price for the device, but the pool has none.
    unpriced = Pool.objects.create(name="h200-own", region="local", accelerator="h200", devices_per_host=8)
    job = _job_on(unpriced, alice_org, alice)
    assert not job_is_priced(job=job)
    trials = alice_client.get(reverse("jobs:trials", args=[job.id])).content.decode()
    assert "not priced" in trials
    report = alice_client.get(reverse("jobs:report", args=[job.id])).content.decode()
    assert "so no trial has a cost" in report
    assert deploy_summary(job=job)["price"] is None

    priced = Pool.objects.create(
        name="h200-priced",
        region="local",
        accelerator="h200",
        devices_per_host=8,
        price_per_device_hour_usd=Decimal("3.5"),
    )
    job = _job_on(priced, alice_org, alice)
    assert job_is_priced(job=job) and job.spec["price_per_hour_usd"] == pytest.approx(28.0)
    trials = alice_client.get(reverse("jobs:trials", args=[job.id])).content.decode()
    assert "0.0123" in trials and "not priced" not in trials
    assert deploy_summary(job=job)["price"] == "$3.5 per device-hour"
