"""Measured runs on a catalog device: what Tailguard's own benchmarks recorded on real hardware,
shown beside the datasheet figures and labelled with the host they ran on.

The result files are the benchmark scripts' own output (`benchmarks/results/`, never edited by
hand); a file is shown for a device when the GPU it records is that device.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

# Result files of live GPU runs, and what each one measured.
GPU_RESULT_FILES = {
    "gpu_tuning_azure_conv.json": "a tuning job on a GPU engine, confirmed against vLLM's defaults",
    "gpu_tuning_mooncake.json": "a tuning job on a GPU engine, confirmed against vLLM's defaults",
    "gpu_tuning_qwen3_32b_azure_conv.json": "a Qwen3-32B-shaped tuning job on a GPU engine, confirmed against vLLM's defaults",
    "gpu_tuning_qwen3_32b_mooncake.json": "a Qwen3-32B-shaped knee probe on a GPU engine (Mooncake): no rate met the SLO",
    "gpu_tuning.json": "tuning jobs on a GPU engine, their confirmation not finished",
}
MAX_RESULT_BYTES = 4 << 20  # a result file larger than this is not read on a page view


@dataclass(frozen=True)
class MeasuredRun:
    what: str
    file: str
    when: str
    host: str  # the GPU and the host as the script recorded them
    engine: str  # e.g. "vLLM 0.26.0"
    model: str
    complete: bool
    cases: list[dict[str, Any]]  # per trace: outcome line, knee, figures


def _results_dir() -> Path:
    return Path(getattr(settings, "MEASURED_RESULTS_DIR", settings.BASE_DIR / "benchmarks" / "results"))


def _matches(gpu: str, name: str) -> bool:
    """Whether a recorded GPU ("NVIDIA H200, 143771 MiB") is the catalog device `name` ("h200")."""
    return name.lower() in re.split(r"[^a-z0-9]+", gpu.lower())


def _knee_line(case: dict[str, Any], knee: dict[str, Any], data: dict[str, Any]) -> str:
    """A line for a case the script recorded without one (a knee probe whose lowest rate already
    missed the SLO), from the probe's own figures."""
    points = knee.get("points") or []
    if case.get("outcome") != "no_sustainable_rate" or not points:
        return ""
    lowest = points[0]
    slo = (data.get("method") or {}).get("slo") or "the SLO"
    try:
        return (
            f"vLLM's defaults missed {slo} at the lowest rate probed, {float(lowest['rate_rps']):g} req/s "
            f"({int(lowest['requests'])} requests: p50 TTFT {float(lowest['ttft_p50_ms']):,.0f} ms, "
            f"p95 {float(lowest['ttft_p95_ms']):,.0f} ms): no sustainable rate to tune at on this host."
        )
    except (KeyError, TypeError, ValueError):
        return ""


def runs_for(*, name: str) -> list[MeasuredRun]:
    """The measured runs whose recorded GPU is this device (none for an unknown or unreadable file)."""
    runs = []
    for file_name, what in GPU_RESULT_FILES.items():
        path = _results_dir() / file_name
        try:
            if path.stat().st_size > MAX_RESULT_BYTES:
                continue
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        machine = data.get("machine") or {}
        gpu = str(machine.get("gpu") or "")
        if not gpu or gpu == "none" or not _matches(gpu, name):
            continue
        versions = data.get("versions") or {}
        cases = []
        for trace, case in (data.get("cases") or {}).items():
            knee = case.get("knee_probe") or {}
            cases.append(
                {
                    "trace": trace,
                    "line": case.get("line") or _knee_line(case, knee, data) or case.get("outcome") or "",
                    "outcome": case.get("outcome") or "",
                    "knee_rps": knee.get("knee_rps"),
                    "figures": case.get("figures") or {},
                    "trials": len(case.get("trials") or []),
                }
            )
        runs.append(
            MeasuredRun(
                what=what,
                file=f"benchmarks/results/{file_name}",
                when=str(data.get("when") or ""),
                host=f"{gpu} · {machine.get('description') or ''}".strip(" ·"),
                engine=f"vLLM {versions['vllm']}" if "vllm" in versions else "",
                model=str(data.get("model") or ""),
                complete=bool(data.get("complete")),
                cases=cases,
            )
        )
    return runs
