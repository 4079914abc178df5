"""Every chart page loads plotly.js the same way: the vendored basic bundle through `{% static %}`
(cached under a hashed name in production), never the full 4.8 MB bundle, a redirect or a CDN
(issue 24: page weight)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.templatetags.static import static
from django.urls import reverse

from portal.plotting import PLOTLY_JS
from tests.factories import deployed_endpoint

TEMPLATES = Path(settings.BASE_DIR) / "templates"
_SCRIPT = re.compile(r"<script[^>]*\bsrc=\"([^\"]*)\"", re.IGNORECASE)


def test_every_template_that_loads_plotly_loads_the_static_basic_bundle() -> None:
    loaders: dict[str, list[str]] = {}
    for path in TEMPLATES.rglob("*.html"):
        sources = [src for src in _SCRIPT.findall(path.read_text(encoding="utf-8")) if "plotly" in src]
        if sources:
            loaders[str(path.relative_to(TEMPLATES))] = sources
    assert "endpoints/detail.html" in loaders  # the endpoint page draws charts
    expected = "{% static 'vendor/plotly/plotly-basic.min.js' %}"
    assert {name: srcs for name, srcs in loaders.items() if srcs != [expected]} == {}


@pytest.mark.django_db
def test_the_endpoint_page_loads_the_basic_bundle(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    endpoint = deployed_endpoint(alice_org, alice)
    html = alice_client.get(reverse("endpoints:detail", args=[endpoint.id])).content.decode()
    sources = [src for src in _SCRIPT.findall(html) if "plotly" in src]
    assert sources == [static(PLOTLY_JS)]
    assert reverse("plotly-js") not in html and "cdn" not in " ".join(sources).lower()
