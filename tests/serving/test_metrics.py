"""Parsing vLLM's Prometheus /metrics into typed snapshots."""

from __future__ import annotations

import math

import pytest

from serving.metrics import (
    Histogram,
    MetricsFormatError,
    parse_prometheus,
    snapshot_delta,
    snapshot_from_text,
)
from tests.serving.helpers import metrics_text


def test_snapshot_fields() -> None:
    text = metrics_text(queries=1000, hits=250, prompt=1000, ttft_buckets=[0, 4, 10, 10], ttft_sum=2.0)
    snap = snapshot_from_text(text, taken_at_s=100.0)
    assert snap.num_requests_running == 2 and snap.num_requests_waiting == 5
    assert snap.kv_cache_usage_ratio == 0.25
    assert snap.requests_finished_total == 4  # summed over finish reasons
    assert snap.prefix_cache_hit_rate == 0.25
    assert snap.ttft_s.count == 10 and snap.ttft_s.mean == pytest.approx(0.2)


def test_the_engines_tokens_per_step_are_read_as_its_steps() -> None:
    text = (
        metrics_text(queries=0, hits=0, prompt=0, ttft_buckets=[0, 0, 0, 0], ttft_sum=0.0)
        + "".join(
            f'vllm:iteration_tokens_total_bucket{{le="{le}"}} {n}\n'
            for le, n in (("1.0", 40), ("512.0", 50), ("1024.0", 58), ("+Inf", 60))
        )
        + "vllm:iteration_tokens_total_count 60\nvllm:iteration_tokens_total_sum 9000\n"
    )
    snap = snapshot_from_text(text)
    assert snap.step_tokens.count == 60 and snap.step_tokens.mean == 150.0
    assert snap.step_tokens.bounds == (1.0, 512.0, 1024.0, math.inf)
    # an engine that does not export it: no steps, not zero of them
    assert (
        snapshot_from_text(
            metrics_text(queries=0, hits=0, prompt=0, ttft_buckets=[0, 0, 0, 0], ttft_sum=0.0)
        ).step_tokens.count
        == 0
    )


def test_histogram_quantiles_interpolate_within_buckets() -> None:
    h = Histogram(bounds=(0.01, 0.1, 1.0, math.inf), cumulative_counts=(0, 4, 10, 10), sum=2.0, count=10)
    # rank 5 is the first of 6 observations in (0.1, 1.0]: 0.1 + 0.9 * 1/6
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.9 * (5 - 4) / 6)
    # rank 2 is halfway through the (0.01, 0.1] bucket's 4 observations
    assert h.quantile(0.2) == pytest.approx(0.01 + 0.09 * 2 / 4)
    assert h.quantile(1.0) == pytest.approx(1.0)
    assert math.isnan(Histogram.empty().quantile(0.5))


def test_quantile_in_the_infinite_bucket_is_the_last_finite_bound() -> None:
    h = Histogram(bounds=(0.1, 1.0, math.inf), cumulative_counts=(1, 2, 10), sum=50.0, count=10)
    assert h.quantile(0.99) == 1.0


def test_delta_gives_rates_interval_percentiles_and_hit_rate() -> None:
    earlier = snapshot_from_text(
        metrics_text(queries=1000, hits=0, prompt=1000, ttft_buckets=[0, 4, 4, 4], ttft_sum=0.2),
        taken_at_s=10.0,
    )
    later = snapshot_from_text(
        metrics_text(queries=3000, hits=1500, prompt=3000, ttft_buckets=[0, 4, 10, 10], ttft_sum=2.0),
        taken_at_s=20.0,
    )
    delta = snapshot_delta(earlier, later)
    assert delta.interval_s == 10.0
    assert delta.prompt_tokens_per_s == 200.0
    assert delta.prefix_cache_queries_tokens == 2000 and delta.prefix_cache_hits_tokens == 1500
    assert delta.prefix_cache_hit_rate == 0.75
    # Only the 6 new observations, all in (0.1, 1.0]: the median is in the middle of that bucket.
    assert delta.ttft_p50_ms == pytest.approx((0.1 + 0.9 * 3 / 6) * 1000)
    # The interval's mean is exact: (2.0 - 0.2) s over the 6 new observations.
    assert delta.ttft_mean_ms == pytest.approx(1.8 / 6 * 1000)
    # No queue or prefill histograms in these texts: no means, rather than zeros.
    assert math.isnan(delta.queue_mean_ms) and math.isnan(delta.prefill_mean_ms)


def test_parser_handles_escapes_infinities_and_old_prefixes() -> None:
    text = (
        '# TYPE x gauge\nx{path="a\\"b\\\\c",le="+Inf"} +Inf\n'
        "vllm_prompt_tokens_total 42\n"
        "y 1.5 1700000000000\n"
    )
    types, samples = parse_prometheus(text)
    assert types == {"x": "gauge"}
    assert dict(samples[0].labels)["path"] == 'a"b\\c'
    assert samples[0].value == math.inf
    assert samples[2].value == 1.5
    assert snapshot_from_text(text).prompt_tokens_total == 42


def test_malformed_line_is_named() -> None:
    with pytest.raises(MetricsFormatError, match="line 2"):
        parse_prometheus("ok 1\nthis is not a sample at all\n")
