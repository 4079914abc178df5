"""Minimal trace readers for replay: Mooncake JSONL, Azure LLM inference CSV, OpenAI-style JSONL.

Only what a replay needs: when each request arrives and how many tokens go in and out (plus
Mooncake's prefix block ids). The full workload profiler lives in `tuning`, which `serving`
does not import.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids each name one block of this many prompt tokens


class TraceFormatError(ValueError):
    """A trace line could not be read; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. Times are relative to the trace's first arrival."""

    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    # Ids of the prompt's consecutive blocks of `block_tokens` tokens; equal leading ids mean a
    # shared prefix. Empty when the format carries no prefix information.
    hash_ids: tuple[int, ...] = field(default=(), repr=False)
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def read_trace(path: Path, *, max_requests: int | None = None, skip: int = 0) -> list[TraceRequest]:
    """Read a trace, choosing the reader by content (JSONL with `hash_ids`/`timestamp`, or CSV).

    Requests are sorted by arrival; `skip` drops the first ones and `max_requests` keeps at most
    that many of the rest. Arrivals are shifted so the first kept request arrives at 0.
    """
    requests = list(_iter_trace(path))
    requests.sort(key=lambda r: r.arrival_s)
    requests = requests[skip:]
    if max_requests is not None:
        requests = requests[:max_requests]
    if requests:
        first = requests[0].arrival_s
        if first != 0.0:
            requests = [_shift(r, first) for r in requests]
    return requests


def _shift(request: TraceRequest, by_s: float) -> TraceRequest:
    return TraceRequest(
        arrival_s=request.arrival_s - by_s,
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=request.num_output_tokens,
        hash_ids=request.hash_ids,
        block_tokens=request.block_tokens,
    )


def _iter_trace(path: Path) -> Iterator[TraceRequest]:
    with path.open("r", encoding="utf-8-sig") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith("{"):
        yield from _read_jsonl(path)
    else:
        yield from _read_azure_csv(path)


def _read_jsonl(path: Path) -> Iterator[TraceRequest]:
    with path.open("r", encoding="utf-8-sig") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"{path}: line {number}: not JSON ({exc.msg})") from exc
            yield _jsonl_request(row, path, number)


def _jsonl_request(row: dict[str, object], path: Path, number: int) -> TraceRequest:
    where = f"{path}: line {number}"
    if "timestamp" in row:  # Mooncake: milliseconds
        arrival_s = _number(row, "timestamp", where) / 1000.0
        prompt = int(_number(row, "input_length", where))
        output = int(_number(row, "output_length", where))
    else:  # OpenAI-style request log: seconds (or ISO time) and usage counts
        arrival_s = _arrival_from_log(row, where)
        prompt = int(_number(row, "prompt_tokens" if "prompt_tokens" in row else "input_tokens", where))
        output = int(
            _number(row, "completion_tokens" if "completion_tokens" in row else "output_tokens", where)
        )
    if prompt < 1:
        raise TraceFormatError(f"{where}: prompt length {prompt} is not positive")
    if output < 0:
        raise TraceFormatError(f"{where}: output length {output} is negative")
    raw_ids = row.get("hash_ids") or []
    if not isinstance(raw_ids, list):
        raise TraceFormatError(f"{where}: `hash_ids` is not a list")
    return TraceRequest(
        arrival_s=arrival_s,
        num_prompt_tokens=prompt,
        num_output_tokens=output,
        hash_ids=tuple(int(h) for h in raw_ids),
    )


def _arrival_from_log(row: dict[str, object], where: str) -> float:
    for key in ("arrival_s", "created", "time", "timestamp_s"):
        if key in row:
            value = row[key]
            if isinstance(value, str):
                return _parse_time(value, where)
            return _number(row, key, where)
    raise TraceFormatError(f"{where}: no arrival time (`timestamp`, `arrival_s` or `created`)")


def _number(row: dict[str, object], key: str, where: str) -> float:
    if key not in row:
        raise TraceFormatError(f"{where}: `{key}` is missing")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceFormatError(f"{where}: `{key}` is not a number ({value!r})")
    return float(value)


def _parse_time(text: str, where: str) -> float:
    # Azure writes 7 fractional digits, which datetime does not take: cut to microseconds.
    cleaned = text.strip()
    if "." in cleaned:
        whole, frac = cleaned.split(".", 1)
        digits = "".join(ch for ch in frac if ch.isdigit())
        rest = frac[len(digits) :]
        cleaned = f"{whole}.{digits[:6]}{rest}"
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError as exc:
        raise TraceFormatError(f"{where}: unreadable time {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # published traces carry no zone; UTC by convention
    return moment.timestamp()


def _read_azure_csv(path: Path) -> Iterator[TraceRequest]:
    with path.open("r", encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        fields = {name.strip().lower(): name for name in reader.fieldnames or []}
        needed = ("timestamp", "contexttokens", "generatedtokens")
        missing = [n for n in needed if n not in fields]
        if missing:
            raise TraceFormatError(
                f"{path}: not a recognised trace (CSV needs TIMESTAMP, ContextTokens, GeneratedTokens)"
            )
        for number, row in enumerate(reader, start=2):
            where = f"{path}: line {number}"
            try:
                prompt = int(row[fields["contexttokens"]])
                output = int(row[fields["generatedtokens"]])
            except (TypeError, ValueError) as exc:
                raise TraceFormatError(f"{where}: token counts are not integers") from exc
            if prompt < 1 or output < 0:
                raise TraceFormatError(f"{where}: token counts out of range ({prompt}, {output})")
            yield TraceRequest(
                arrival_s=_parse_time(row[fields["timestamp"]], where),
                num_prompt_tokens=prompt,
                num_output_tokens=output,
            )
