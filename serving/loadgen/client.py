"""One streamed request to an OpenAI-compatible endpoint, timed as a client sees it.

TTFT is taken at the first server-sent event that carries a choice (vLLM's own benchmark
client does the same, so the two are comparable); every later choice event adds an
inter-token latency. The prompt and output token counts come from the `usage` event that
`stream_options.include_usage` asks for, where the endpoint sends one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass(frozen=True)
class PreparedRequest:
    """A request body serialised before the run, so sending costs the event loop almost nothing."""

    index: int
    scheduled_s: float
    url: str
    body: bytes = field(repr=False)
    num_prompt_tokens: int
    max_output_tokens: int


@dataclass(frozen=True)
class Timing:
    """Raw timings of one request (seconds, `time.perf_counter` clock)."""

    sent_at: float
    first_token_at: float | None
    last_at: float | None
    chunk_gaps_s: tuple[float, ...] = field(repr=False)
    num_chunks: int
    prompt_tokens_reported: int | None
    completion_tokens_reported: int | None
    status: int | None
    error: str | None


def build_body(
    *,
    api: str,
    model: str,
    prompt: str,
    max_output_tokens: int,
    ignore_eos: bool,
    extra: dict[str, object] | None = None,
) -> bytes:
    payload: dict[str, object] = {
        "model": model,
        "max_tokens": max_output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if api == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    if ignore_eos:
        # vLLM extension: generate exactly max_tokens, as the trace's output length says.
        payload["ignore_eos"] = True
    if extra:
        payload.update(extra)
    return json.dumps(payload).encode()


async def send_streaming(
    session: aiohttp.ClientSession, request: PreparedRequest, headers: dict[str, str]
) -> Timing:
    """POST `request` and read its event stream to the end."""
    sent_at = time.perf_counter()
    first: float | None = None
    last: float | None = None
    gaps: list[float] = []
    chunks = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    status: int | None = None
    try:
        # Never follow a redirect: a target (a customer-supplied benchmark address among them)
        # must not bounce the load, or a probe of an internal service, to another host. A 3xx is
        # reported as the error it is.
        async with session.post(
            request.url, data=request.body, headers=headers, allow_redirects=False
        ) as response:
            status = response.status
            if status != 200:
                detail = (await response.text())[:300]
                return Timing(sent_at, None, None, (), 0, None, None, status, f"HTTP {status}: {detail}")
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators and SSE comments (keep-alives)
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if event.get("choices"):
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - (last if last is not None else now))
                    last = now
                    chunks += 1
                usage = event.get("usage")
                if usage:
                    prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                    completion_tokens = usage.get("completion_tokens", completion_tokens)
                if "error" in event and first is None:
                    return Timing(
                        sent_at, None, None, (), 0, None, None, status, f"stream error: {event['error']}"
                    )
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return Timing(
            sent_at, first, last, tuple(gaps), chunks, prompt_tokens, completion_tokens, status, reason
        )
    error = None if first is not None else "stream ended without a token"
    return Timing(sent_at, first, last, tuple(gaps), chunks, prompt_tokens, completion_tokens, status, error)
