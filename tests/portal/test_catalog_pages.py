"""Catalog pages: any signed-in user reads them; platform admins override hardware prices, which
new tuning jobs then carry."""

from __future__ import annotations

import html
import json
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client
from django.urls import reverse
from django.utils.html import strip_tags

from compliance.models import AuditEvent
from portal.accounts.models import User
from portal.catalog import selectors, services
from portal.catalog.models import HardwarePriceOverride
from portal.jobs import services as job_services
from portal.jobs.models import TuningJob
from portal.traffic import services as traffic_services
from portal.traffic.models import TrafficSample
from serving.catalog import HARDWARE, MODELS
from tests.conftest import PASSWORD
from tuning.search.job import JobSpec
from tuning.search.space import LOCAL_CPU

SLO = "ttft_p50_ms<=2000,ttft_p95_ms<=8000"


def _text(response) -> str:  # type: ignore[no-untyped-def]
    """The page as a reader sees it: tags stripped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(strip_tags(response.content.decode())).split())


def _staff(email: str, role: str) -> User:
    return User.objects.create_user(email=email, password=PASSWORD, is_staff=True, staff_role=role)


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin(db) -> User:  # type: ignore[no-untyped-def]
    return _staff("pat@tailguard.test", User.StaffRole.PLATFORM_ADMIN)


@pytest.fixture
def admin_client(admin: User) -> Client:
    return _client(admin)


def _overrides() -> list[tuple[str, Decimal, str]]:
    return list(HardwarePriceOverride.objects.values_list("hardware_name", "price_per_hour_usd", "note"))


@pytest.mark.django_db
def test_hardware_pages_show_every_figure_with_its_source(bob_client) -> None:  # type: ignore[no-untyped-def]
    listing = bob_client.get(reverse("catalog:hardware_list"))
    assert listing.status_code == 200
    text = _text(listing)
    for hw in HARDWARE.values():
        assert hw.display_name in text
        assert reverse("catalog:hardware_detail", args=[hw.name]) in listing.content.decode()
    h200 = HARDWARE["h200"]
    assert "4,800 GB/s" in text and "141 GB" in text and "989 TFLOPS" in text and "NVLink 4" in text
    assert h200.price_per_hour_usd.source in text and h200.price_per_hour_usd.as_of in text
    assert "4.54 USD/h" in text
    # B300's price is an estimate: the list says how many of its figures are unconfirmed.
    b300 = HARDWARE["b300"]
    unconfirmed = sum(not f.confirmed for f in b300.figures().values())
    assert unconfirmed > 0 and f"{unconfirmed} unconfirmed" in text

    for name in ("h200", "b300", "local-cpu", "tpu-v6e"):
        hw = HARDWARE[name]
        page = bob_client.get(reverse("catalog:hardware_detail", args=[name]))
        assert page.status_code == 200
        text = _text(page)
        for figure in hw.figures().values():
            assert figure.source in text and figure.as_of in text
        for region in hw.regions:
            assert region.name in text and region.source in text
    assert bob_client.get(reverse("catalog:hardware_detail", args=["h100-mars"])).status_code == 404


@pytest.mark.django_db
def test_model_catalog_shows_sizes_weights_and_kv_bytes(charlie_client) -> None:  # type: ignore[no-untyped-def]
    page = charlie_client.get(reverse("catalog:model_list"))
    assert page.status_code == 200
    text = _text(page)
    for spec in MODELS.values():
        assert spec.name in text and spec.family in text
    deepseek = MODELS["deepseek-v3"]
    # MLA caches one latent (512) plus the rope key (64) per layer: 61 * 576 * 2 bytes in bf16.
    assert deepseek.kv_bytes_per_token("bf16") == 70272
    assert "70,272 B" in text and f"{deepseek.num_parameters():,}" in text
    assert "8.03 GB" in text  # Llama 3.1 8B in fp8: 8.03e9 parameters at one byte


@pytest.mark.django_db
def test_pages_need_a_signed_in_user() -> None:
    anonymous = Client()
    for url in (reverse("catalog:hardware_list"), reverse("catalog:model_list")):
        response = anonymous.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


@pytest.fixture
def job_inputs(settings, tmp_path: Path, alice, alice_org, shared_traces, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """A ready traffic sample and a registered model (a config-only checkpoint: no engine runs)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    model_root = tmp_path / "models"
    model = model_root / "llama-tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 4096,
                "intermediate_size": 384,
                "max_position_embeddings": 16384,
                "torch_dtype": "bfloat16",
            }
        )
    )
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    settings.TUNING_MODEL_ROOTS = [model_root]
    trace = shared_traces / "azure2023_conv.csv"
    with django_capture_on_commit_callbacks(execute=True):
        sample = traffic_services.traffic_sample_create(
            actor=alice,
            organization=alice_org,
            name=trace.name,
            upload=SimpleUploadedFile(trace.name, trace.read_bytes()),
        )
    sample.refresh_from_db()
    assert sample.status == TrafficSample.Status.READY, sample.error
    served = job_services.served_model_register(
        actor=alice, organization=alice_org, name="llama-tiny", path=str(model)
    )
    return sample, served


def _create_job(alice, alice_org, job_inputs, capture) -> TuningJob:  # type: ignore[no-untyped-def]
    sample, served = job_inputs
    # Created without running it: the step task is queued on commit, and not executed here.
    with capture(execute=False):
        return job_services.tuning_job_create(
            actor=alice,
            organization=alice_org,
            name="j",
            traffic_sample=sample,
            served_model=served,
            slo=SLO,
            peak_rps=1.0,
            hardware="local-cpu",
        )


@pytest.mark.django_db
def test_admin_override_prices_new_jobs_and_is_audited(
    alice, alice_org, admin, admin_client, job_inputs, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    # Before: the operator's own machine is not priced, and jobs keep their target's own (none).
    assert selectors.effective_price_per_hour("local-cpu") == (0.0, selectors.PRICE_SOURCE_UNPRICED)
    before = _create_job(alice, alice_org, job_inputs, django_capture_on_commit_callbacks)
    assert before.spec["price_per_hour_usd"] is None

    # The override is set on the one name the local CPU has in tuning and in the catalog.
    response = admin_client.post(
        reverse("catalog:price_set"),
        {"hardware_name": "local-cpu", "price_per_hour_usd": "0.35", "note": "internal chargeback rate"},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("catalog:hardware_detail", args=["local-cpu"])
    assert _overrides() == [("local-cpu", Decimal("0.3500"), "internal chargeback rate")]
    assert selectors.effective_price_per_hour("local-cpu") == (0.35, selectors.PRICE_SOURCE_OVERRIDE)

    event = AuditEvent.objects.filter(action="catalog.price_override_set").get()
    assert event.organization_id is None and event.chain == "platform"
    assert event.actor_id == admin.id and event.actor_label == admin.email
    assert event.data == {
        "hardware": "local-cpu",
        "price_per_hour_usd": "0.3500",
        "previous_override_usd": None,
        "datasheet_usd": 0.0,
    }
    assert event.after_digest and not event.before_digest

    # The pages show the override as such, who set it and when, and the datasheet price beside it.
    for url in (reverse("catalog:hardware_list"), reverse("catalog:hardware_detail", args=["local-cpu"])):
        text = _text(admin_client.get(url))
        assert "0.35 USD/h override set by pat@tailguard.test on" in text
        assert "(otherwise not priced)" in text

    # A job created now carries the price, and its plan would cost trials with it.
    after = _create_job(alice, alice_org, job_inputs, django_capture_on_commit_callbacks)
    assert after.spec["price_per_hour_usd"] == 0.35
    assert JobSpec.from_dict(after.spec).price_per_hour_usd == 0.35
    # The job created before keeps the price it started with.
    before.refresh_from_db()
    assert before.spec["price_per_hour_usd"] is None

    # Replacing and clearing are audited too; after clearing, new jobs use the target's price.
    services.hardware_price_override_set(actor=admin, hardware_name="local-cpu", price_per_hour_usd="0.5")
    replaced = AuditEvent.objects.filter(action="catalog.price_override_set").order_by("seq").last()
    assert (
        replaced.data["previous_override_usd"] == "0.3500" and replaced.data["price_per_hour_usd"] == "0.5000"
    )
    response = admin_client.post(reverse("catalog:price_clear"), {"hardware_name": "local-cpu"})
    assert response.status_code == 302 and _overrides() == []
    cleared = AuditEvent.objects.filter(action="catalog.price_override_clear").get()
    assert cleared.data["previous_override_usd"] == "0.5000" and cleared.before_digest
    last = _create_job(alice, alice_org, job_inputs, django_capture_on_commit_callbacks)
    assert last.spec["price_per_hour_usd"] is None
    assert JobSpec.from_dict(last.spec).price_per_hour_usd is None
    assert LOCAL_CPU.price_per_hour_usd == 0  # not priced: its trials cost nothing per token


@pytest.mark.django_db
def test_only_platform_admins_change_prices(alice, alice_client, bob, bob_client, admin) -> None:  # type: ignore[no-untyped-def]
    services.hardware_price_override_set(
        actor=admin, hardware_name="h200", price_per_hour_usd="3.10", note="quote"
    )
    sales = _staff("sam@tailguard.test", User.StaffRole.SALES_ENGINEER)
    plain_staff = _staff("stu@tailguard.test", "")
    state = (_overrides(), AuditEvent.objects.count())
    for user, client in (
        (alice, alice_client),
        (bob, bob_client),
        (sales, _client(sales)),
        (plain_staff, _client(plain_staff)),
    ):
        # Like the compliance console: not found, for everyone but platform admins.
        set_response = client.post(
            reverse("catalog:price_set"), {"hardware_name": "h200", "price_per_hour_usd": "0.01"}
        )
        assert set_response.status_code == 404
        assert client.post(reverse("catalog:price_clear"), {"hardware_name": "h200"}).status_code == 404
        # They read the pages, without the override form.
        page = client.get(reverse("catalog:hardware_detail", args=["h200"]))
        assert page.status_code == 200 and b'id="price-override"' not in page.content
        with pytest.raises(PermissionDenied):
            services.hardware_price_override_set(actor=user, hardware_name="h200", price_per_hour_usd="0.01")
        with pytest.raises(PermissionDenied):
            services.hardware_price_override_clear(actor=user, hardware_name="h200")
        assert (_overrides(), AuditEvent.objects.count()) == state
    assert selectors.effective_price_per_hour("h200") == (3.1, selectors.PRICE_SOURCE_OVERRIDE)
    # A superuser is a platform admin for the compliance console, and so here.
    root = User.objects.create_superuser(email="root@tailguard.test", password=PASSWORD)
    assert selectors.user_is_platform_admin(root)
    assert _client(root).post(reverse("catalog:price_clear"), {"hardware_name": "h200"}).status_code == 302
    assert _overrides() == []


@pytest.mark.django_db
def test_bad_overrides_get_field_errors_and_change_nothing(admin, admin_client) -> None:  # type: ignore[no-untyped-def]
    state = (_overrides(), AuditEvent.objects.count())
    cases = [
        ({"hardware_name": "h100-mars", "price_per_hour_usd": "2"}, "hardware_name", "Unknown hardware"),
        ({"hardware_name": "h200", "price_per_hour_usd": "-1"}, "price_per_hour_usd", "cannot be negative"),
        (
            {"hardware_name": "h200", "price_per_hour_usd": "1000.01"},
            "price_per_hour_usd",
            "not a plausible price",
        ),
        ({"hardware_name": "h200", "price_per_hour_usd": "NaN"}, "price_per_hour_usd", "Enter the price"),
        ({"hardware_name": "h200", "price_per_hour_usd": "cheap"}, "price_per_hour_usd", "Enter the price"),
        (
            {"hardware_name": "h200", "price_per_hour_usd": "1.00001"},
            "price_per_hour_usd",
            "4 decimal places",
        ),
        ({"hardware_name": "h200", "price_per_hour_usd": ""}, "price_per_hour_usd", "required"),
        ({"hardware_name": "h200", "price_per_hour_usd": "1", "note": "x" * 501}, "note", "at most 500"),
    ]
    for data, field, message in cases:
        response = admin_client.post(reverse("catalog:price_set"), data)
        assert response.status_code == 400, data
        errors = response.context["form"].errors
        assert set(errors) == {field}, errors
        assert message in " ".join(errors[field])
        assert message in _text(response)
        assert (_overrides(), AuditEvent.objects.count()) == state
    # The service refuses the same, naming every bad field at once.
    with pytest.raises(ValidationError) as info:
        services.hardware_price_override_set(
            actor=admin, hardware_name="mars", price_per_hour_usd=Decimal("-3")
        )
    assert set(info.value.message_dict) == {"hardware_name", "price_per_hour_usd"}
    with pytest.raises(ValidationError) as info:
        services.hardware_price_override_clear(actor=admin, hardware_name="h200")
    assert "no price override" in info.value.message_dict["hardware_name"][0]
    assert admin_client.post(reverse("catalog:price_clear"), {"hardware_name": "h200"}).status_code == 400
    assert (_overrides(), AuditEvent.objects.count()) == state
    # 0 is no price (costs would all be 0 and rank nothing): refused, saying how to remove one.
    with pytest.raises(ValidationError) as info:
        services.hardware_price_override_set(actor=admin, hardware_name="h100", price_per_hour_usd="0")
    assert "above 0" in info.value.message_dict["price_per_hour_usd"][0]
    assert (_overrides(), AuditEvent.objects.count()) == state
    # The edges are prices: the least above 0 and the most a device-hour may cost.
    services.hardware_price_override_set(actor=admin, hardware_name="h100", price_per_hour_usd="0.0001")
    services.hardware_price_override_set(actor=admin, hardware_name="b300", price_per_hour_usd="1000")
    assert _overrides() == [("b300", Decimal("1000.0000"), ""), ("h100", Decimal("0.0001"), "")]


@pytest.mark.django_db
def test_h200_page_shows_the_live_gpu_runs_labelled_with_their_host(bob_client, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The committed GPU benchmark result appears on the H200 page (host, engine, outcome per
    trace), on no other device's page, and a broken result file hides the section, not the page."""
    import json
    from pathlib import Path

    result = json.loads((Path(settings.BASE_DIR) / "benchmarks" / "results" / "gpu_tuning.json").read_text())
    page = _text(bob_client.get(reverse("catalog:hardware_detail", args=["h200"])))
    assert "Measured here" in page and "tuning jobs on a GPU engine" in page
    assert result["machine"]["gpu"] in page and f"vLLM {result['versions']['vllm']}" in page
    for trace, case in result["cases"].items():
        assert trace in page and (case.get("line") or case["outcome"]) in page
    # The confirmed run: its verdict with the interval, as the job wrote it.
    confirmed = json.loads(
        (Path(settings.BASE_DIR) / "benchmarks" / "results" / "gpu_tuning_azure_conv.json").read_text()
    )
    assert confirmed["complete"] and confirmed["cases"]["azure_conv"]["line"] in page
    mooncake = json.loads(
        (Path(settings.BASE_DIR) / "benchmarks" / "results" / "gpu_tuning_mooncake.json").read_text()
    )
    assert mooncake["complete"] and mooncake["cases"]["mooncake"]["line"] in page
    qwen3 = json.loads(
        (
            Path(settings.BASE_DIR) / "benchmarks" / "results" / "gpu_tuning_qwen3_32b_azure_conv.json"
        ).read_text()
    )
    assert qwen3["complete"] and qwen3["cases"]["azure_conv"]["line"] in page
    # A case whose defaults met the SLO at no probed rate: the probe's own figures, no verdict.
    qwen3_mooncake = json.loads(
        (
            Path(settings.BASE_DIR) / "benchmarks" / "results" / "gpu_tuning_qwen3_32b_mooncake.json"
        ).read_text()
    )
    lowest = qwen3_mooncake["cases"]["mooncake"]["knee_probe"]["points"][0]
    assert qwen3_mooncake["cases"]["mooncake"]["outcome"] == "no_sustainable_rate"
    assert f"at the lowest rate probed, {lowest['rate_rps']:g} req/s ({lowest['requests']} requests" in page
    assert "no sustainable rate to tune at on this host" in page
    # The run whose confirmation did not finish says so: its line, never a verdict.
    assert not result["complete"] and "their confirmation not finished" in page
    other = _text(bob_client.get(reverse("catalog:hardware_detail", args=["b200"])))
    assert "tuning jobs on a GPU engine" not in other and "No live run" in other

    settings.MEASURED_RESULTS_DIR = tmp_path
    (tmp_path / "gpu_tuning.json").write_text("{not json")
    broken = bob_client.get(reverse("catalog:hardware_detail", args=["h200"]))
    assert broken.status_code == 200 and "No live run" in _text(broken)
