"""The chart pages' plotly.js: the vendored basic bundle (static/vendor/plotly), the same
plotly.js version the Python `plotly` package builds figures for, refusing trace types it does
not have, and sent compressed under a hashed, long-cached name in production.

The browser tests of the traffic profile, job report and endpoint pages draw every chart with
it (test_browser, test_job_report, test_endpoint_dashboard)."""

from __future__ import annotations

import re
from pathlib import Path

import plotly
import plotly.graph_objects as go
import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.templatetags.static import static
from django.test import Client
from django.urls import reverse

from portal.plotting import BUNDLE_TRACE_TYPES, PLOTLY_JS, figure_json

_VERSION = re.compile(rb"\* plotly\.js (?:\([a-z -]+\) )?v(\d+\.\d+\.\d+)")


def _version(path: Path) -> str:
    with path.open("rb") as fh:
        found = _VERSION.search(fh.read(400))
    assert found is not None, f"no plotly.js version banner at the top of {path}"
    return found[1].decode()


def test_the_bundle_is_the_plotly_js_the_python_package_targets() -> None:
    vendored = finders.find(PLOTLY_JS)
    assert vendored, f"{PLOTLY_JS} is not among the static files"
    bundle = Path(str(vendored))
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    # Figures are validated against the Python package's schema; the browser must read that schema.
    assert _version(bundle) == _version(full)
    assert (bundle.parent / "LICENSE").read_text().startswith("MIT License")
    assert bundle.stat().st_size < full.stat().st_size / 3
    # The trace modules the bundle registers, as each names itself in the minified source.
    registered = set(re.findall(r'moduleType:"trace",name:"(\w+)"', bundle.read_text(encoding="utf-8")))
    assert registered == BUNDLE_TRACE_TYPES


def test_a_trace_type_the_bundle_lacks_is_refused_by_name() -> None:
    assert figure_json(go.Figure([go.Scatter(y=[1, 2]), go.Bar(y=[3])]))["data"][1]["type"] == "bar"
    with pytest.raises(ValueError, match=r"\['heatmap'\] are not in the plotly.js bundle"):
        figure_json(go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])))


@pytest.mark.django_db
def test_the_old_address_leads_to_the_static_bundle(client: Client) -> None:
    response = client.get(reverse("plotly-js"))
    assert response.status_code == 302 and response["Location"] == static(PLOTLY_JS)
    assert "max-age" not in response.get("Cache-Control", "")  # the bundle's hashed name changes


@pytest.mark.django_db
@pytest.mark.usefixtures("production_static")
def test_production_static_files_send_the_bundle_compressed_and_cached() -> None:
    call_command("collectstatic", interactive=False, verbosity=0)
    url = static(PLOTLY_JS)
    assert re.fullmatch(r"/static/vendor/plotly/plotly-basic\.min\.[0-9a-f]{12}\.js", url)
    size = Path(str(finders.find(PLOTLY_JS))).stat().st_size
    client = Client()  # a fresh handler: whitenoise reads the collected files when it starts
    for accept, encoding in (("br, gzip", "br"), ("gzip", "gzip"), ("", None)):
        response = client.get(url, headers={"accept-encoding": accept})
        assert response.status_code == 200
        assert response.get("Content-Encoding") == encoding
        body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
        assert (len(body) == size) if encoding is None else (len(body) < size / 3)
        assert "immutable" in response["Cache-Control"] and "Accept-Encoding" in response["Vary"]


@pytest.fixture
def production_static(tmp_path: Path, settings) -> None:  # type: ignore[no-untyped-def]
    # Production's storage over this repository's own static folder only (the apps' folders,
    # Swagger's and Redoc's among them, would only slow the collection down).
    settings.STATIC_ROOT = tmp_path / "static"
    settings.STATICFILES_FINDERS = ["django.contrib.staticfiles.finders.FileSystemFinder"]
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    assert settings.STATICFILES_DIRS
