"""A benchmark report's token caps are bounded (issue 27 finding 13): a huge max_output_tokens
had passed the form and answered 500 from the database's integer column."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from compliance.models import AuditEvent
from portal.benchmarks import services
from portal.benchmarks.models import BenchmarkReport
from tests.portal.benchmarks import benchmark_form, target_spec

pytestmark = pytest.mark.django_db


def test_the_form_refuses_out_of_range_token_caps_with_a_clear_error(sam_client, sample) -> None:  # type: ignore[no-untyped-def]
    url = reverse("benchmarks:create")
    for field in ("max_output_tokens", "max_prompt_tokens"):
        for value in ("9" * 40, "2147483648", str(services.MAX_TOKENS_CAP + 1), "0", "-3"):
            response = sam_client.post(url, benchmark_form(sample, **{field: value}))
            assert response.status_code == 400, (field, value)
            html = unescape(response.content.decode())
            errors = re.findall(rf'data-field="{field}">([^<]*)', html)
            assert errors and re.search(r"(less|greater) than or equal to", errors[0]), (field, value, errors)
    assert not BenchmarkReport.objects.exists()
    assert not AuditEvent.objects.filter(action="benchmark_report.create").exists()


def test_the_service_refuses_them_too(sam, sample) -> None:  # type: ignore[no-untyped-def]
    for value in (2**40, 0, services.MAX_TOKENS_CAP + 1):
        with pytest.raises(ValidationError) as caught:
            services.benchmark_report_create(
                actor=sam,
                traffic_sample=sample,
                targets=[target_spec("Tuned", "https://api.provider.example/v1")],
                load_multipliers=[1.0],
                duration_s=10,
                max_output_tokens=value,
            )
        assert f"1 to {services.MAX_TOKENS_CAP:,} tokens" in caught.value.message_dict["max_output_tokens"][0]
    assert not BenchmarkReport.objects.exists()
