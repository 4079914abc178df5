"""Is this the machine the local calibration was measured on?

A calibration (`serving.perf.calibrate`) belongs to one machine in one state: the step-latency
model's efficiencies are fitted against the CPU's measured matmul throughput and copy bandwidth,
and predictions for `local-cpu` are only as good as the match between that machine and this one.
Hosted 2-core machines differ between sessions (one measured fp32 matmul at 0.20 TFLOPS, the next
at 0.09, with bf16 0.94 against 0.13-0.21) and have slow stretches within a session. So a
prediction for the local CPU can say whether the machine now is the one that was calibrated:
`check_local_machine()` measures the same figures again and names each one that moved by more
than `TOLERANCE`.

One measurement is not enough to say so: on this shared host a single best-of-5 draw moves by
more than the tolerance on its own (the live run of benchmarks/results/sim_accuracy_live/
2026-12-04T22-36.json: its check at the start named fp32 matmul and copy bandwidth, its check at
the end, on the same machine, nothing). The check takes the median of `CHECK_ROUNDS`
measurements (a few seconds) and records their range beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.perf.calibrate import CHECK_ROUNDS, measure_cpu, median_of_rounds
from serving.perf.model import DATA_DIR

TOLERANCE = 0.2  # a figure more than 20% away from the calibration's is a different machine state
FIGURES = (
    ("fp32_tflops", "fp32 matmul", "TFLOPS"),
    ("bf16_tflops", "bf16 matmul", "TFLOPS"),
    ("memory_bandwidth_gbps", "copy bandwidth", "GB/s"),
)


@dataclass(frozen=True)
class MachineCheck:
    calibrated_at: str | None
    calibrated: dict[str, float]
    measured_now: dict[str, float]
    differences: list[str] = field(default_factory=list)
    # Per figure, the lowest and highest of the measurements `measured_now` is the median of.
    measured_range: dict[str, tuple[float, float]] = field(default_factory=dict)
    rounds: int = 1

    @property
    def matches(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {
            "matches": self.matches,
            "calibrated_at": self.calibrated_at,
            "calibrated": self.calibrated,
            "measured_now": self.measured_now,
            "measured_range": {k: list(v) for k, v in self.measured_range.items()},
            "rounds": self.rounds,
            "differences": self.differences,
        }


def machine_differences(
    calibrated: Mapping[str, Any], now: Mapping[str, Any], *, tolerance: float = TOLERANCE
) -> list[str]:
    """One line per figure of `now` that is more than `tolerance` away from `calibrated`."""
    out = []
    for key, name, unit in FIGURES:
        then, current = calibrated.get(key), now.get(key)
        if not isinstance(then, int | float) or not isinstance(current, int | float) or then <= 0:
            continue
        ratio = float(current) / float(then)
        if abs(ratio - 1.0) > tolerance:
            out.append(
                f"{name} {float(current):.3g} {unit} now, {float(then):.3g} {unit} when calibrated ({ratio:.2f}x)"
            )
    return out


def check_local_machine(
    path: Path | None = None,
    *,
    measured_now: Mapping[str, float] | None = None,
    tolerance: float = TOLERANCE,
    rounds: int = CHECK_ROUNDS,
    measure: Callable[[], Mapping[str, float]] | None = None,
) -> MachineCheck:
    """Compare this machine's figures (the median of `rounds` measurements now, unless given) with
    the calibration's."""
    data = json.loads((path or DATA_DIR / "local_cpu.json").read_text())
    calibrated = {k: float(v) for k, v in (data.get("hardware") or {}).items() if isinstance(v, int | float)}
    spread: dict[str, tuple[float, float]] = {}
    if measured_now is None:
        measured_now, spread = median_of_rounds(measure or measure_cpu, rounds)
    else:
        rounds = 1
    now = {k: float(v) for k, v in measured_now.items()}
    return MachineCheck(
        calibrated_at=data.get("measured_at"),
        calibrated=calibrated,
        measured_now=now,
        differences=machine_differences(calibrated, now, tolerance=tolerance),
        measured_range=spread,
        rounds=rounds,
    )
