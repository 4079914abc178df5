"""A structure-aware mutator for trace files, used beside libFuzzer's byte mutations.

Coverage guidance finds new branches, not bad magnitudes: a float timestamp of 1e300 takes the
same branches as 1.5 until it overflows. Half of the mutations therefore edit the file the way
the formats are built: a JSON line gets one value replaced by an extreme or wrongly typed one
(or a key dropped, duplicated or added), a CSV row gets one cell replaced, whole lines are
duplicated, dropped or swapped, and gzip inputs are mutated inside the compression. The other
half are libFuzzer's own (`byte_mutate`), so nothing the byte fuzzer reaches is lost.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import zlib
from collections.abc import Callable
from typing import Any, Final

from fuzz.targets import LIMITS

KNOWN_KEYS: Final = (
    "timestamp", "created", "created_at", "time", "input_length", "output_length", "hash_ids",
    "usage", "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens", "prompt",
    "messages", "role", "content", "completion", "choices", "message", "text", "request",
    "response", "session_id", "conversation_id", "error", "status_code", "model",
)  # fmt: skip
JSON_VALUES: Final[tuple[Any, ...]] = (
    0, 1, -1, 2, 511, 512, 513, 2**25 - 1, 2**25, 2**31, 2**62, 2**63 - 1, 2**63, -(2**63), 2**64,
    10_000_000, 10_000_001, 4_611_686_018_427, 4_611_686_018_428, 1_700_000_000, 10**20,
    0.5, -0.0, 1.5, 1e-300, 1e300, -1e300, 1.7e308, 4.7e12, 1.7e9, float("nan"), float("inf"),
    float("-inf"), True, False, None, "", "x", "\ud800", "\udfff\ud800", "\x00", "=1+1",
    "2023-11-16T18:15:46", "2023-11-16 18:15:46.6805900", "2023-11-16T18:15:46+05:30",
    "2023-11-16T18:15:46Z", "0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "1e9",
    [], [0], [-1], [2**63], [1.5], ["a"], [None], [[]], {}, {"prompt_tokens": -1},
    {"completion_tokens": 2**63}, [{"role": "user", "content": "hi"}], [{"role": 1}],
    [{"role": "user", "content": [{"text": 5}]}], [{"text": "t"}], [{"message": {"content": 5}}],
    {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}, {"prompt": ["a", 1]},
)  # fmt: skip
CSV_CELLS: Final = (
    "", " ", "0", "-1", "-0", "1.5", "1e3", "NaN", "inf", "=1+1", "+1", "@A1", "\t1", "-x", "١٢",
    "99999999999", "999999999999", "9999999999999", "9223372036854775808", "1.0000000001",
    "2023-11-16 18:15:46.6805900", "2023-11-16T18:15:46", "9999-12-31 23:59:59",
    "1000-01-01 00:00:00", "2262-04-12 00:00:00", "1677-09-21 00:00:00", "2023-02-30 00:00:00",
    "2023-11-16 18:15:46.1234567891", '"', '""', '"a,b"', "Failed", "Conversation log",
)  # fmt: skip
_MAX_GZIP_INPUT = LIMITS.max_bytes  # decompress at most this much of an input to mutate it


def _edit_json(obj: Any, rng: random.Random, depth: int = 0) -> Any:
    """`obj` with one place changed: a value replaced, or a key removed or added."""
    if isinstance(obj, dict) and obj and depth < 4:
        key = rng.choice(list(obj))
        roll = rng.random()
        if roll < 0.15:
            del obj[key]
        elif roll < 0.3:
            obj[rng.choice(KNOWN_KEYS)] = rng.choice(JSON_VALUES)
        else:
            obj[key] = _edit_json(obj[key], rng, depth + 1)
        return obj
    if isinstance(obj, list) and obj and depth < 4:
        at = rng.randrange(len(obj))
        obj[at] = _edit_json(obj[at], rng, depth + 1)
        return obj
    return rng.choice(JSON_VALUES)


def _mutate_line(line: bytes, rng: random.Random) -> bytes:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict | list):
        text = json.dumps(_edit_json(obj, rng))  # NaN and Infinity written as such, on purpose
        if isinstance(obj, dict) and obj and rng.random() < 0.1:
            key = json.dumps(rng.choice(list(obj)))
            text = text[:-1] + f", {key}: 1" + "}"  # a duplicate key
        return text.encode("utf-8", "surrogatepass")
    cells = line.split(b",")
    cells[rng.randrange(len(cells))] = rng.choice(CSV_CELLS).encode()
    return b",".join(cells)


def mutate_structure(data: bytes, rng: random.Random) -> bytes:
    lines = data.split(b"\n")
    roll = rng.random()
    at = rng.randrange(len(lines))
    if roll < 0.7:
        lines[at] = _mutate_line(lines[at], rng)
    elif roll < 0.8:
        lines.insert(at, lines[rng.randrange(len(lines))])
    elif roll < 0.9 and len(lines) > 1:
        del lines[at]
    else:
        other = rng.randrange(len(lines))
        lines[at], lines[other] = lines[other], lines[at]
    return b"\n".join(lines)


def _gunzip(data: bytes) -> bytes | None:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            return stream.read(_MAX_GZIP_INPUT)
    except (OSError, EOFError, zlib.error):
        return None


def make_mutator(byte_mutate: Callable[[bytes, int], bytes]) -> Callable[[bytes, int, int], bytes]:
    """A libFuzzer custom mutator: structure edits half the time, `byte_mutate` otherwise."""

    def mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if data.startswith(b"\x1f\x8b") and rng.random() < 0.5:
            inner = _gunzip(data)
            if inner is not None:
                changed = (
                    mutate_structure(inner, rng)
                    if rng.random() < 0.5
                    else byte_mutate(inner, len(inner) + 64)
                )
                return gzip.compress(changed, mtime=0)[:max_size]
        if rng.random() < 0.5:
            return byte_mutate(data, max_size)
        return mutate_structure(data, rng)[:max_size]

    return mutator
