"""Step-latency model: the time of one engine step from its batch, per operator class.

One step runs every scheduled token through the model once. Its time is the sum of
- GEMM: the layers' matmuls (and the LM head for sampled tokens), roofline of FLOPs against
  peak x `gemm_efficiency` and weight bytes read against bandwidth x `memory_efficiency`;
- attention: score/value FLOPs over each token's context, or its KV-cache reads, whichever is
  slower (same roofline, `attention_efficiency`); where a live fit says so
  (`attention_split`), a step that mixes prompt chunks with decodes costs each side at its own
  roofline, summed (the chunks compute-bound, the decodes bandwidth-bound);
- communication: tensor-parallel all-reduces (two per layer, ring algorithm) over the
  scale-up link at `comm_efficiency`, plus a latency each;
- overhead: fixed per step, per sequence and per token (scheduling, input preparation,
  sampling, detokenization), which dominates small models on CPUs.

The efficiency factors are calibrated from measurements (`serving.perf.calibrate`) and stored
in `serving/perf/data/*.json`; where live engine runs on that hardware were fitted
(`benchmarks/sim_gpu_fit.py`), `data/<name>_live.json` holds the fitted fixed costs and their
provenance, which replace the stored ones. A hardware with no measurements borrows the factors of the
nearest measured hardware, and every `StepTimeModel` says which it did (`basis`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from serving.catalog.hardware import Hardware, get_hardware
from serving.catalog.models import ModelSpec, format_bytes

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Efficiency:
    """Calibrated factors of one hardware (shares of datasheet peaks, and fixed costs)."""

    hardware: str  # catalog name these were measured on
    gemm_efficiency: float  # achieved / peak FLOP/s on the layers' matmuls
    attention_efficiency: float  # achieved / peak FLOP/s on attention
    memory_efficiency: float  # achieved / peak bandwidth on weight and KV reads
    comm_efficiency: float  # achieved / link bandwidth on all-reduces
    comm_latency_us: float  # per all-reduce
    step_overhead_ms: float  # fixed per engine step
    seq_overhead_ms: float  # per scheduled sequence per step
    token_overhead_ms: float  # per scheduled token per step
    request_overhead_ms: float  # client-visible per request outside the engine loop (HTTP, tokenizing)
    measured: bool  # False: a documented prior, not a measurement
    how: str  # how and when the factors were obtained
    # Multipliers of the compute (FLOP) time for other compute formats than the one fitted (e.g.
    # the CPU engine's bf16 kernels, far from the bf16 matmul peak), measured the same way; the
    # bytes (already halved by the format) and the fixed costs are the fitted ones.
    format_factors: dict[str, float] = field(default_factory=dict)
    # The same for the memory time (weights and KV cache read in that format), where measured.
    format_memory_factors: dict[str, float] = field(default_factory=dict)
    # The same for attention's FLOP time where measured apart from the matmuls' (a format's
    # attention kernel need not be its matmul's: on the AVX2 host of 2026-12-05 the engine's
    # bf16 short prefills took 2-3x their float32 time, its 3,500-token ones 1.4x); where
    # absent, attention takes the matmuls' factor.
    format_attention_factors: dict[str, float] = field(default_factory=dict)
    # Client-visible delay added to a request's arrival per other request streaming when it is
    # sent (the API server and the streams share CPU); 0 where not measured.
    stream_overhead_ms: float = 0.0
    # The frontend's time per prompt token before a request reaches the engine's queue (the API
    # server tokenizing it, the hand-off to the engine core), paid once per request, one prompt at
    # a time in send order (one API-server process), outside every engine step: it holds up the
    # requests sent after a long prompt, not the engine's steps. 0 where not measured. (Fitted as a
    # per-scheduled-token step cost, the same time per prompt token would also lengthen every
    # decode step that shares a step with a long prompt chunk.)
    prompt_token_overhead_ms: float = 0.0
    # The engine's work per scheduled token beyond the operator profile, as a share of that token's
    # linear-layer compute time at the profile's efficiency: work that grows with the model (norms,
    # activations, rotary, in-engine GEMMs short of the isolated ones), where `token_overhead_ms`
    # is the same for every model. 0 where not measured.
    token_compute_share: float = 0.0
    # vLLM's fused-MoE op, where its own timings were fitted (`data/<name>_moe.json`; 0: not
    # measured, and MoE layers are costed like the dense ones): a fixed time per MoE layer per
    # step (the routing sort and the chain's launches, inside a CUDA graph), and the shares of
    # peak bandwidth and FLOP/s its grouped GEMMs reach on the routed experts' weights.
    moe_floor_us: float = 0.0
    moe_memory_efficiency: float = 0.0
    moe_gemm_efficiency: float = 0.0
    # How a step that mixes prompt chunks with decodes costs its attention, in [0, 1]. 0: one
    # roofline over the whole step (all its FLOPs against all its KV reads, the slower side), as
    # if the chunks' compute hid the decodes' reads. 1: each side at its own roofline, summed
    # (the chunks' compute-bound tiles and the decodes' bandwidth-bound ones do not hide each
    # other); between, the weighted mean. A step of one kind only is the same either way. Set by
    # a live fit (a form the fit is given, not a fitted value); 0 where none says otherwise.
    attention_split: float = 0.0
    # The least wall time of an engine step run outside the CUDA graphs (more tokens than the
    # largest graph captured, `StepTimeModel.graph_max_tokens`): the host launching the layers'
    # kernels one by one, which a small step's GPU work does not hide. A fixed part and a part per
    # layer (each layer's kernels are launched in turn), fitted on single requests of several
    # model depths (`benchmarks/sim_gpu_eager_floor.py`, stored in `data/<name>_eager.json`) or
    # given as a what-if; 0 where none is measured.
    eager_step_floor_ms: float = 0.0
    eager_layer_floor_us: float = 0.0

    @property
    def moe_measured(self) -> bool:
        return self.moe_memory_efficiency > 0 and self.moe_gemm_efficiency > 0

    @classmethod
    def from_mapping(cls, data: dict[str, object]) -> Efficiency:
        scalars = {
            "stream_overhead_ms",
            "prompt_token_overhead_ms",
            "token_compute_share",
            "attention_split",
            *EAGER_FIT_FIELDS,
            *MOE_FIT_FIELDS,
        }
        optional = {"format_factors", "format_memory_factors", "format_attention_factors", *scalars}
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k not in optional}
        fields.update({k: data[k] for k in scalars if k in data})

        def factors(key: str) -> dict[str, float]:
            found = data.get(key)
            return {str(k): float(v) for k, v in found.items()} if isinstance(found, dict) else {}

        return cls(
            **fields,  # type: ignore[arg-type]
            format_factors=factors("format_factors"),
            format_memory_factors=factors("format_memory_factors"),
            format_attention_factors=factors("format_attention_factors"),
        )

    def to_mapping(self) -> dict[str, object]:
        return asdict(self)

    def scaled(self, *, compute: float, step: float, why: str) -> Efficiency:
        """These factors for an engine whose compute-bound work takes `compute` times as long and
        whose bandwidth-bound work and fixed costs take `step` times as long; `why` joins `how`."""
        if not (compute > 0 and step > 0 and math.isfinite(compute) and math.isfinite(step)):
            raise ValueError(f"scales must be positive and finite, not {compute} and {step}")
        return replace(
            self,
            gemm_efficiency=self.gemm_efficiency / compute,
            attention_efficiency=self.attention_efficiency / compute,
            memory_efficiency=self.memory_efficiency / step,
            step_overhead_ms=self.step_overhead_ms * step,
            seq_overhead_ms=self.seq_overhead_ms * step,
            token_overhead_ms=self.token_overhead_ms * step,
            eager_step_floor_ms=self.eager_step_floor_ms * step,
            eager_layer_floor_us=self.eager_layer_floor_us * step,
            how=f"{self.how}; {why}",
        )


# Used for accelerators when no accelerator has been measured: typical shares for well-tuned
# GPU kernels, stated as a prior (measured=False) so every prediction built on it says so.
ACCELERATOR_PRIOR = Efficiency(
    hardware="prior",
    gemm_efficiency=0.6,
    attention_efficiency=0.35,
    memory_efficiency=0.7,
    comm_efficiency=0.6,
    comm_latency_us=10.0,
    step_overhead_ms=3.0,
    seq_overhead_ms=0.01,
    token_overhead_ms=0.0,
    request_overhead_ms=5.0,
    measured=False,
    how="prior: typical GPU kernel efficiencies, not measured",
)


# The fixed costs a live fit may set (`data/<name>_live.json`, key `fitted`): the engine's
# overheads, which an operator profile cannot see. The roofline efficiencies stay the profile's.
LIVE_FIT_FIELDS = (
    "step_overhead_ms",
    "seq_overhead_ms",
    "token_overhead_ms",
    "request_overhead_ms",
    "stream_overhead_ms",
    "prompt_token_overhead_ms",
    "token_compute_share",
    "attention_split",
)
PRIORS_CLAUSE = "step, request and communication costs are priors, not measured"
# What a fit of vLLM's fused-MoE op timings may set (`data/<name>_moe.json`, key `fitted`).
MOE_FIT_FIELDS = ("moe_floor_us", "moe_memory_efficiency", "moe_gemm_efficiency")
# What a fit of the floor under steps run outside the CUDA graphs may set (`data/<name>_eager.json`,
# key `fitted`): it is the host's (its CPU launching kernels), so it is measured per host.
EAGER_FIT_FIELDS = ("eager_step_floor_ms", "eager_layer_floor_us")


def apply_live_fit(efficiency: Efficiency, live: dict[str, object]) -> Efficiency:
    """`efficiency` with the engine overheads fitted on live engine runs (`live["fitted"]`), and
    its `how` saying which costs were fitted on which runs (`live["how"]`) instead of calling
    them priors."""
    fitted = live.get("fitted")
    if not isinstance(fitted, dict):
        raise ValueError("a live fit needs a 'fitted' mapping of overheads")
    unknown = set(fitted) - set(LIVE_FIT_FIELDS)
    if unknown:
        raise ValueError(
            f"a live fit may set only {', '.join(LIVE_FIT_FIELDS)}; not {', '.join(sorted(unknown))}"
        )
    values: dict[str, object] = {k: float(v) for k, v in fitted.items()}
    if any(not float(v) >= 0 for v in fitted.values()):
        raise ValueError("fitted overheads must be non-negative")
    if not float(fitted.get("attention_split", 0.0)) <= 1.0:
        raise ValueError("attention_split must be in [0, 1]")
    note = str(live.get("how") or "engine overheads fitted on live runs")
    how = (
        efficiency.how.replace(PRIORS_CLAUSE, note)
        if PRIORS_CLAUSE in efficiency.how
        else f"{efficiency.how}; {note}"
    )
    return Efficiency.from_mapping({**efficiency.to_mapping(), **values, "how": how})


def apply_moe_fit(efficiency: Efficiency, fit: dict[str, object]) -> Efficiency:
    """`efficiency` with the fused-MoE op's costs fitted on its own timings (`fit["fitted"]`)."""
    fitted = fit.get("fitted")
    if not isinstance(fitted, dict) or set(fitted) != set(MOE_FIT_FIELDS):
        raise ValueError(f"a MoE fit needs exactly {', '.join(MOE_FIT_FIELDS)}")
    values = {k: float(v) for k, v in fitted.items()}
    if values["moe_floor_us"] < 0 or not all(0 < values[k] <= 1 for k in MOE_FIT_FIELDS[1:]):
        raise ValueError("a MoE fit needs a non-negative floor and efficiencies in (0, 1]")
    how = f"{efficiency.how}; {fit.get('how') or 'fused-MoE op fitted on its timings'}"
    return Efficiency.from_mapping({**efficiency.to_mapping(), **values, "how": how})


def apply_eager_fit(efficiency: Efficiency, fit: dict[str, object]) -> Efficiency:
    """`efficiency` with the floor under steps outside the CUDA graphs fitted on single requests
    (`fit["fitted"]`: a fixed part, a part per layer)."""
    fitted = fit.get("fitted")
    if not isinstance(fitted, dict) or not fitted or not set(fitted) <= set(EAGER_FIT_FIELDS):
        raise ValueError(f"an eager-floor fit needs a 'fitted' mapping of {', '.join(EAGER_FIT_FIELDS)}")
    values = {k: float(v) for k, v in fitted.items()}
    if not all(v >= 0 and math.isfinite(v) for v in values.values()):
        raise ValueError("an eager-floor fit needs finite, non-negative values")
    how = f"{efficiency.how}; {fit.get('how') or 'floor under steps outside the CUDA graphs fitted'}"
    return Efficiency.from_mapping({**efficiency.to_mapping(), **values, "how": how})


def load_efficiency(
    hardware: str, *, live: bool = True, moe: bool = True, eager: bool = True
) -> Efficiency | None:
    """The calibrated factors stored for `hardware`, if any (`data/<name>.json`, key `efficiency`).

    With `live` (the default), engine overheads fitted on live engine runs of that hardware
    (`data/<name>_live.json`, written by `benchmarks/sim_gpu_fit.py`) replace the stored ones;
    `live=False` gives the operator calibration alone (its overheads are then priors). With
    `moe` (the default), the fused-MoE op's fit (`data/<name>_moe.json`, written by
    `benchmarks/sim_moe_decode.py`) costs MoE layers; `moe=False` costs them like dense ones. With
    `eager` (the default), the floor under steps outside the CUDA graphs fitted on this host's
    single requests (`data/<name>_eager.json`, written by `benchmarks/sim_gpu_eager_floor.py`)."""
    name = hardware.replace("-", "_")
    path = DATA_DIR / f"{name}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    eff = data.get("efficiency")
    if not isinstance(eff, dict):
        return None
    efficiency = Efficiency.from_mapping(eff)
    live_path = DATA_DIR / f"{name}_live.json"
    if live and live_path.exists():
        efficiency = apply_live_fit(efficiency, json.loads(live_path.read_text()))
    moe_path = DATA_DIR / f"{name}_moe.json"
    if moe and moe_path.exists():
        efficiency = apply_moe_fit(efficiency, json.loads(moe_path.read_text()))
    eager_path = DATA_DIR / f"{name}_eager.json"
    if eager and eager_path.exists():
        efficiency = apply_eager_fit(efficiency, json.loads(eager_path.read_text()))
    return efficiency


# The accelerator whose live fit of the engine's overheads (`data/<name>_live.json`) stands in
# for an accelerator whose operators were profiled but whose engine was never fitted live: those
# costs (scheduling, input preparation, the sampler, HTTP and tokenizing) are the engine
# software's and its host CPU's, not the GPU's operators, so the nearest live fit is a better
# guess than the priors. The basis says it is borrowed.
LIVE_FIT_DONOR = "h200"


def nearest_measured(hardware: Hardware) -> tuple[Efficiency, str]:
    """Efficiency factors for `hardware` and the basis of the prediction, in words."""
    own = load_efficiency(hardware.name)
    if own is not None and own.measured:
        name = hardware.name.replace("-", "_")
        donor = DATA_DIR / f"{LIVE_FIT_DONOR}_live.json"
        if (
            hardware.kind != "cpu"
            and hardware.name != LIVE_FIT_DONOR
            and not (DATA_DIR / f"{name}_live.json").exists()
            and donor.exists()
        ):
            live = json.loads(donor.read_text())
            borrowed = apply_live_fit(
                own,
                {
                    **live,
                    "how": f"engine overheads borrowed from the {LIVE_FIT_DONOR} live fit "
                    f"({live.get('how') or donor.name}), never fitted on {hardware.name}",
                },
            )
            return borrowed, f"measured on {hardware.name} ({borrowed.how})"
        return own, f"measured on {hardware.name} ({own.how})"
    if hardware.kind == "cpu":
        cpu = load_efficiency("local-cpu")
        if cpu is not None:
            return cpu, f"datasheet of {hardware.name} + efficiency of local-cpu ({cpu.how})"
        return ACCELERATOR_PRIOR, f"datasheet of {hardware.name} + {ACCELERATOR_PRIOR.how}"
    # Accelerators: the measured GPU operator profile, if there is one.
    gpu = load_efficiency("h200")
    if gpu is not None:
        return gpu, f"datasheet of {hardware.name} + efficiency of h200 ({gpu.how})"
    return ACCELERATOR_PRIOR, f"datasheet of {hardware.name} + {ACCELERATOR_PRIOR.how}"


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes (aggregated over its sequences)."""

    num_prefill_tokens: int  # new prompt tokens (all chunks)
    num_decode_tokens: int  # decode tokens, including speculative ones being verified
    num_seqs: int  # sequences scheduled
    num_sampled: int  # sequences that sample a token at the end of the step
    prefill_attn_pairs: float  # sum over chunks of new x (cached + (new + 1) / 2)
    prefill_cached_tokens: int  # context of chunked/prefix-hit prefills read from the KV cache
    decode_ctx_tokens: int  # sum of decode sequences' context lengths

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


@dataclass(frozen=True)
class StepTime:
    """One step's time by operator class (seconds)."""

    gemm_s: float
    attention_s: float
    comm_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.comm_s + self.overhead_s


class StepTimeModel:
    """Step times of one model on one hardware (x tensor-parallel devices) in given formats."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: Hardware,
        *,
        weight_format: str = "bf16",
        kv_cache_format: str | None = None,
        compute_format: str | None = None,
        tensor_parallel_size: int = 1,
        efficiency: Efficiency | None = None,
        basis: str | None = None,
        compute_parallelism: float = 1.0,
        graph_max_tokens: int | None = None,
    ) -> None:
        """`compute_parallelism`: how many times the cores the calibration's engine computed on
        (a CPU engine given every core where vLLM keeps one for its frontend: 2.0 on 2 cores);
        the compute and memory times are divided by it, the fixed costs are not.
        `graph_max_tokens`: the most tokens a step the engine runs inside its CUDA graphs holds (0:
        none, an eager engine); a step of more costs at least the efficiency's
        `eager_step_floor_ms` plus `eager_layer_floor_us` per layer. None: graphs unknown, no floor."""
        self.model = model
        self.hardware = hardware
        self.tp = tensor_parallel_size
        self.weight_format = weight_format
        self.kv_cache_format = kv_cache_format or weight_format
        self.compute_format = compute_format or weight_format
        if efficiency is None:
            efficiency, found_basis = nearest_measured(hardware)
            basis = basis or found_basis
        self.efficiency = efficiency
        self.basis = basis or f"given efficiency ({efficiency.how})"
        if (
            hardware.kind == "cpu"
            and efficiency.measured
            and self.compute_format != "fp32"
            and self.compute_format not in efficiency.format_factors
        ):
            # The CPU fit is float32's; another format's engine kernels were not timed on this
            # host, so only the matmul peak measured for it scales the fit (not its kernels).
            self.basis += (
                f"; {self.compute_format} not calibrated on this host: the float32 fit at its "
                "measured matmul peak"
            )
        eff = efficiency
        peak = hardware.peak_flops(self.compute_format)
        bw = hardware.memory_bandwidth_bytes_per_s
        tp = float(self.tp)
        # Seconds per unit of work, precomputed so the simulator's inner loop is cheap.
        if not compute_parallelism > 0:
            raise ValueError("compute_parallelism must be positive")
        factor = eff.format_factors.get(self.compute_format, 1.0) / compute_parallelism
        attn_factor = (
            eff.format_attention_factors.get(
                self.compute_format, eff.format_factors.get(self.compute_format, 1.0)
            )
            / compute_parallelism
        )
        self._s_per_gemm_flop = factor / (peak * eff.gemm_efficiency)
        self._s_per_attn_flop = attn_factor / (peak * eff.attention_efficiency)
        self._s_per_byte = eff.format_memory_factors.get(self.compute_format, 1.0) / (
            bw * eff.memory_efficiency * compute_parallelism
        )
        self._linear_flops = model.linear_flops_per_token() / tp
        self._lm_flops = model.lm_head_flops_per_sampled_token() / tp
        self._pair_prefill = model.attention_flops_per_pair(decode=False) / tp
        self._pair_decode = model.attention_flops_per_pair(decode=True) / tp
        self._kv_bytes = model.kv_bytes_per_token(self.kv_cache_format) / tp
        self._dense_weight_bytes = model.weight_bytes(weight_format) / tp
        self._moe_cache: dict[int, float] = {}
        # With the fused-MoE op fitted (`Efficiency.moe_measured`), a MoE model's routed experts
        # are their own roofline (grouped GEMMs: their bytes and FLOPs at the op's fitted
        # shares) plus the op's floor per MoE layer; the rest of the layers keep the dense one.
        self._moe_split = model.is_moe and eff.moe_measured
        if self._moe_split:
            expert = 3 * model.hidden_size * model.moe_intermediate_size
            routed = model.num_experts * expert * model.num_moe_layers
            self._routed_bytes = routed * format_bytes(weight_format) / tp
            self._routed_flops = 2.0 * model.num_experts_per_token * expert * model.num_moe_layers / tp
            self._other_bytes = self._dense_weight_bytes - self._routed_bytes
            self._other_flops = self._linear_flops - self._routed_flops
            self._s_per_moe_byte = eff.format_memory_factors.get(self.compute_format, 1.0) / (
                bw * eff.moe_memory_efficiency * compute_parallelism
            )
            self._s_per_moe_flop = factor / (peak * eff.moe_gemm_efficiency)
            self._moe_fixed = model.num_moe_layers * eff.moe_floor_us / 1e6
        if not 0.0 <= eff.attention_split <= 1.0:
            raise ValueError(f"attention_split must be in [0, 1], not {eff.attention_split}")
        self._attention_split = eff.attention_split
        self._overhead_fixed = eff.step_overhead_ms / 1000.0
        for name in EAGER_FIT_FIELDS:
            if not getattr(eff, name) >= 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(eff, name)}")
        self.eager_floor_s = (
            eff.eager_step_floor_ms / 1e3 + model.num_layers * eff.eager_layer_floor_us / 1e6
            if graph_max_tokens is not None
            else 0.0
        )
        self.graph_max_tokens = graph_max_tokens if graph_max_tokens is not None else 0
        self._overhead_seq = eff.seq_overhead_ms / 1000.0
        self._overhead_token = (
            eff.token_overhead_ms / 1000.0
            + eff.token_compute_share * self._linear_flops * self._s_per_gemm_flop
        )
        self.request_overhead_s = eff.request_overhead_ms / 1000.0
        self.stream_overhead_s = eff.stream_overhead_ms / 1000.0
        self.prompt_token_overhead_s = eff.prompt_token_overhead_ms / 1000.0
        if self.tp > 1:
            link = hardware.interconnect_gbps.value * 1e9 * eff.comm_efficiency
            if link <= 0:
                raise ValueError(f"{hardware.name} has no scale-up link for tensor parallelism")
            act_bytes = model.hidden_size * 2.0  # bf16 activations per token
            self._comm_per_token = 2 * model.num_layers * act_bytes * 2 * (tp - 1) / tp / link
            self._comm_fixed = 2 * model.num_layers * eff.comm_latency_us / 1e6
        else:
            self._comm_per_token = 0.0
            self._comm_fixed = 0.0

    def _weight_bytes(self, num_tokens: int) -> float:
        if not self.model.is_moe:
            return self._dense_weight_bytes
        key = min(num_tokens, 4096)
        value = self._moe_cache.get(key)
        if value is None:
            value = self.model.weight_bytes_touched(key, self.weight_format) / self.tp
            self._moe_cache[key] = value
        return value

    def moe_seconds(self, num_tokens: int) -> float:
        """The routed experts' time in a step of `num_tokens` tokens where the fused-MoE op is
        fitted (its floor included); 0 otherwise (then they are inside the dense roofline)."""
        if not self._moe_split or num_tokens <= 0:
            return 0.0
        touched = self._weight_bytes(num_tokens) - self._other_bytes  # the routed experts hit (cached)
        return (
            max(num_tokens * self._routed_flops * self._s_per_moe_flop, touched * self._s_per_moe_byte)
            + self._moe_fixed
        )

    def _gemm_seconds(self, num_tokens: int, num_sampled: int) -> float:
        """The layers' matmuls and the LM head: one roofline, or the dense one plus the MoE op's."""
        if self._moe_split:
            flops = num_tokens * self._other_flops + num_sampled * self._lm_flops
            other = max(flops * self._s_per_gemm_flop, self._other_bytes * self._s_per_byte)
            return other + self.moe_seconds(num_tokens)
        gemm_flops = num_tokens * self._linear_flops + num_sampled * self._lm_flops
        return max(gemm_flops * self._s_per_gemm_flop, self._weight_bytes(num_tokens) * self._s_per_byte)

    def step_time(self, shape: StepShape) -> StepTime:
        return StepTime(
            *self.step_parts(
                shape.num_tokens,
                shape.num_seqs,
                shape.num_sampled,
                shape.prefill_attn_pairs,
                shape.prefill_cached_tokens,
                shape.decode_ctx_tokens,
            )
        )

    def step_parts(
        self,
        num_tokens: int,
        num_seqs: int,
        num_sampled: int,
        prefill_attn_pairs: float,
        prefill_cached_tokens: int,
        decode_ctx_tokens: int,
    ) -> tuple[float, float, float, float]:
        """A step's (gemm, attention, communication, overhead) seconds, without building objects
        (the simulator's hot path; `step_time` wraps them)."""
        if num_tokens <= 0:
            return 0.0, 0.0, 0.0, 0.0
        gemm = self._gemm_seconds(num_tokens, num_sampled)
        attention = self._attention_seconds(
            prefill_attn_pairs, prefill_cached_tokens, decode_ctx_tokens, num_tokens
        )
        comm = self._comm_fixed + num_tokens * self._comm_per_token if self.tp > 1 else 0.0
        overhead = self._overhead_fixed + num_seqs * self._overhead_seq + num_tokens * self._overhead_token
        if self.eager_floor_s and num_tokens > self.graph_max_tokens:
            short = self.eager_floor_s - (gemm + attention + comm + overhead)
            if short > 0:  # the host's launches, not the GPU's work, set this step's time
                overhead += short
        return gemm, attention, comm, overhead

    def eager_floored(self, num_tokens: int) -> bool:
        """Whether a step of `num_tokens` runs outside the CUDA graphs under a floor."""
        return bool(self.eager_floor_s) and num_tokens > self.graph_max_tokens

    def step_seconds(
        self,
        num_tokens: int,
        num_seqs: int,
        num_sampled: int,
        prefill_attn_pairs: float,
        prefill_cached_tokens: int,
        decode_ctx_tokens: int,
    ) -> float:
        """`step_time(...).total_s` without building objects (the simulator's hot path)."""
        if num_tokens <= 0:
            return 0.0
        if self._moe_split:
            gemm = self._gemm_seconds(num_tokens, num_sampled)
        else:
            gemm = (num_tokens * self._linear_flops + num_sampled * self._lm_flops) * self._s_per_gemm_flop
            wb = self._weight_bytes(num_tokens) * self._s_per_byte
            if wb > gemm:
                gemm = wb
        attn = self._attention_seconds(
            prefill_attn_pairs, prefill_cached_tokens, decode_ctx_tokens, num_tokens
        )
        total = (
            gemm
            + attn
            + self._overhead_fixed
            + num_seqs * self._overhead_seq
            + num_tokens * self._overhead_token
        )
        if self.tp > 1:
            total += self._comm_fixed + num_tokens * self._comm_per_token
        if self.eager_floor_s and num_tokens > self.graph_max_tokens and total < self.eager_floor_s:
            return self.eager_floor_s
        return total

    def _attention_seconds(
        self, prefill_attn_pairs: float, prefill_cached_tokens: int, decode_ctx_tokens: int, num_tokens: int
    ) -> float:
        """A step's attention: one roofline over all of it, or (`attention_split`) its prompt
        chunks' and its decodes' each at their own, summed; the same where the step has one kind."""
        s_flop = self._s_per_attn_flop
        s_byte = self._kv_bytes * self._s_per_byte
        prefill_flops = prefill_attn_pairs * self._pair_prefill
        decode_flops = decode_ctx_tokens * self._pair_decode
        kv_tokens = decode_ctx_tokens + prefill_cached_tokens + num_tokens
        whole = max((prefill_flops + decode_flops) * s_flop, kv_tokens * s_byte)
        split = self._attention_split
        if not split or prefill_attn_pairs <= 0 or decode_ctx_tokens <= 0:
            return whole
        # The decodes read their contexts; the chunks read their cached context and write (with
        # the decodes' new tokens, a small term) the step's new KV.
        decode = max(decode_flops * s_flop, decode_ctx_tokens * s_byte)
        chunks = max(prefill_flops * s_flop, (kv_tokens - decode_ctx_tokens) * s_byte)
        return whole + split * (decode + chunks - whole)

    # Work terms the calibration regresses on (same definitions as `step_time`).
    def work_terms(self, shape: StepShape) -> tuple[float, float, float, float]:
        """(gemm FLOPs, attention FLOPs, sequences, tokens) of a step."""
        tokens = shape.num_tokens
        gemm_flops = tokens * self._linear_flops + shape.num_sampled * self._lm_flops
        attn_flops = (
            shape.prefill_attn_pairs * self._pair_prefill + shape.decode_ctx_tokens * self._pair_decode
        )
        return gemm_flops, attn_flops, float(shape.num_seqs), float(tokens)


def step_model_for(
    model: ModelSpec,
    hardware_name: str,
    *,
    weight_format: str = "bf16",
    kv_cache_format: str | None = None,
    tensor_parallel_size: int = 1,
) -> StepTimeModel:
    return StepTimeModel(
        model,
        get_hardware(hardware_name),
        weight_format=weight_format,
        kv_cache_format=kv_cache_format,
        tensor_parallel_size=tensor_parallel_size,
    )
