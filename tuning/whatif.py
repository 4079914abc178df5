"""What if this traffic ran on other hardware: the simulator's forecast per catalog accelerator.

For a traffic sample (its requests and arrival times) and a model, each hardware gets vLLM's
defaults on the fewest devices of one node that hold the model, and the simulator predicts
p50/p95 TTFT at the sample's own rate, the highest rate at which the latency targets still hold
(bisection over rate multiples), and the cost per million tokens at that hardware's price.

Every figure is a prediction and says what it rests on: the efficiency factors measured on that
hardware, or measured on another device of the same kind with this one's datasheet. Hardware of
a kind no calibration was measured on (TPUs, Trainium) gets no figures, only the reason: a guess
borrowed across vendors would look like a forecast and is not one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.catalog.hardware import Hardware
from serving.catalog.models import ModelSpec
from serving.engine.config import EngineConfig
from serving.loadgen.traces import TraceRequest
from serving.perf.model import nearest_measured
from serving.sim.api import LatencyTargets, load_requests, max_rate_scale, rank_candidates

MAX_REQUESTS = 400  # of the sample, per simulated replay: bounds a forecast's work
RATE_ITERATIONS = 8  # bisection steps for the sustainable rate, over rate multiples 1/64 to 64
RATE_LOW, RATE_HIGH = 1 / 64, 64.0
DEVICE_COUNTS = (1, 2, 4, 8)
CALIBRATED_KINDS = ("cpu", "gpu")  # kinds a calibration was measured on (local-cpu, h200)


@dataclass(frozen=True)
class Forecast:
    """One hardware's predicted figures, or why there are none (`withheld`)."""

    hardware: str
    display_name: str
    devices: int | None  # tensor-parallel size the model needs there (None: does not fit a node)
    calibration: str | None  # what the prediction rests on, in words
    withheld: str | None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    meets_targets: bool | None = None  # at the sample's own rate
    sustainable_rps: float | None = None  # the highest rate meeting the targets (None: not even the lowest)
    sustainable_at_least: bool = False  # the targets held at the highest rate tried: a lower bound
    usd_per_million_tokens: float | None = None
    price_per_device_hour_usd: float | None = None


def sample_rate_rps(requests: Sequence[TraceRequest]) -> float | None:
    """Requests per second over the span of their arrivals (None: fewer than two, or one instant)."""
    if len(requests) < 2:
        return None
    span = requests[-1].arrival_s - requests[0].arrival_s
    return (len(requests) - 1) / span if span > 0 else None


def _config(hardware: Hardware, devices: int, max_model_len: int) -> EngineConfig:
    if hardware.kind == "cpu":
        return EngineConfig.cpu_default(max_model_len=max_model_len)
    return EngineConfig(tensor_parallel_size=devices, max_model_len=max_model_len)


def forecast(
    workload: Path | Sequence[TraceRequest],
    *,
    model: ModelSpec,
    hardware: Sequence[Hardware],
    targets: LatencyTargets,
    max_prompt_tokens: int,
    max_output_tokens: int,
    prices: Mapping[str, float] | None = None,
) -> list[Forecast]:
    """A forecast per hardware, in the order given. `prices`: per-device hourly prices by
    hardware name that replace the catalog's (an operator's own)."""
    requests = load_requests(workload, max_requests=MAX_REQUESTS)
    if not requests:
        raise ValueError("the sample has no requests to forecast with")
    max_model_len = min(model.max_position_embeddings, max_prompt_tokens + max_output_tokens + 8)
    rate = sample_rate_rps(requests)
    out = []
    for hw in hardware:
        price = (prices or {}).get(hw.name, hw.price_per_hour_usd.value)
        efficiency, basis = nearest_measured(hw)
        if hw.kind not in CALIBRATED_KINDS or not efficiency.measured:
            out.append(
                Forecast(
                    hw.name,
                    hw.display_name,
                    None,
                    None,
                    withheld=f"no calibration measured on a {hw.kind} device: the simulator's figures "
                    "would be a datasheet guess",
                )
            )
            continue
        counts = (1,) if hw.kind == "cpu" else tuple(n for n in DEVICE_COUNTS if n <= hw.max_devices_per_node)
        score = None
        reasons = []
        for devices in counts:
            config = _config(hw, devices, max_model_len)
            (score,) = rank_candidates(
                requests,
                [(hw, config)],
                model=model,
                targets=targets,
                max_prompt_tokens=max_prompt_tokens,
                max_output_tokens=max_output_tokens,
                efficiency=efficiency,
                prices={hw.name: price},
            )
            if score.error is None:
                break
            reasons.append(f"{devices}: {score.error}")
        if score is None or score.error is not None:
            out.append(
                Forecast(
                    hw.name,
                    hw.display_name,
                    None,
                    basis,
                    withheld="does not fit one node: " + "; ".join(reasons[-1:]),
                )
            )
            continue
        scale = max_rate_scale(
            requests,
            model=model,
            hardware=hw,
            config=score.config,
            targets=targets,
            low=RATE_LOW,
            high=RATE_HIGH,
            iterations=RATE_ITERATIONS,
            max_prompt_tokens=max_prompt_tokens,
            max_output_tokens=max_output_tokens,
            efficiency=efficiency,
        )
        cost = score.cost_per_million_tokens_usd if price > 0 else None  # unpriced is not free
        out.append(
            Forecast(
                hw.name,
                hw.display_name,
                score.config.tensor_parallel_size,
                basis,
                None,
                ttft_p50_ms=score.ttft_p50_ms,
                ttft_p95_ms=score.ttft_p95_ms,
                meets_targets=score.meets_targets,
                sustainable_rps=scale * rate if scale is not None and rate is not None else None,
                sustainable_at_least=scale == RATE_HIGH,
                usd_per_million_tokens=cost,
                price_per_device_hour_usd=price,
            )
        )
    return out
