"""Scheduler simulator mirroring vLLM v1, driven by the calibrated step-latency model."""

from serving.sim.api import (
    CandidateScore,
    LatencyTargets,
    max_rate_scale,
    rank_candidates,
    result_to_dict,
    simulate_trace,
)
from serving.sim.kv import BlockPool
from serving.sim.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, SimRequest
from serving.sim.simulator import Attribution, SimResult, TimeBreakdown, resolve_config, simulate

__all__ = [
    "Attribution",
    "BlockPool",
    "CandidateScore",
    "LatencyTargets",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SimRequest",
    "SimResult",
    "TimeBreakdown",
    "max_rate_scale",
    "rank_candidates",
    "resolve_config",
    "result_to_dict",
    "simulate",
    "simulate_trace",
]
