"""Load generator: open-loop trace replay against any OpenAI-compatible endpoint."""

from serving.loadgen.api import replay_generated, replay_trace
from serving.loadgen.arrivals import gamma_offsets_s, poisson_offsets_s, trace_offsets_s
from serving.loadgen.prompts import PromptSynthesizer, SynthesizedPrompt
from serving.loadgen.results import (
    SLO,
    LatencyStats,
    ReplayResult,
    ReplaySettings,
    ReplaySummary,
    RequestResult,
)
from serving.loadgen.runner import Target, replay, resolve_target
from serving.loadgen.tokenizer import PromptTokenizer, TokenizerUnavailable
from serving.loadgen.traces import TraceFormatError, TraceRequest, read_trace

__all__ = [
    "SLO",
    "LatencyStats",
    "PromptSynthesizer",
    "PromptTokenizer",
    "ReplayResult",
    "ReplaySettings",
    "ReplaySummary",
    "RequestResult",
    "SynthesizedPrompt",
    "Target",
    "TokenizerUnavailable",
    "TraceFormatError",
    "TraceRequest",
    "gamma_offsets_s",
    "poisson_offsets_s",
    "read_trace",
    "replay",
    "replay_generated",
    "replay_trace",
    "resolve_target",
    "trace_offsets_s",
]
