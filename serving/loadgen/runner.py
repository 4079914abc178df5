"""Open-loop replay against an OpenAI-compatible endpoint.

Design notes:
- Open loop: each request leaves at its scheduled time whether or not earlier ones finished; a
  slow endpoint shows up as latency, never as a slower offered load. Send lateness (actual minus
  scheduled send time) is recorded per request so a client that cannot keep up is visible.
- One event loop and one shared connection pool, its keep-alive connections opened before the
  first send (a served model's clients keep theirs open; a handshake is not the engine's time);
  prompts are synthesised and request bodies serialised before the first send, so the loop does
  nothing heavy while requests are in flight.
- The loop's thread reads under the real-time FIFO policy where the host allows it
  (`scheduling.prompt_reads`): on a host whose cores the engine keeps busy, a client at the
  normal policy read its tokens when the kernel next ran it, not when they arrived.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import socket
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from serving._http import http_get
from serving.loadgen.client import PreparedRequest, Timing, build_body, send_streaming
from serving.loadgen.progress import ProgressBar
from serving.loadgen.prompts import PromptSynthesizer
from serving.loadgen.results import SLO, ReplayResult, ReplaySettings, RequestResult, summarize
from serving.loadgen.scheduling import on_this_host, prompt_reads
from serving.loadgen.tokenizer import PromptTokenizer, TokenizerUnavailable
from serving.loadgen.traces import TraceRequest

T = TypeVar("T")

START_LEAD_S = 0.05  # the first send is scheduled this far after setup, so it is not born late
# With several client processes, the shared start is this far ahead: every process must have
# imported its client and opened its loop before the first send.
_SHARDED_START_LEAD_S = 3.0
MAX_CLIENT_PROCESSES = 32
# Keep-alive connections opened before the first timed send (at most one per request): a client
# of a served model keeps its connections open, so a TTFT that paid for a TCP handshake and the
# client's first connection set-up would be the client's cost, largest at low load.
WARM_CONNECTIONS_MAX = 64


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible endpoint and the model to ask for."""

    base_url: str  # scheme://host:port[/prefix], without the trailing /v1
    model: str
    api: str = "completions"  # or "chat"
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1/{'chat/completions' if self.api == 'chat' else 'completions'}"

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def normalize_base_url(endpoint: str) -> str:
    """`http://h:p`, `http://h:p/` and `http://h:p/v1` all name the same endpoint."""
    url = endpoint.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def list_models(
    base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0
) -> list[dict[str, object]]:
    """The `/v1/models` list of an OpenAI-compatible endpoint."""
    status, body = http_get(f"{normalize_base_url(base_url)}/v1/models", timeout_s=timeout_s, api_key=api_key)
    if status != 200:
        raise RuntimeError(f"{base_url}/v1/models answered HTTP {status}: {body[:200]!r}")
    payload = json.loads(body.decode())
    return [m for m in payload.get("data", []) if isinstance(m, dict)]


def resolve_target(
    endpoint: str, *, model: str | None = None, api: str = "completions", api_key: str | None = None
) -> tuple[Target, list[dict[str, object]]]:
    """The target, asking the endpoint's `/v1/models` for the model name when none is given."""
    base = normalize_base_url(endpoint)
    models: list[dict[str, object]] = []
    if model is None:
        models = list_models(base, api_key=api_key)
        if not models:
            raise ValueError(f"{base}/v1/models lists no model; pass the model name")
        model = str(models[0]["id"])
    if api not in ("completions", "chat"):
        raise ValueError(f"api must be 'completions' or 'chat', not {api!r}")
    return Target(base_url=base, model=model, api=api, api_key=api_key), models


@functools.lru_cache(maxsize=8)
def _loaded_tokenizer(path: str, stamp: tuple[int, ...]) -> PromptTokenizer:
    return PromptTokenizer(Path(path))


def load_tokenizer(source: Path) -> PromptTokenizer:
    """The tokenizer at `source`, loaded once per process while its files are unchanged (a large
    vocabulary takes seconds to load, and a process replaying many short runs, one trial or one
    request after another, would pay it every time). A `PromptTokenizer` is read-only once built,
    so the replays share it."""
    if not source.exists():
        return PromptTokenizer(source)  # says why
    files = [source] + (sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else [])
    stamp = tuple(v for st in (f.stat() for f in files) for v in (st.st_mtime_ns, st.st_size))
    return _loaded_tokenizer(str(source.resolve()), stamp)


def resolve_tokenizer(
    tokenizer: str | Path | None, target: Target, models: Sequence[dict[str, object]]
) -> PromptTokenizer:
    """The local tokenizer: the one given, else the served model's path if it exists here (vLLM's `root`)."""
    if tokenizer is not None:
        return load_tokenizer(Path(tokenizer))
    candidates = [str(m.get("root") or "") for m in models if m.get("id") == target.model] + [target.model]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return load_tokenizer(Path(candidate))
    raise TokenizerUnavailable(
        f"no local tokenizer for model {target.model!r}: pass --tokenizer DIR (the model's tokenizer files)"
    )


def prepare_requests(
    requests: Sequence[TraceRequest],
    offsets_s: Sequence[float],
    *,
    synthesizer: PromptSynthesizer,
    target: Target,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    ignore_eos: bool = True,
) -> list[PreparedRequest]:
    """Synthesise every prompt and serialise every body ahead of the run."""
    prepared = []
    for index, (request, offset) in enumerate(zip(requests, offsets_s, strict=True)):
        prompt = synthesizer.synthesize(request, request_index=index, max_prompt_tokens=max_prompt_tokens)
        out = max(1, request.num_output_tokens)
        if max_output_tokens is not None:
            out = min(out, max_output_tokens)
        body = build_body(
            api=target.api,
            model=target.model,
            prompt=prompt.text,
            max_output_tokens=out,
            ignore_eos=ignore_eos,
        )
        prepared.append(
            PreparedRequest(
                index=index,
                scheduled_s=offset,
                url=target.url,
                body=body,
                num_prompt_tokens=prompt.num_prompt_tokens,
                max_output_tokens=out,
            )
        )
    return prepared


def _to_result(request: PreparedRequest, timing: Timing, start: float) -> RequestResult:
    lateness_ms = (timing.sent_at - (start + request.scheduled_s)) * 1000.0
    ttft_ms = (timing.first_token_at - timing.sent_at) * 1000.0 if timing.first_token_at is not None else None
    e2e_ms = (timing.last_at - timing.sent_at) * 1000.0 if timing.last_at is not None else None
    num_out = (
        timing.completion_tokens_reported
        if timing.completion_tokens_reported is not None
        else timing.num_chunks
    )
    tpot_ms = None
    if ttft_ms is not None and e2e_ms is not None and num_out > 1:
        tpot_ms = (e2e_ms - ttft_ms) / (num_out - 1)
    return RequestResult(
        index=request.index,
        scheduled_s=request.scheduled_s,
        send_lateness_ms=lateness_ms,
        num_prompt_tokens=request.num_prompt_tokens,
        num_prompt_tokens_reported=timing.prompt_tokens_reported,
        max_output_tokens=request.max_output_tokens,
        num_output_tokens=num_out if timing.error is None else 0,
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms if timing.error is None else None,
        tpot_ms=tpot_ms if timing.error is None else None,
        itl_ms=tuple(g * 1000.0 for g in timing.chunk_gaps_s),
        status=timing.status,
        error=timing.error,
    )


class PinnedResolver(aiohttp.abc.AbstractResolver):
    """Answers host names from a fixed map only (name -> addresses the caller resolved and
    checked), so every connection goes where the caller looked: a name that would resolve
    elsewhere by now (DNS rebinding) is never looked up again, and any other name is refused."""

    def __init__(self, pins: Mapping[str, Sequence[str]]) -> None:
        self._pins = {host.lower().rstrip("."): tuple(addresses) for host, addresses in pins.items()}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        addresses = self._pins.get(host.lower().rstrip("."))
        if not addresses:
            raise OSError(f"{host} is not an address checked for this run; not connecting")
        return [
            aiohttp.abc.ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


async def run_prepared(
    prepared: Sequence[PreparedRequest],
    *,
    headers: dict[str, str],
    request_timeout_s: float = 600.0,
    connect_timeout_s: float = 10.0,
    max_connections: int = 0,
    progress: ProgressBar | None = None,
    start_at: float | None = None,
    connect_to: Mapping[str, Sequence[str]] | None = None,
    warm_connections: int | None = None,
) -> tuple[list[RequestResult], float, str]:
    """Send `prepared` on schedule; returns per-request results, the run's duration and start time.

    `start_at`: the `time.perf_counter()` instant that schedule offsets count from (a shared start
    across client processes: the clock is the system's monotonic one); default just after setup.
    `connect_to`: host name -> the addresses to connect to for it (see PinnedResolver); None
    resolves names as usual.
    `warm_connections`: keep-alive connections opened before the first send (None: one per
    request up to WARM_CONNECTIONS_MAX; 0: none), each by a GET whose answer is ignored."""
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=connect_timeout_s)
    # limit=0: no cap on open connections, so a slow endpoint never holds back a send (open loop).
    connector = aiohttp.TCPConnector(
        limit=max_connections,
        keepalive_timeout=75,
        resolver=PinnedResolver(connect_to) if connect_to is not None else None,
    )
    order = sorted(prepared, key=lambda r: r.scheduled_s)
    timings: dict[int, Timing] = {}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if order:
            wanted = min(len(order), WARM_CONNECTIONS_MAX) if warm_connections is None else warm_connections
            if max_connections > 0:
                wanted = min(wanted, max_connections)
            await _warm(session, order[0].url, wanted, headers)

        async def one(request: PreparedRequest) -> None:
            timing = await send_streaming(session, request, headers)
            timings[request.index] = timing
            if progress is not None:
                progress.update(error=timing.error is not None)

        start = start_at if start_at is not None else time.perf_counter() + START_LEAD_S
        started_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        tasks = []
        for request in order:
            delay = start + request.scheduled_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(request)))
        await asyncio.gather(*tasks)
        finished = time.perf_counter()
    if progress is not None:
        progress.close()
    results = [_to_result(r, timings[r.index], start) for r in prepared]
    first_send = min((timings[r.index].sent_at for r in prepared), default=start)
    return results, finished - first_send, started_at


def warm_url(url: str) -> str:
    """Where to open a connection without asking for a completion: the API's model list (the
    OpenAI API's `GET .../v1/models`) where the request path has a /v1/ part, else the root."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    head, found, _ = parts.path.partition("/v1/")
    path = f"{head}/v1/models" if found else "/"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


async def _warm(session: aiohttp.ClientSession, url: str, count: int, headers: dict[str, str]) -> None:
    """Open up to `count` keep-alive connections to `url`'s host, all at once (so each takes its
    own), reading each answer whole so the connection returns to the pool. Best effort: a target
    that refuses the GET is then connected to by the timed requests themselves."""
    if count < 1:
        return
    probe = warm_url(url)

    async def one() -> None:
        try:
            async with session.get(probe, headers=headers, allow_redirects=False) as response:
                await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            # Not an error of the run: the timed request then opens its own connection, and a
            # target that cannot be reached fails that request, where it is recorded.
            return

    await asyncio.gather(*(one() for _ in range(count)))


def run_event_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a fresh event loop: uvloop's when installed (it comes with vLLM), else asyncio's.

    uvloop's lower per-callback cost keeps send lateness down when many streams are open. Objects
    alive before the run are frozen out of the garbage collector so its passes stay short.
    """
    gc.collect()
    gc.freeze()
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(coro)
        result: T = uvloop.run(coro)
        return result
    finally:
        gc.unfreeze()


def _shard_worker(
    args: tuple[
        list[PreparedRequest],
        dict[str, str],
        float,
        int,
        float,
        Mapping[str, Sequence[str]] | None,
        str | None,
    ],
) -> tuple[list[RequestResult], float, float, str]:
    """One client process: its share of the requests on its own event loop, from the shared start.
    Returns its results, its first send and its finish (perf_counter instants), and the
    scheduling policy its loop ran under."""
    shard, headers, request_timeout_s, max_connections, start_at, connect_to, why_not = args

    async def run() -> tuple[list[RequestResult], float, float]:
        results, duration_s, _ = await run_prepared(
            shard,
            headers=headers,
            request_timeout_s=request_timeout_s,
            max_connections=max_connections,
            start_at=start_at,
            connect_to=connect_to,
        )
        finished = time.perf_counter()
        return results, finished - duration_s, finished

    with prompt_reads(why_not is None, why_not=why_not or "") as policy:
        results, first, finished = run_event_loop(run())
    return results, first, finished, policy


def run_sharded(
    prepared: Sequence[PreparedRequest],
    *,
    headers: dict[str, str],
    processes: int,
    request_timeout_s: float = 600.0,
    max_connections: int = 0,
    connect_to: Mapping[str, Sequence[str]] | None = None,
    fifo_refused: str | None = None,
) -> tuple[list[RequestResult], float, str, str]:
    """`run_prepared` spread round-robin over `processes` client processes (each its own event
    loop), all counting the schedule from one shared start; results in request order, the run's
    duration, its start time and the scheduling policies the processes' loops ran under.
    `fifo_refused`: None, the loops read under the FIFO policy where the host allows it; else why
    they read at the normal policy (recorded)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if not 1 <= processes <= MAX_CLIENT_PROCESSES:
        raise ValueError(f"client processes must be 1 to {MAX_CLIENT_PROCESSES}, got {processes}")
    order = sorted(prepared, key=lambda r: r.scheduled_s)
    shards = [order[i::processes] for i in range(processes)]
    started_at = datetime.now(UTC).isoformat(timespec="milliseconds")
    # spawn, not fork: the caller may hold threads (meters, progress) that a fork would copy mid-state
    with ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        start_at = time.perf_counter() + _SHARDED_START_LEAD_S
        outs = list(
            pool.map(
                _shard_worker,
                [
                    (shard, headers, request_timeout_s, max_connections, start_at, connect_to, fifo_refused)
                    for shard in shards
                    if shard
                ],
            )
        )
    results = sorted((r for out, _, _, _ in outs for r in out), key=lambda r: r.index)
    first_send = min(first for _, first, _, _ in outs)
    finished = max(end for _, _, end, _ in outs)
    policies = ", ".join(sorted({policy for _, _, _, policy in outs}))
    return results, finished - first_send, started_at, policies


def replay(
    requests: Sequence[TraceRequest],
    offsets_s: Sequence[float],
    *,
    target: Target,
    synthesizer: PromptSynthesizer,
    settings: ReplaySettings,
    slo: SLO | None = None,
    request_timeout_s: float = 600.0,
    max_connections: int = 0,
    progress: bool | None = None,
    client_processes: int = 1,
    connect_to: Mapping[str, Sequence[str]] | None = None,
    realtime_reads: bool | None = None,
) -> ReplayResult:
    """Replay `requests` at `offsets_s` (seconds from start) against `target`; blocks until done.

    `client_processes` > 1 spreads the requests over that many client processes (see `run_sharded`).
    `connect_to` pins host names to addresses (see `run_prepared`).
    `realtime_reads`: the client loops read under the FIFO policy where the host allows it
    (`scheduling.prompt_reads`); None (the default) does so for a target on this host only
    (`scheduling.on_this_host`), False never (to measure what the policy changes)."""
    prepared = prepare_requests(
        requests,
        offsets_s,
        synthesizer=synthesizer,
        target=target,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_output_tokens=settings.max_output_tokens,
        ignore_eos=settings.ignore_eos,
    )
    if realtime_reads is None:
        realtime_reads = on_this_host(target.base_url)
        why_not = "target not on this host"
    else:
        why_not = "not asked"
    fifo_refused = None if realtime_reads else why_not
    if client_processes > 1:
        results, duration_s, started_at, policy = run_sharded(
            prepared,
            headers=target.headers(),
            processes=client_processes,
            request_timeout_s=request_timeout_s,
            max_connections=max_connections,
            connect_to=connect_to,
            fifo_refused=fifo_refused,
        )
        settings = replace(settings, client_processes=client_processes)
    else:
        bar = ProgressBar(len(prepared), enabled=progress)
        with prompt_reads(realtime_reads, why_not=why_not) as policy:
            results, duration_s, started_at = run_event_loop(
                run_prepared(
                    prepared,
                    headers=target.headers(),
                    request_timeout_s=request_timeout_s,
                    max_connections=max_connections,
                    progress=bar,
                    connect_to=connect_to,
                )
            )
    settings = replace(settings, client_scheduling=policy)
    summary = summarize(results, duration_s=duration_s, slo=slo or SLO())
    return ReplayResult(settings=settings, summary=summary, requests=tuple(results), started_at=started_at)
