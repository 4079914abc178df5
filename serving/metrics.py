"""vLLM's Prometheus `/metrics`, parsed into typed snapshots.

`parse_prometheus` reads the text exposition format into samples; `VllmSnapshot` picks out what
tuning and monitoring need (queue depths, KV-cache use, token and request counters, latency
histograms); `snapshot_delta` turns two snapshots into rates, interval percentiles and the
prefix-cache hit rate over the interval. Histogram percentiles are interpolated linearly inside
buckets, as Prometheus' `histogram_quantile` does.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from serving._http import http_get

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MetricsFormatError(ValueError):
    """A /metrics line could not be parsed; the message names the line."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _unescape(value: str) -> str:
    return value.replace("\\\\", "\x00").replace('\\"', '"').replace("\\n", "\n").replace("\x00", "\\")


def _number(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    return float(text)


def parse_prometheus(text: str) -> tuple[dict[str, str], list[Sample]]:
    """Parse the text format: returns ({metric family: type}, samples)."""
    types: dict[str, str] = {}
    samples: list[Sample] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsFormatError(f"line {number}: not a sample: {line[:120]!r}")
        name, _, label_text, value_text, _ = match.groups()
        labels = tuple((k, _unescape(v)) for k, v in _LABEL.findall(label_text or ""))
        try:
            value = _number(value_text)
        except ValueError as exc:
            raise MetricsFormatError(f"line {number}: value {value_text!r} is not a number") from exc
        samples.append(Sample(name=name, labels=labels, value=value))
    return types, samples


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (the last bound is +inf), with sum and count."""

    bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    sum: float
    count: float

    def quantile(self, q: float) -> float:
        """Estimated q-quantile (0..1), linear within the bucket; NaN when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be within [0, 1]")
        if self.count <= 0 or not self.bounds:
            return math.nan
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in zip(self.bounds, self.cumulative_counts, strict=True):
            if cumulative >= rank:
                if math.isinf(bound):
                    # Beyond the last finite bucket: the best estimate is that bucket's bound.
                    return lower_bound
                in_bucket = cumulative - lower_count
                if in_bucket <= 0:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / in_bucket
            lower_bound, lower_count = bound, cumulative
        return lower_bound

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan

    def minus(self, earlier: Histogram) -> Histogram:
        """Observations made between `earlier` and this one (same buckets)."""
        if earlier.bounds != self.bounds:
            raise ValueError("histograms have different buckets")
        return Histogram(
            bounds=self.bounds,
            cumulative_counts=tuple(
                a - b for a, b in zip(self.cumulative_counts, earlier.cumulative_counts, strict=True)
            ),
            sum=self.sum - earlier.sum,
            count=self.count - earlier.count,
        )

    @classmethod
    def empty(cls) -> Histogram:
        return cls(bounds=(), cumulative_counts=(), sum=0.0, count=0.0)


def _sum_samples(samples: Iterable[Sample], name: str, where: Mapping[str, str] | None = None) -> float:
    total = 0.0
    for s in samples:
        if s.name == name and (where is None or all(dict(s.labels).get(k) == v for k, v in where.items())):
            total += s.value
    return total


def _histogram(samples: list[Sample], family: str) -> Histogram:
    # Summed over engines/models: one endpoint, one distribution.
    buckets: dict[float, float] = {}
    for s in samples:
        if s.name == f"{family}_bucket":
            le = dict(s.labels).get("le")
            if le is not None:
                bound = _number(le)
                buckets[bound] = buckets.get(bound, 0.0) + s.value
    if not buckets:
        return Histogram.empty()
    bounds = tuple(sorted(buckets))
    return Histogram(
        bounds=bounds,
        cumulative_counts=tuple(buckets[b] for b in bounds),
        sum=_sum_samples(samples, f"{family}_sum"),
        count=_sum_samples(samples, f"{family}_count"),
    )


@dataclass(frozen=True)
class VllmSnapshot:
    """One scrape of a vLLM endpoint's /metrics. Counters are totals since the engine started."""

    taken_at_s: float  # time.monotonic() when scraped
    num_requests_running: float
    num_requests_waiting: float
    kv_cache_usage_ratio: float  # 0..1 (vLLM's `kv_cache_usage_perc` is a fraction despite the name)
    num_preemptions_total: float
    prompt_tokens_total: float
    generation_tokens_total: float
    requests_finished_total: float  # all finish reasons
    prefix_cache_queries_tokens_total: float  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_tokens_total: float  # of those, tokens found cached
    ttft_s: Histogram = field(repr=False)
    itl_s: Histogram = field(repr=False)
    e2e_s: Histogram = field(repr=False)
    queue_s: Histogram = field(repr=False)
    prefill_s: Histogram = field(repr=False)
    # Request shapes (tokens), what the continual loop's drift detection compares.
    prompt_tokens: Histogram = field(default_factory=Histogram.empty, repr=False)
    output_tokens: Histogram = field(default_factory=Histogram.empty, repr=False)
    # vLLM's tokens per iteration: recorded for each engine step that samples a token, counting
    # the tokens sampled and each prompt's computed tokens (less its prefix-cache hit) in the step
    # of its first token. A
    # step that only advances prompt chunks is in no count, so its count is the sampling steps,
    # not every step (`serving.sim` counts its own steps the same way to set beside it).
    step_tokens: Histogram = field(default_factory=Histogram.empty, repr=False)

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit rate since the engine started (NaN before any lookup)."""
        queries = self.prefix_cache_queries_tokens_total
        return self.prefix_cache_hits_tokens_total / queries if queries > 0 else math.nan


def snapshot_from_text(text: str, *, taken_at_s: float | None = None) -> VllmSnapshot:
    """Build a snapshot from /metrics text (either `vllm:` or older `vllm_` metric prefixes)."""
    _, samples = parse_prometheus(text)
    # Normalise `vllm_x` to `vllm:x` so one lookup table serves both spellings.
    samples = [
        Sample(
            s.name.replace("vllm_", "vllm:", 1) if s.name.startswith("vllm_") else s.name, s.labels, s.value
        )
        for s in samples
    ]

    def total(name: str) -> float:
        return _sum_samples(samples, name)

    return VllmSnapshot(
        taken_at_s=taken_at_s if taken_at_s is not None else time.monotonic(),
        num_requests_running=total("vllm:num_requests_running"),
        num_requests_waiting=total("vllm:num_requests_waiting"),
        kv_cache_usage_ratio=total("vllm:kv_cache_usage_perc"),
        num_preemptions_total=total("vllm:num_preemptions_total"),
        prompt_tokens_total=total("vllm:prompt_tokens_total"),
        generation_tokens_total=total("vllm:generation_tokens_total"),
        requests_finished_total=total("vllm:request_success_total"),
        prefix_cache_queries_tokens_total=total("vllm:prefix_cache_queries_total"),
        prefix_cache_hits_tokens_total=total("vllm:prefix_cache_hits_total"),
        ttft_s=_histogram(samples, "vllm:time_to_first_token_seconds"),
        itl_s=_histogram(samples, "vllm:inter_token_latency_seconds"),
        e2e_s=_histogram(samples, "vllm:e2e_request_latency_seconds"),
        queue_s=_histogram(samples, "vllm:request_queue_time_seconds"),
        prefill_s=_histogram(samples, "vllm:request_prefill_time_seconds"),
        prompt_tokens=_histogram(samples, "vllm:request_prompt_tokens"),
        output_tokens=_histogram(samples, "vllm:request_generation_tokens"),
        step_tokens=_histogram(samples, "vllm:iteration_tokens_total"),
    )


def scrape(base_url: str, *, timeout_s: float = 10.0, api_key: str | None = None) -> VllmSnapshot:
    """GET `{base_url}/metrics` and parse it."""
    taken = time.monotonic()
    status, body = http_get(
        f"{base_url.rstrip('/').removesuffix('/v1')}/metrics", timeout_s=timeout_s, api_key=api_key
    )
    if status != 200:
        raise MetricsFormatError(f"{base_url}/metrics answered HTTP {status}")
    text = body.decode("utf-8", errors="replace")
    return snapshot_from_text(text, taken_at_s=taken)


@dataclass(frozen=True)
class MetricsDelta:
    """What happened between two snapshots."""

    interval_s: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    requests_finished_per_s: float
    preemptions: float
    prefix_cache_queries_tokens: float
    prefix_cache_hits_tokens: float
    prefix_cache_hit_rate: float  # hits / queries over the interval; NaN without lookups
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    e2e_p50_ms: float
    e2e_p95_ms: float
    queue_p95_ms: float
    requests_finished: float = math.nan
    # Means from the histograms' sums and counts (exact, not interpolated within buckets): where
    # the engine's TTFT went, waiting to be scheduled (queue) and scheduled to first token (prefill).
    ttft_mean_ms: float = math.nan
    queue_mean_ms: float = math.nan
    prefill_mean_ms: float = math.nan
    prompt_tokens: Histogram = field(default_factory=Histogram.empty, repr=False)  # of this interval
    output_tokens: Histogram = field(default_factory=Histogram.empty, repr=False)
    step_tokens: Histogram = field(
        default_factory=Histogram.empty, repr=False
    )  # sampling steps (see VllmSnapshot)


def snapshot_delta(earlier: VllmSnapshot, later: VllmSnapshot) -> MetricsDelta:
    """Rates and interval percentiles between two snapshots of the same engine."""
    interval = later.taken_at_s - earlier.taken_at_s

    def rate(a: float, b: float) -> float:
        return (b - a) / interval if interval > 0 else math.nan

    def window(later_h: Histogram, earlier_h: Histogram) -> Histogram:
        if not later_h.bounds:
            return later_h
        if not earlier_h.bounds:
            return later_h
        return later_h.minus(earlier_h)

    ttft = window(later.ttft_s, earlier.ttft_s)
    itl = window(later.itl_s, earlier.itl_s)
    e2e = window(later.e2e_s, earlier.e2e_s)
    queue = window(later.queue_s, earlier.queue_s)
    prefill = window(later.prefill_s, earlier.prefill_s)
    queries = later.prefix_cache_queries_tokens_total - earlier.prefix_cache_queries_tokens_total
    hits = later.prefix_cache_hits_tokens_total - earlier.prefix_cache_hits_tokens_total
    return MetricsDelta(
        interval_s=interval,
        prompt_tokens_per_s=rate(earlier.prompt_tokens_total, later.prompt_tokens_total),
        generation_tokens_per_s=rate(earlier.generation_tokens_total, later.generation_tokens_total),
        requests_finished_per_s=rate(earlier.requests_finished_total, later.requests_finished_total),
        preemptions=later.num_preemptions_total - earlier.num_preemptions_total,
        prefix_cache_queries_tokens=queries,
        prefix_cache_hits_tokens=hits,
        prefix_cache_hit_rate=hits / queries if queries > 0 else math.nan,
        ttft_p50_ms=ttft.quantile(0.5) * 1000,
        ttft_p95_ms=ttft.quantile(0.95) * 1000,
        ttft_p99_ms=ttft.quantile(0.99) * 1000,
        itl_p50_ms=itl.quantile(0.5) * 1000,
        itl_p95_ms=itl.quantile(0.95) * 1000,
        e2e_p50_ms=e2e.quantile(0.5) * 1000,
        e2e_p95_ms=e2e.quantile(0.95) * 1000,
        queue_p95_ms=queue.quantile(0.95) * 1000,
        requests_finished=later.requests_finished_total - earlier.requests_finished_total,
        ttft_mean_ms=ttft.mean * 1000,
        queue_mean_ms=queue.mean * 1000,
        prefill_mean_ms=prefill.mean * 1000,
        prompt_tokens=window(later.prompt_tokens, earlier.prompt_tokens),
        output_tokens=window(later.output_tokens, earlier.output_tokens),
        step_tokens=window(later.step_tokens, earlier.step_tokens),
    )
