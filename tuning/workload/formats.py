"""Format detection and the four streaming parsers.

Each parser reads physical lines from a `LineReader`, validates every request and appends it to
a `ColumnBuilder`; nothing per request survives but integers. Errors name the line and the
field, never a value that could be prompt text.

Formats:

- **mooncake**: JSON lines `{"timestamp": ms, "input_length": int, "output_length": int,
  "hash_ids": [int, ...]}`; `hash_ids` name 512-token prompt blocks (optional: without them the
  trace has no prefix information).
- **openai**: JSON lines of request logs. Time: `timestamp` | `created` | `created_at` | `time`
  (seconds since the epoch, or ISO 8601; a time without zone is UTC). Token counts:
  `usage.prompt_tokens`/`usage.completion_tokens` (also `input_tokens`/`output_tokens`, at top
  level or under `usage`, or under `response.usage`); where absent they are counted from the
  text with the tokenizer. Prompt text: `messages` (chat) or `prompt`, at top level or under
  `request`; completion text: `completion`, or `choices[0].message.content`/`choices[0].text`
  at top level or under `response`. `session_id`/`conversation_id` optional. A request with a
  non-null `error` or a `status_code` of 400 or more counts as failed.
- **azure**: CSV `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference traces), a
  byte-order mark allowed, times like `2023-11-16 18:15:46.6805900` without zone (taken as UTC).
- **burstgpt**: CSV with `Timestamp` (seconds), `Request tokens`, `Response tokens` and
  optionally `Model`, `Total tokens`, `Log Type`. BurstGPT marks failed requests with 0
  response tokens (its README); those, and any `Log Type` naming a failure, are counted as
  failed and left out of the profile.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from array import array
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Final, Literal

import numpy as np

from tuning.workload.columns import FLUSH_ROWS, ColumnBuilder
from tuning.workload.errors import TraceError
from tuning.workload.reader import LineReader
from tuning.workload.tokenizer import Tokenizer

TraceFormat = Literal["openai", "mooncake", "azure", "burstgpt"]
FORMATS: Final[tuple[TraceFormat, ...]] = ("openai", "mooncake", "azure", "burstgpt")

AZURE_HEADER: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_REQUIRED: Final = ("Timestamp", "Request tokens", "Response tokens")
# Field names an error message may quote. Anything else a file uses as a key is described, not
# quoted: a key is text from the file and could be anything.
_KNOWN_FIELDS: Final = frozenset(
    {
        "timestamp",
        "created",
        "created_at",
        "time",
        "input_length",
        "output_length",
        "hash_ids",
        "usage",
        "prompt_tokens",
        "completion_tokens",
        "input_tokens",
        "output_tokens",
        "prompt",
        "messages",
        "role",
        "content",
        "completion",
        "choices",
        "message",
        "text",
        "request",
        "response",
        "session_id",
        "conversation_id",
        "error",
        "status_code",
        "model",
    }
)
_MAX_ABS_NS: Final = 1 << 62
# cells that a spreadsheet would run as a formula (OWASP's list); '-' only when not a number
_FORMULA_START: Final = frozenset("=+@\t\r")


def _quote_field(name: object) -> str:
    return f"`{name}`" if isinstance(name, str) and name in _KNOWN_FIELDS else "a key"


class _DuplicateKeyError(Exception):
    pass


class _NonFiniteError(Exception):
    pass


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return obj


def _reject_constant(name: str) -> Any:
    raise _NonFiniteError(name)


_DECODER: Final = json.JSONDecoder(object_pairs_hook=_pairs_hook, parse_constant=_reject_constant)


# The fast path's decoder has no pairs hook (a Python call per object); see decode_json_line.
_SCAN: Final = json.JSONDecoder(parse_constant=_reject_constant).scan_once  # type: ignore[attr-defined]
_QUOTE: Final = ord('"')
BLANK: Final = object()  # what decode_json_line returns for a line with nothing on it


def decode_json_line(raw: bytes, line_no: int) -> Any:
    """One JSON object from one line; strict about what the standard library lets through.

    The fast path runs the C scanner directly, without the duplicate-key hook, and accepts the
    result only if the line holds exactly two quote characters per key of the object: every key
    and every string costs two quotes, so then there is no repeated key, no string value and no
    nested object with keys (Mooncake's lines). Anything else goes through the strict decoder,
    which also gives precise error messages.
    """
    try:
        text = raw.decode("utf-8")
        obj, end = _SCAN(text, 0)
        if (
            (end == len(text) or text[end:].isspace())
            and type(obj) is dict
            and raw.count(_QUOTE) == 2 * len(obj)
        ):
            return obj
    except Exception:  # noqa: S110 - every failure is diagnosed below, on the slow path
        pass
    return decode_json_line_strictly(raw, line_no)


def decode_json_line_strictly(raw: bytes, line_no: int) -> Any:
    """The full decoder (duplicate keys, NaN, nesting and digits all checked)."""
    problem: str
    try:
        text = raw.decode("utf-8")
        if not text.strip():
            return BLANK
        return _DECODER.decode(text)
    except UnicodeDecodeError as exc:
        problem = f"not valid UTF-8 (byte {exc.start + 1} of the line)"
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg} at column {exc.colno}; is the line truncated?)"
    except _DuplicateKeyError as exc:
        key = exc.args[0]
        named = f" {_quote_field(key)}" if _quote_field(key) != "a key" else ""
        problem = f"duplicate key{named} in one JSON object"
    except _NonFiniteError as exc:
        problem = f"{exc.args[0]} is not a number (NaN and Infinity are not valid JSON)"
    except RecursionError:
        problem = "JSON nested too deeply"
    except ValueError:
        problem = "a number has too many digits"
    raise TraceError(line_no, problem)


def _count_problem(value: object, name: str, limit: int) -> str:
    """Why `value` is not a token count (value itself never quoted)."""
    if value is None:
        return f"missing `{name}`"
    if isinstance(value, bool) or not isinstance(value, int):
        kind = {str: "a string", float: "a fraction", list: "a list", dict: "an object", bool: "a boolean"}
        return f"`{name}` must be a whole number of tokens, not {kind.get(type(value), 'that type')}"
    if value < 0:
        return f"`{name}` is negative"
    return f"`{name}` is larger than the limit of {limit:,} tokens"


def detect_format(reader: LineReader) -> TraceFormat:
    """Sniff the format from the first non-blank line (nothing is consumed)."""
    found = reader.first_nonblank()
    if found is None:
        raise TraceError(None, "the file is empty")
    line_no, raw = found
    if raw.lstrip()[:1] in (b"{", b"["):
        obj = decode_json_line(raw, line_no)
        if not isinstance(obj, dict):
            raise TraceError(line_no, "expected one JSON object per line")
        if "hash_ids" in obj or ("input_length" in obj and "output_length" in obj):
            return "mooncake"
        return "openai"
    try:
        names = {cell.strip().lower() for cell in next(csv.reader([raw.decode("utf-8")]))}
    except (UnicodeDecodeError, csv.Error, StopIteration):
        names = set()
    if {n.lower() for n in AZURE_HEADER} <= names:
        return "azure"
    if {n.lower() for n in BURSTGPT_REQUIRED} <= names:
        return "burstgpt"
    raise TraceError(
        line_no,
        "unrecognised format: expected JSON lines (OpenAI-style logs or Mooncake) or a CSV header "
        "of an Azure trace (TIMESTAMP,ContextTokens,GeneratedTokens) or a BurstGPT trace "
        "(Timestamp, Request tokens, Response tokens, ...)",
    )


# --------------------------------------------------------------------------------------------
# Mooncake


def parse_mooncake(reader: LineReader, builder: ColumnBuilder, *, max_tokens: int) -> None:
    line_no = builder.line_no.append
    arrival = builder.arrival_ns.append
    inputs = builder.input_tokens.append
    outputs = builder.output_tokens.append
    prefix_tokens = builder.prefix_tokens.append
    counts = builder.block_counts.append
    extend_ids = builder.block_ids.extend
    with_prefix = builder.with_prefix
    flush = builder.flush
    pending = 0
    for first, lines in reader.batches():
        for n, raw in enumerate(lines, first):
            obj = decode_json_line(raw, n)
            if type(obj) is not dict:
                if obj is BLANK:
                    continue
                raise TraceError(n, "expected a JSON object")
            il = obj.get("input_length")
            ol = obj.get("output_length")
            ts = obj.get("timestamp")
            if type(il) is not int or not 0 <= il <= max_tokens:
                raise TraceError(n, _count_problem(il, "input_length", max_tokens))
            if type(ol) is not int or not 0 <= ol <= max_tokens:
                raise TraceError(n, _count_problem(ol, "output_length", max_tokens))
            if type(ts) is int:
                t_ns = ts * 1_000_000
            elif type(ts) is float and math.isfinite(ts):
                # A float beyond the range (1e303 is valid JSON) would overflow to inf when scaled.
                t_ns = round(ts * 1_000_000) if abs(ts) < _MAX_ABS_NS else _MAX_ABS_NS
            else:
                raise TraceError(
                    n, "missing `timestamp`" if ts is None else "`timestamp` must be a number of milliseconds"
                )
            if not -_MAX_ABS_NS < t_ns < _MAX_ABS_NS:
                raise TraceError(n, "`timestamp` is out of range")
            if with_prefix:
                ids = obj.get("hash_ids")
                if type(ids) is not list:
                    raise TraceError(
                        n,
                        "missing `hash_ids` (earlier lines have them)"
                        if ids is None
                        else "`hash_ids` must be a list of integers",
                    )
                ok = True
                try:
                    extend_ids(ids)
                except (TypeError, OverflowError):
                    ok = False
                if not ok:
                    raise TraceError(n, "`hash_ids` must be a list of non-negative 64-bit integers")
                counts(len(ids))
                prefix_tokens(il)
            line_no(n)
            arrival(t_ns)
            inputs(il)
            outputs(ol)
            pending += 1
            if pending == FLUSH_ROWS:
                flush()
                pending = 0


def mooncake_has_prefix(reader: LineReader) -> bool:
    """Whether the first request carries `hash_ids` (then every request must)."""
    found = reader.first_nonblank()
    if found is None:
        return False
    obj = decode_json_line(found[1], found[0])
    return isinstance(obj, dict) and "hash_ids" in obj


# --------------------------------------------------------------------------------------------
# OpenAI-style request logs

_TIME_KEYS: Final = ("timestamp", "created", "created_at", "time")


def _epoch_ns(value: object, n: int) -> int:
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        ns = value * 1_000_000_000
    elif isinstance(value, float) and math.isfinite(value):
        ns = round(value * 1e9) if abs(value) < _MAX_ABS_NS else _MAX_ABS_NS
    elif isinstance(value, str):
        moment: datetime | None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
        if moment is None:
            raise TraceError(n, "the timestamp is not an ISO 8601 date and time")
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
        ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
    else:
        raise TraceError(
            n,
            "missing timestamp (`timestamp`, `created`, `created_at` or `time`)"
            if value is None
            else "the timestamp must be seconds since the epoch or an ISO 8601 string",
        )
    if not -_MAX_ABS_NS < ns < _MAX_ABS_NS:
        raise TraceError(n, "the timestamp is out of range")
    return ns


def _first_present(objects: tuple[dict[str, Any], ...], keys: tuple[str, ...]) -> tuple[str, object]:
    for obj in objects:
        for key in keys:
            if key in obj and obj[key] is not None:
                return key, obj[key]
    return keys[0], None


def _as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _message_text(messages: object, n: int) -> str:
    if not isinstance(messages, list):
        raise TraceError(n, "`messages` must be a list of objects with `role` and `content`")
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise TraceError(n, "`messages` must be a list of objects with `role` and `content`")
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(
                part.get("text", "") if isinstance(part, dict) and isinstance(part.get("text"), str) else ""
                for part in content
            )
        elif content is None:
            content = ""
        if not isinstance(role, str) or not isinstance(content, str):
            raise TraceError(n, "each message needs a string `role` and a string or list `content`")
        # One fixed chat rendering, so that equal conversations give equal blocks.
        parts.append(f"<|{role}|>\n{content}<|end|>\n")
    return "".join(parts)


def _prompt_text(request: dict[str, Any], n: int) -> str | None:
    if "messages" in request and request["messages"] is not None:
        return _message_text(request["messages"], n)
    prompt = request.get("prompt")
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    raise TraceError(n, "`prompt` must be a string or a list of strings")


def request_prompt_text(obj: dict[str, Any], n: int) -> str | None:
    """The prompt text of one OpenAI-style log line (under `request`, else at top level), chat
    messages in one fixed rendering; None when the line has none."""
    request = _as_dict(obj.get("request"))
    prompt = _prompt_text(request, n) if request else None
    return _prompt_text(obj, n) if prompt is None else prompt


def request_failed(obj: dict[str, Any]) -> bool:
    """Whether an OpenAI-style log line records a failed request (left out of the profile)."""
    status = obj.get("status_code")
    return obj.get("error") is not None or (
        isinstance(status, int) and not isinstance(status, bool) and status >= 400
    )


def _completion_text(obj: dict[str, Any], response: dict[str, Any], n: int) -> str | None:
    completion = obj.get("completion")
    if isinstance(completion, str):
        return completion
    for holder in (response, obj):
        choices = holder.get("choices")
        if isinstance(choices, list) and choices:
            first = choices[0]
            if isinstance(first, dict):
                message = first.get("message")
                if isinstance(message, dict) and isinstance(message.get("content"), str):
                    text: str = message["content"]
                    return text
                if isinstance(first.get("text"), str):
                    text = first["text"]
                    return text
    if completion is not None:
        raise TraceError(n, "`completion` must be a string")
    return None


def _reported_count(
    usage: dict[str, Any], obj: dict[str, Any], keys: tuple[str, ...], n: int, max_tokens: int
) -> int | None:
    key, value = _first_present((usage, obj), keys)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= max_tokens:
        raise TraceError(n, _count_problem(value, key, max_tokens))
    return value


class PromptBlockHasher:
    """Salted, chained hashes of fixed-size token blocks, renumbered densely.

    Block i's hash covers the salt, block i-1's hash and block i's token ids, so equal ids
    mean an equal prefix (Mooncake's convention). The salt is per organization: the same prompt
    gives unrelated hashes in two organizations, and a short prompt cannot be confirmed by
    hashing guesses without the salt. Only the dense numbers leave this object.
    """

    def __init__(self, *, salt: bytes, block_size_tokens: int) -> None:
        # blake2b keys are at most 64 bytes: longer salts are condensed first.
        self._key = salt if len(salt) <= 64 else hashlib.blake2b(salt).digest()
        self._block = block_size_tokens
        self._dense: dict[bytes, int] = {}

    def block_ids(self, token_ids: list[int] | array[int]) -> list[int]:
        out: list[int] = []
        parent = b""
        key = self._key
        dense = self._dense
        for start in range(0, len(token_ids), self._block):
            chunk = array("q", token_ids[start : start + self._block]).tobytes()
            parent = hashlib.blake2b(parent + chunk, key=key, digest_size=16).digest()
            out.append(dense.setdefault(parent, len(dense)))
        return out

    def __repr__(self) -> str:
        return f"PromptBlockHasher(block_size_tokens={self._block}, blocks={len(self._dense)})"


def _encode(tokenizer: Tokenizer, text: str, n: int) -> list[int]:
    """Token ids; a failing tokenizer's own message (which may quote the text) is not passed on."""
    ids: list[int] | None
    try:
        ids = list(tokenizer.encode(text))
    except Exception:
        ids = None
    if ids is None:
        raise TraceError(n, f"the tokenizer {tokenizer.name} failed on this line's text")
    return ids


def _numbered(reader: LineReader) -> Iterator[tuple[int, bytes]]:
    for first, lines in reader.batches():
        yield from enumerate(lines, first)


def parse_openai(
    reader: LineReader,
    builder: ColumnBuilder,
    *,
    max_tokens: int,
    tokenizer: Tokenizer,
    hasher: PromptBlockHasher,
    session_key: Callable[[str], bytes],
) -> tuple[bool, int | None]:
    """Parse; returns (whether any token count came from the tokenizer, distinct sessions or None)."""
    used_tokenizer = False
    sessions: set[bytes] = set()
    for n, raw in _numbered(reader):
        obj = decode_json_line_strictly(raw, n)
        if type(obj) is not dict:
            if obj is BLANK:
                continue
            raise TraceError(n, "expected a JSON object")
        response = _as_dict(obj.get("response"))
        _, when = _first_present((obj, response), _TIME_KEYS)
        t_ns = _epoch_ns(when, n)
        if request_failed(obj):
            builder.num_failed += 1
            continue
        usage = _as_dict(obj.get("usage")) or _as_dict(response.get("usage"))
        input_tokens = _reported_count(usage, obj, ("prompt_tokens", "input_tokens"), n, max_tokens)
        output_tokens = _reported_count(usage, obj, ("completion_tokens", "output_tokens"), n, max_tokens)
        prompt = request_prompt_text(obj, n)
        token_ids: list[int] = []
        if prompt is not None:
            token_ids = _encode(tokenizer, prompt, n)
        elif input_tokens is None:
            raise TraceError(n, "no prompt token count: needs `usage.prompt_tokens` or the prompt text")
        prompt = None  # the text goes as soon as it is counted and hashed
        if input_tokens is None:
            input_tokens = len(token_ids)
            used_tokenizer = True
        if output_tokens is None:
            completion = _completion_text(obj, response, n)
            if completion is None:
                raise TraceError(
                    n, "no output token count: needs `usage.completion_tokens` or the completion text"
                )
            output_tokens = len(_encode(tokenizer, completion, n))
            completion = None
            used_tokenizer = True
        if input_tokens > max_tokens or output_tokens > max_tokens:
            raise TraceError(n, f"a token count is larger than the limit of {max_tokens:,} tokens")
        blocks = hasher.block_ids(token_ids)
        builder.block_ids.extend(blocks)
        builder.block_counts.append(len(blocks))
        builder.prefix_tokens.append(len(token_ids))
        session = obj.get("session_id", obj.get("conversation_id"))
        if isinstance(session, str | int) and not isinstance(session, bool):
            sessions.add(session_key(str(session)))
        builder.line_no.append(n)
        builder.arrival_ns.append(t_ns)
        builder.input_tokens.append(input_tokens)
        builder.output_tokens.append(output_tokens)
        builder.row_added()
    return used_tokenizer, (len(sessions) if sessions else None)


# --------------------------------------------------------------------------------------------
# CSV formats

# ASCII digits only: `\d` would also take other scripts' digits, which numpy cannot read.
_TIME_SYNTAX: Final = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d{1,9})?", re.ASCII)
_SECONDS_SYNTAX: Final = re.compile(r"\d{1,12}(?:\.\d{1,9})?", re.ASCII)
# Azure times are kept within 2**62 ns of the epoch like every other format's (1823-2116), so
# that the difference of any two fits in int64.
_FIRST_YEAR: Final = "1824"
_LAST_YEAR: Final = "2115"


def _cell_problem(cell: str, name: str, *, what: str, max_value: int | None = None) -> str:
    """Why a CSV cell is not `what` (without quoting the cell)."""
    stripped = cell.strip()
    if not stripped:
        return f"`{name}` is empty"
    if cell[0] in _FORMULA_START or (cell[0] == "-" and not stripped[1:].replace(".", "", 1).isdigit()):
        return (
            f"`{name}` starts with {cell[0]!r}: a spreadsheet formula (CSV injection) is not accepted"
            if cell[0] not in "\t\r"
            else f"`{name}` starts with a control character: a possible spreadsheet formula (CSV injection)"
        )
    if stripped.startswith("-") and stripped[1:].replace(".", "", 1).isdigit():
        return f"`{name}` is negative"
    if max_value is not None and stripped.isascii() and stripped.isdigit():
        return f"`{name}` is larger than the limit of {max_value:,}"
    if stripped.lower() in {"nan", "inf", "-inf", "infinity"}:
        return f"`{name}` is not a number"
    return f"`{name}` is not {what}"


def _check_no_formula(row: list[str], names: list[str], n: int) -> None:
    for cell, name in zip(row, names, strict=False):
        if cell and (cell[0] in _FORMULA_START or (cell[0] == "-" and not _looks_numeric(cell[1:]))):
            raise TraceError(n, _cell_problem(cell, name, what="text"))


def _looks_numeric(text: str) -> bool:
    return text.replace(".", "", 1).isdigit()


_MALFORMED_CSV: Final = "malformed CSV (unbalanced quotes, or a field over 128 KiB)"


def _is_blank(row: list[str]) -> bool:
    return not row or (len(row) == 1 and not row[0].strip())


def _open_csv(
    reader: LineReader, required: tuple[str, ...], label: str, optional: tuple[str, ...] = ()
) -> tuple[Any, list[str]]:
    """A csv reader positioned after the header, and the header's names (checked)."""
    rows = csv.reader(reader.text_lines(), strict=True)
    header: list[str] | None = None
    malformed = False
    done = 0  # lines read up to the end of the last complete row
    try:
        for row in rows:
            if not _is_blank(row):
                header = row
                break
            done = rows.line_num
    except csv.Error:
        malformed = True
    if malformed:
        # The bad record starts after the last good one; the csv reader may have read on to
        # the end of the file looking for a closing quote.
        raise TraceError(done + 1, _MALFORMED_CSV)
    if header is None:
        raise TraceError(None, "the file is empty")
    names = [cell.strip() for cell in header]
    lowered = [name.lower() for name in names]
    if not all(name.lower() in lowered for name in required):
        raise TraceError(
            rows.line_num, f"not {label}: the header must name the columns {', '.join(required)}"
        )
    # A column read twice would be ambiguous: which of the two holds the numbers?
    for name in (*required, *optional):
        if lowered.count(name.lower()) > 1:
            raise TraceError(rows.line_num, f"the header names the column `{name}` more than once")
    return rows, names


# Token counts up to 9 digits take the fast path; anything else is diagnosed (or range-checked).
_FAST_DIGITS = 9


def _token_cell(cell: str, name: str, n: int, max_tokens: int) -> int:
    if cell.isdigit() and cell.isascii() and len(cell) <= 12:
        value = int(cell)
        if value <= max_tokens:
            return value
    raise TraceError(n, _cell_problem(cell, name, what="a whole number of tokens", max_value=max_tokens))


def parse_azure(reader: LineReader, builder: ColumnBuilder, *, max_tokens: int) -> None:
    rows, names = _open_csv(reader, AZURE_HEADER, "an Azure trace")
    lowered = [name.lower() for name in names]
    if len(names) != 3:
        raise TraceError(rows.line_num, "not an Azure trace: expected exactly 3 columns")
    i_time, i_in, i_out = (lowered.index(name.lower()) for name in AZURE_HEADER)
    times: list[str] = []
    add_time = times.append
    add_line = builder.line_no.append
    add_input = builder.input_tokens.append
    add_output = builder.output_tokens.append
    syntax = _TIME_SYNTAX.fullmatch
    malformed = False
    n = rows.line_num
    try:
        for row in rows:
            n = rows.line_num
            if len(row) != 3:
                if _is_blank(row):
                    continue
                _check_no_formula(row, names, n)
                raise TraceError(n, f"expected 3 columns ({','.join(AZURE_HEADER)}), found {len(row)}")
            stamp, context, generated = row[i_time], row[i_in], row[i_out]
            if syntax(stamp) is None:
                raise TraceError(
                    n,
                    _cell_problem(
                        stamp, "TIMESTAMP", what="a date and time like 2023-11-16 18:15:46.6805900"
                    ),
                )
            if (
                context.isdigit()
                and generated.isdigit()
                and len(context) <= _FAST_DIGITS
                and len(generated) <= _FAST_DIGITS
                and context.isascii()
                and generated.isascii()
            ):
                input_tokens, output_tokens = int(context), int(generated)
                if input_tokens > max_tokens or output_tokens > max_tokens:
                    _token_cell(context, "ContextTokens", n, max_tokens)
                    _token_cell(generated, "GeneratedTokens", n, max_tokens)
            else:
                input_tokens = _token_cell(context, "ContextTokens", n, max_tokens)
                output_tokens = _token_cell(generated, "GeneratedTokens", n, max_tokens)
            add_input(input_tokens)
            add_output(output_tokens)
            add_time(stamp)
            add_line(n)
            if len(times) >= FLUSH_ROWS:
                _flush_times(times, builder)
    except csv.Error:
        malformed = True
    if malformed:
        raise TraceError(n + 1, _MALFORMED_CSV)  # where the bad record starts
    _flush_times(times, builder)


def _flush_times(times: list[str], builder: ColumnBuilder) -> None:
    """Convert a chunk of (already syntax-checked) timestamps at once; find the bad one if any."""
    if not times:
        return
    # datetime64[ns] spans 1677-2262 and numpy wraps a year outside it around without a word;
    # the (syntax-checked, four-digit) years compare as strings, one pass in C over the chunk.
    if min(times)[:4] < _FIRST_YEAR or max(times)[:4] > _LAST_YEAR:
        for stamp, n in zip(times, builder.line_no, strict=True):
            if not _FIRST_YEAR <= stamp[:4] <= _LAST_YEAR:
                raise TraceError(n, f"`TIMESTAMP` is out of range (years {_FIRST_YEAR} to {_LAST_YEAR})")
    converted: np.ndarray | None
    try:
        converted = np.array(times, dtype="datetime64[ns]")
    except ValueError:
        converted = None
    if converted is None:
        for stamp, n in zip(times, builder.line_no, strict=True):
            valid = True
            try:
                np.datetime64(stamp, "ns")
            except ValueError:
                valid = False
            if not valid:
                raise TraceError(
                    n, "`TIMESTAMP` is not a valid date and time (month, day or hour out of range)"
                )
        raise TraceError(None, "`TIMESTAMP` values could not be read")
    builder.arrival_ns.frombytes(converted.astype(np.int64).tobytes())
    times.clear()
    builder.flush()


def _seconds_ns(cell: str, n: int) -> int:
    if _SECONDS_SYNTAX.fullmatch(cell) is None:
        raise TraceError(n, _cell_problem(cell, "Timestamp", what="a number of seconds"))
    whole, _, fraction = cell.partition(".")
    ns = int(whole) * 1_000_000_000 + int(fraction.ljust(9, "0") or "0")
    if ns >= _MAX_ABS_NS:  # twelve digits of seconds can exceed the int64 nanosecond columns
        raise TraceError(n, "`Timestamp` is out of range")
    return ns


def parse_burstgpt(reader: LineReader, builder: ColumnBuilder, *, max_tokens: int) -> None:
    rows, names = _open_csv(reader, BURSTGPT_REQUIRED, "a BurstGPT trace", optional=("Log Type",))
    lowered = [name.lower() for name in names]
    i_time, i_in, i_out = (lowered.index(name.lower()) for name in BURSTGPT_REQUIRED)
    i_type = lowered.index("log type") if "log type" in lowered else None
    width = len(names)
    malformed = False
    n = rows.line_num
    try:
        for row in rows:
            n = rows.line_num
            if len(row) != width:
                if _is_blank(row):
                    continue
                _check_no_formula(row, names, n)
                raise TraceError(n, f"expected {width} columns as in the header, found {len(row)}")
            _check_no_formula(row, names, n)
            t_ns = _seconds_ns(row[i_time].strip(), n)
            request_tokens = _token_cell(row[i_in].strip(), names[i_in], n, max_tokens)
            response_tokens = _token_cell(row[i_out].strip(), names[i_out], n, max_tokens)
            failed = response_tokens == 0 or (i_type is not None and "fail" in row[i_type].lower())
            if failed:
                builder.num_failed += 1
                continue
            builder.line_no.append(n)
            builder.arrival_ns.append(t_ns)
            builder.input_tokens.append(request_tokens)
            builder.output_tokens.append(response_tokens)
            builder.row_added()
    except csv.Error:
        malformed = True
    if malformed:
        raise TraceError(n + 1, _MALFORMED_CSV)  # where the bad record starts
