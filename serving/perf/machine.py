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

A matmul and a copy loop are not the engine, and they moved apart on this host (fp32 matmul at
0.72x the calibration's while copy bandwidth read 1.24x). `probe_engine_speed` asks the running
engine itself: one request's prefill of `PROBE_PREFILL_TOKENS` tokens (fewer where the
configuration's step budget would chunk it) and one request's decode steps, the shapes the calibration measured under the same labels, so the ratios say how much
slower or faster this engine runs now than the calibrated one (`EngineSpeed`), and a prediction
for this engine can carry them (`Efficiency.scaled`). About a second on a small model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.perf.calibrate import CHECK_ROUNDS, Observation, Requests, measure_cpu, median_of_rounds
from serving.perf.model import DATA_DIR, Efficiency

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


# The engine speed probe: shapes the calibration measures under these labels.
PROBE_PREFILL_TOKENS = 512  # one step under every step budget of 512 tokens or more
PROBE_PREFILL_REPEATS = 3
PROBE_DECODE = (1, 64, 48)  # one request, 64 prompt tokens, 48 output tokens
DECODE_LABEL = f"decode x{PROBE_DECODE[0]} ctx {PROBE_DECODE[1]}"


def prefill_label(tokens: int) -> str:
    return f"single prefill {tokens}"


@dataclass(frozen=True)
class EngineSpeed:
    """A running engine's probe beside the calibration's measurements of the same shapes."""

    prefill_s: float  # median TTFT of single prompts of `prefill_tokens`
    decode_s: float  # mean decode step of one request
    calibrated_prefill_s: float
    calibrated_decode_s: float
    prefill_tokens: int = PROBE_PREFILL_TOKENS

    @property
    def compute_scale(self) -> float:
        """How much longer a prefill (compute-bound) takes now than when calibrated."""
        return self.prefill_s / self.calibrated_prefill_s

    @property
    def step_scale(self) -> float:
        """How much longer a small decode step (bandwidth and fixed costs) takes now."""
        return self.decode_s / self.calibrated_decode_s

    def correct(self, efficiency: Efficiency) -> Efficiency:
        """`efficiency` for this engine as it runs now."""
        return efficiency.scaled(
            compute=self.compute_scale,
            step=self.step_scale,
            why=f"engine probe: prefill x{self.compute_scale:.3f}, decode step x{self.step_scale:.3f}",
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "prefill_tokens": self.prefill_tokens,
            "prefill_ms": self.prefill_s * 1000.0,
            "decode_ms": self.decode_s * 1000.0,
            "calibrated_prefill_ms": self.calibrated_prefill_s * 1000.0,
            "calibrated_decode_ms": self.calibrated_decode_s * 1000.0,
            "compute_scale": self.compute_scale,
            "step_scale": self.step_scale,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineSpeed:
        return cls(
            prefill_s=float(data["prefill_ms"]) / 1000.0,
            decode_s=float(data["decode_ms"]) / 1000.0,
            calibrated_prefill_s=float(data["calibrated_prefill_ms"]) / 1000.0,
            calibrated_decode_s=float(data["calibrated_decode_ms"]) / 1000.0,
            prefill_tokens=int(data.get("prefill_tokens", PROBE_PREFILL_TOKENS)),
        )


def calibrated_probe_shapes(prefill_tokens: int, path: Path | None = None) -> tuple[float, float]:
    """The calibration's own prefill and decode measurements of the probe's shapes (seconds)."""
    source = path or DATA_DIR / "local_cpu.json"
    data = json.loads(source.read_text())
    found = {
        o.label: o.measured_s for o in (Observation.from_mapping(raw) for raw in data.get("observations", []))
    }
    labels = (prefill_label(prefill_tokens), DECODE_LABEL)
    missing = [label for label in labels if label not in found]
    if missing:
        raise ValueError(f"{source} has no observation {missing[0]!r}: probe a calibrated shape")
    return found[labels[0]], found[labels[1]]


def probe_engine_speed(
    base_url: str,
    model_name: str,
    tokenizer_dir: Path,
    *,
    seed: int,
    prefill_tokens: int = PROBE_PREFILL_TOKENS,
    path: Path | None = None,
) -> EngineSpeed:
    """Time the probe's shapes on a running engine (fresh words from `seed`): see the module.
    `prefill_tokens`: a prompt length the calibration measured, one step for the engine."""
    calibrated_prefill, calibrated_decode = calibrated_probe_shapes(prefill_tokens, path)
    requests = Requests(base_url, model_name, tokenizer_dir, seed=seed)
    return EngineSpeed(
        prefill_s=requests.single_prefill_s(prefill_tokens, PROBE_PREFILL_REPEATS),
        decode_s=requests.decode_step_s(*PROBE_DECODE),
        calibrated_prefill_s=calibrated_prefill,
        calibrated_decode_s=calibrated_decode,
        prefill_tokens=prefill_tokens,
    )
