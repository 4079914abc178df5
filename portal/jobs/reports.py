"""The job report as a page context, a self-contained HTML file and a PDF.

The PDF is printed synchronously, in the request, by the local headless Chromium from the same
self-contained HTML the download gives. A print takes a few seconds and is asked for rarely, one
click at a time; a Celery task would add a stored file, a polling page and a clean-up for no gain a
user would notice. The print is bounded by REPORT_PDF_TIMEOUT_S (the whole Chromium process group
is killed then), and a missing Chromium is a clear error on the page, not a 500.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.staticfiles import finders
from django.template.loader import render_to_string
from django.utils import timezone

from portal.jobs import charts, selectors
from portal.jobs.models import TuningJob
from portal.plotting import PLOTLY_JS


class ReportExportError(Exception):
    """The report could not be exported; the message says what to do about it."""


def job_report_context(*, job: TuningJob) -> dict[str, Any]:
    report = selectors.job_report_data(job=job)
    priced = selectors.job_is_priced(job=job)
    sections = charts.report_sections(report, priced=priced)
    return {
        "job": job,
        "report": report,
        "sections": sections,
        "figures": charts.plotly_payload(sections),
        "predictions": [_with_misses(t) for t in report["trials"] if t["predicted"]],
        "prediction_miss_share": charts.PREDICTION_MISS_SHARE,
        "ttft_splits": [
            {**t, "split_parts": [t["ttft_split"][p] for p in ("queueing", "prefill", "outside_engine")]}
            for t in report["trials"]
            if t.get("ttft_split")
        ],
        "thresholds_assumed": any(t["gates"]["thresholds_assumed"] for t in report["trials"] if t["ok"]),
        "priced": priced,
    }


def _with_misses(trial: dict[str, Any]) -> dict[str, Any]:
    """A trial row with how far its prediction is from the measurement (percent), and whether
    either percentile is off by more than the report flags."""
    misses = {
        key: charts.prediction_miss(trial["predicted"].get(key), trial.get(key))
        for key in ("ttft_p50_ms", "ttft_p95_ms")
    }
    return {
        **trial,
        "miss_p50_pct": None if misses["ttft_p50_ms"] is None else 100 * misses["ttft_p50_ms"],
        "miss_p95_pct": None if misses["ttft_p95_ms"] is None else 100 * misses["ttft_p95_ms"],
        "prediction_off": any(m is not None and m > charts.PREDICTION_MISS_SHARE for m in misses.values()),
    }


def _inline(text: str) -> str:
    # Inside an inline <script> only "</script" can end the element early.
    return text.replace("</script", "<\\/script")


@functools.cache
def _assets() -> dict[str, str]:
    plotly_js = finders.find(PLOTLY_JS)
    charts_js = finders.find("js/charts.js")
    css = finders.find("css/app.css")
    if not plotly_js or not charts_js or not css:
        raise ReportExportError(
            f"The report's static files ({PLOTLY_JS}, js/charts.js, css/app.css) are missing."
        )
    return {
        "plotly_js": _inline(Path(str(plotly_js)).read_text(encoding="utf-8")),
        "charts_js": _inline(Path(str(charts_js)).read_text(encoding="utf-8")),
        "css": Path(str(css)).read_text(encoding="utf-8").replace("</style", "<\\/style"),
    }


def job_report_html(*, job: TuningJob) -> str:
    """One HTML file with everything inline (styles, figures, plotly.js): it opens offline."""
    context = {**job_report_context(job=job), **_assets(), "generated_at": timezone.now()}
    return render_to_string("jobs/report_standalone.html", context)


def report_filename(job: TuningJob, extension: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in job.name).strip("-")[:60] or "job"
    return f"tailguard-report-{safe}-{str(job.id)[:8]}.{extension}"


def job_report_pdf(*, job: TuningJob) -> bytes:
    """The self-contained report printed to PDF by headless Chromium."""
    chromium = shutil.which(settings.REPORT_CHROMIUM)
    if chromium is None:
        raise ReportExportError(
            f"PDF export needs headless Chromium, and {settings.REPORT_CHROMIUM!r} was not found on this "
            "server (install Debian's chromium package or set REPORT_CHROMIUM). The HTML download works without it."
        )
    html = job_report_html(job=job)
    timeout_s = settings.REPORT_PDF_TIMEOUT_S
    with tempfile.TemporaryDirectory(prefix="tailguard-report-") as tmp:
        source, target = Path(tmp) / "report.html", Path(tmp) / "report.pdf"
        source.write_text(html, encoding="utf-8")
        command = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={Path(tmp) / 'profile'}",
            # Plotly lays the charts out at the window's width and keeps it when the page is printed;
            # at this width they fill the printed page (measured: narrower leaves them half-width).
            "--window-size=1000,1400",
            # Lets plotly finish drawing before the page is printed.
            "--virtual-time-budget=10000",
            "--no-pdf-header-footer",
            f"--print-to-pdf={target}",
            source.as_uri(),
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout stops every Chromium process
        )
        try:
            _, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise ReportExportError(
                f"Chromium did not finish printing the report within {timeout_s} s; try again, or download the HTML."
            ) from None
        if not target.exists() or target.stat().st_size == 0:
            lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
            detail = lines[-1] if lines else "no output"
            raise ReportExportError(
                f"Chromium could not print the report (exit status {process.returncode}: {detail})."
            )
        return target.read_bytes()
