"""One-call entry points: replay a trace file, or generated arrivals, against an endpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from serving.loadgen.arrivals import gamma_offsets_s, trace_offsets_s
from serving.loadgen.prompts import PromptSynthesizer
from serving.loadgen.results import SLO, ReplayResult, ReplaySettings
from serving.loadgen.runner import replay, resolve_target, resolve_tokenizer
from serving.loadgen.traces import TraceRequest, read_trace


def replay_trace(
    *,
    endpoint: str,
    trace: Path,
    model: str | None = None,
    tokenizer: str | Path | None = None,
    api: str = "completions",
    api_key: str | None = None,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    rate_rps: float | None = None,
    arrival_cv: float = 1.0,
    max_requests: int | None = None,
    skip: int = 0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    ignore_eos: bool = True,
    seed: int = 0,
    slo: SLO | None = None,
    request_timeout_s: float = 600.0,
    progress: bool | None = None,
    client_processes: int = 1,
    connect_to: Mapping[str, Sequence[str]] | None = None,
) -> ReplayResult:
    """Replay `trace` against `endpoint`: by its timestamps (x `time_scale` / `rate_scale`), or,
    with `rate_rps`, with the trace's requests (lengths and prefixes) sent by a gamma process at
    that rate (`arrival_cv` 1 = Poisson, 0 = constant spacing). `connect_to` (host name ->
    addresses) makes the requests connect to those addresses only (see
    serving.loadgen.runner.PinnedResolver); give `model` with it, as the endpoint's model list is
    not fetched through the pins."""
    if connect_to is not None and model is None:
        raise ValueError(
            "give the model name with connect_to: the model list is not fetched through the pins"
        )
    target, models = resolve_target(endpoint, model=model, api=api, api_key=api_key)
    tok = resolve_tokenizer(tokenizer, target, models)
    synthesizer = PromptSynthesizer(tok, seed=seed, chat=api == "chat")
    requests = read_trace(trace, max_requests=max_requests, skip=skip)
    if rate_rps is None:
        offsets = trace_offsets_s(requests, time_scale=time_scale, rate_scale=rate_scale)
    else:
        rng = np.random.default_rng([seed, 1])
        offsets = gamma_offsets_s(len(requests), rate_rps=rate_rps, rng=rng, cv=arrival_cv)
    settings = ReplaySettings(
        endpoint=target.base_url,
        model=target.model,
        api=api,
        source=str(trace),
        time_scale=time_scale,
        rate_scale=rate_scale,
        rate_rps=rate_rps,
        arrival_cv=arrival_cv if rate_rps is not None else None,
        max_requests=max_requests,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        ignore_eos=ignore_eos,
        seed=seed,
        tokenizer=str(tok.source),
    )
    return replay(
        requests,
        offsets,
        target=target,
        synthesizer=synthesizer,
        settings=settings,
        slo=slo,
        request_timeout_s=request_timeout_s,
        progress=progress,
        client_processes=client_processes,
        connect_to=connect_to,
    )


def replay_generated(
    *,
    endpoint: str,
    num_requests: int,
    rate_rps: float,
    num_prompt_tokens: int,
    num_output_tokens: int,
    arrival_cv: float = 1.0,
    model: str | None = None,
    tokenizer: str | Path | None = None,
    api: str = "completions",
    api_key: str | None = None,
    ignore_eos: bool = True,
    seed: int = 0,
    slo: SLO | None = None,
    request_timeout_s: float = 600.0,
    progress: bool | None = None,
    client_processes: int = 1,
) -> ReplayResult:
    """Requests of fixed lengths sent by a gamma process (cv 1 = Poisson, 0 = constant spacing).

    `client_processes` > 1 spreads them over that many client processes (`runner.run_sharded`):
    hundreds of concurrent streams on one event loop measure the loop, not the engine."""
    target, models = resolve_target(endpoint, model=model, api=api, api_key=api_key)
    tok = resolve_tokenizer(tokenizer, target, models)
    synthesizer = PromptSynthesizer(tok, seed=seed, chat=api == "chat")
    rng = np.random.default_rng(seed)
    offsets = gamma_offsets_s(num_requests, rate_rps=rate_rps, rng=rng, cv=arrival_cv)
    requests = [
        TraceRequest(arrival_s=t, num_prompt_tokens=num_prompt_tokens, num_output_tokens=num_output_tokens)
        for t in offsets
    ]
    source = "poisson" if arrival_cv == 1.0 else "gamma"
    settings = ReplaySettings(
        endpoint=target.base_url,
        model=target.model,
        api=api,
        source=source,
        time_scale=1.0,
        rate_scale=1.0,
        rate_rps=rate_rps,
        arrival_cv=arrival_cv,
        max_requests=num_requests,
        max_prompt_tokens=None,
        max_output_tokens=None,
        ignore_eos=ignore_eos,
        seed=seed,
        tokenizer=str(tok.source),
    )
    return replay(
        requests,
        offsets,
        target=target,
        synthesizer=synthesizer,
        settings=settings,
        slo=slo,
        request_timeout_s=request_timeout_s,
        progress=progress,
        client_processes=client_processes,
    )
