"""Inputs shared by the serving tests: the engine configuration of the live tests and a vLLM
/metrics page with chosen counters."""

from __future__ import annotations

from serving.engine import EngineConfig

# The engine tests' model length: long enough for trace slices capped at 2-3k prompt tokens.
ENGINE_MAX_MODEL_LEN = 4096


def engine_config() -> EngineConfig:
    return EngineConfig.cpu_default(max_model_len=ENGINE_MAX_MODEL_LEN, cpu_kv_cache_space_gib=1, seed=0)


MODEL = 'engine="0",model_name="/models/llama"'


def metrics_text(
    *, queries: float, hits: float, prompt: float, ttft_buckets: list[float], ttft_sum: float
) -> str:
    bounds = ["0.01", "0.1", "1.0", "+Inf"]
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{MODEL}}} 2.0",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{MODEL}}} 5.0",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{MODEL}}} 0.25",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{{{MODEL}}} {queries}",
        f"vllm:prefix_cache_queries_created{{{MODEL}}} 1.7e+09",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{{{MODEL}}} {hits}",
        "# TYPE vllm:prompt_tokens counter",
        f"vllm:prompt_tokens_total{{{MODEL}}} {prompt}",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{MODEL}}} 10.0",
        "# TYPE vllm:request_success counter",
        f'vllm:request_success_total{{{MODEL},finished_reason="length"}} 3.0',
        f'vllm:request_success_total{{{MODEL},finished_reason="stop"}} 1.0',
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    for le, count in zip(bounds, ttft_buckets, strict=True):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{MODEL},le="{le}"}} {count}')
    lines += [
        f"vllm:time_to_first_token_seconds_count{{{MODEL}}} {ttft_buckets[-1]}",
        f"vllm:time_to_first_token_seconds_sum{{{MODEL}}} {ttft_sum}",
    ]
    return "\n".join(lines) + "\n"
