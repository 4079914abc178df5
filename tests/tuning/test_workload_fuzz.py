"""Adversarial traffic samples, generated (hypothesis) and replayed (fuzz/regressions).

Every input either ingests or raises `TraceError`; never another exception. Four kinds of test
per format:

- wild files (wrong types, huge and non-finite numbers, byte-level mutations of valid files):
  the promises of `fuzz.targets.check`, the same ones the atheris harness checks;
- one bad field on one line: the error names exactly that line and that field;
- changes that must not matter (BOM, CRLF, gzip, blank lines): the same profile;
- limits and framing (long lines, gzip bombs, deep nesting, truncation, mixed formats, empty
  and header-only files): an error on the right line, or for the file as a whole.

Plus the CI-sized atheris run of every fuzz target.
"""

from __future__ import annotations

import gzip
import io
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.targets import LIMITS, TARGETS, check
from tuning.workload import IngestResult, TraceError, ingest

FUZZ_DIR = Path(__file__).resolve().parents[2] / "fuzz"
FORMATS = ("openai", "mooncake", "azure", "burstgpt")
MAX_TOKENS = LIMITS.max_tokens_per_request
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CI_FUZZ_RUNS = 20_000
FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(data: bytes, trace_format: str) -> IngestResult:
    return ingest(io.BytesIO(data), trace_format=trace_format, salt=b"fuzz", limits=LIMITS, keep_blocks=True)


def fails(data: bytes, trace_format: str) -> TraceError:
    with pytest.raises(TraceError) as caught:
        run(data, trace_format)
    error = caught.value
    assert error.__cause__ is None and error.__context__ is None
    if error.line is not None:
        assert str(error).startswith(f"line {error.line}: ")
    return error


# --------------------------------------------------------------------------------------------
# Valid files, built record by record (so a test knows which physical line holds what)

gaps = st.lists(st.integers(0, 5_000), min_size=2, max_size=8).map(lambda g: [*g[:-1], g[-1] + 1])
counts = st.integers(0, 5_000)
block_ids = st.lists(st.integers(0, 500) | st.integers(1 << 40, (1 << 63) - 1), max_size=4)


@st.composite
def mooncake_records(draw: st.DrawFn) -> list[dict[str, Any]]:
    with_ids = draw(st.booleans())
    records, t = [], draw(st.integers(0, 10**9))
    for gap in draw(gaps):
        t += gap
        record = {"timestamp": t, "input_length": draw(counts), "output_length": draw(counts)}
        if with_ids:
            record["hash_ids"] = draw(block_ids)
        records.append(record)
    return records


words = st.text(st.characters(codec="utf-8"), max_size=30)


@st.composite
def openai_records(draw: st.DrawFn) -> list[dict[str, Any]]:
    records, t = [], draw(st.integers(1_600_000_000, 1_800_000_000))
    for gap in draw(gaps):
        t += gap
        record: dict[str, Any] = {"timestamp": t, "model": "m"}
        if draw(st.booleans()):
            record["messages"] = [{"role": "user", "content": draw(words)}]
        else:
            record["prompt"] = draw(words)
        if draw(st.booleans()):
            record["usage"] = {"prompt_tokens": draw(counts), "completion_tokens": draw(counts)}
        else:
            record["completion"] = draw(words)
        if draw(st.booleans()):
            record["session_id"] = draw(words)
        records.append(record)
    return records


def _azure_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f") + "0"


@st.composite
def azure_rows(draw: st.DrawFn) -> list[list[str]]:
    moment = datetime(2023, 11, 16, tzinfo=UTC) + timedelta(seconds=draw(st.integers(0, 10**7)))
    rows = []
    for gap in draw(gaps):
        moment += timedelta(microseconds=gap * 1000)
        rows.append([_azure_time(moment), str(draw(counts)), str(draw(counts))])
    return rows


@st.composite
def burst_rows(draw: st.DrawFn) -> list[list[str]]:
    rows, t = [], draw(st.integers(0, 10**6))
    for gap in draw(gaps):
        t += gap
        request, response = draw(counts), draw(st.integers(1, 5_000))
        rows.append(
            [str(t), "ChatGPT", str(request), str(response), str(request + response), "Conversation log"]
        )
    return rows


def jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def csv_file(header: str, rows: list[list[str]]) -> bytes:
    return (header + "\n" + "".join(",".join(row) + "\n" for row in rows)).encode()


valid_files: dict[str, st.SearchStrategy[bytes]] = {
    "openai": openai_records().map(jsonl),
    "mooncake": mooncake_records().map(jsonl),
    "azure": azure_rows().map(lambda rows: csv_file(AZURE_HEADER, rows)),
    "burstgpt": burst_rows().map(lambda rows: csv_file(BURST_HEADER, rows)),
}


# --------------------------------------------------------------------------------------------
# Wild files: ingest or TraceError, nothing else

wild_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e308, -1e308, 1e300, 4.7e12, 0.5, -0.0])
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
KEYS = {
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "openai": (
        "timestamp",
        "created",
        "created_at",
        "usage",
        "messages",
        "prompt",
        "completion",
        "choices",
        "request",
        "response",
        "session_id",
        "error",
        "status_code",
        "input_tokens",
    ),
}


@st.composite
def wild_json_file(draw: st.DrawFn, trace_format: str) -> bytes:
    keys = KEYS[trace_format]
    records = draw(
        st.lists(st.dictionaries(st.sampled_from(keys), wild_values, max_size=len(keys)), max_size=6)
    )
    return "\n".join(json.dumps(r) for r in records).encode()  # NaN and Infinity written as such


wild_cells = st.sampled_from(
    ["", " ", "-1", "1.5", "1e3", "NaN", "inf", "=1+1", "+3", "@x", "\t7", "-x", "0x10", "١٢",
     "99999999999999", "999999999999", "2023-11-16 18:15:46", "9999-12-31 23:59:59", "1677-01-01 00:00:00",
     "2023-13-45 25:61:61", '"', '""', "a,b", "0", "7"]
)  # fmt: skip


@st.composite
def wild_csv_file(draw: st.DrawFn, header: str) -> bytes:
    width = header.count(",") + 1
    rows = draw(st.lists(st.lists(wild_cells, min_size=width - 1, max_size=width + 1), max_size=6))
    return csv_file(header, rows)


# Byte-level mutations, the kind a broken export or a cut transfer makes.
splices = st.sampled_from(
    [b"\xff", b"\xc3", b"\xef\xbb\xbf", b"\r", b"\n", b"\r\n", b"\x00", b'"', b",", b"{", b"}", b"[",
     b"]", b"NaN", b"1e400", b"-", b"\\ud800", b"\\", b"\x1f\x8b", b"9" * 30]
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "truncate"]))
        if action == "insert":
            data[at:at] = draw(splices)
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data)


@pytest.mark.parametrize("trace_format", ["openai", "mooncake"])
@FAST
@given(data=st.data())
def test_wild_json_values_ingest_or_raise_trace_error(trace_format: str, data: st.DataObject) -> None:
    raw = data.draw(wild_json_file(trace_format))
    check(trace_format, raw)  # type: ignore[arg-type]
    check("auto", raw)


@pytest.mark.parametrize(("trace_format", "header"), [("azure", AZURE_HEADER), ("burstgpt", BURST_HEADER)])
@FAST
@given(data=st.data())
def test_wild_csv_cells_ingest_or_raise_trace_error(
    trace_format: str, header: str, data: st.DataObject
) -> None:
    raw = data.draw(wild_csv_file(header))
    check(trace_format, raw)  # type: ignore[arg-type]
    check("auto", raw)


@pytest.mark.parametrize("trace_format", FORMATS)
@FAST
@given(data=st.data())
def test_mutated_files_ingest_or_raise_trace_error(trace_format: str, data: st.DataObject) -> None:
    raw = data.draw(mutated(valid_files[trace_format]))
    check(trace_format, raw)  # type: ignore[arg-type]
    check("auto", raw)
    check(trace_format, gzip.compress(raw, mtime=0))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# One bad field on one line: that line and that field are named

bad_counts = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=MAX_TOKENS + 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.just({}),
)
bad_ms_timestamps = st.one_of(
    st.integers(min_value=4_611_686_018_428) | st.integers(max_value=-4_611_686_018_428),
    st.floats(min_value=4.7e12, allow_infinity=False) | st.sampled_from([1e303, -1e308]),
    st.text(max_size=8),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)
bad_block_lists = st.one_of(
    st.text(max_size=4),
    st.integers(),
    st.just({}),
    st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
    st.lists(st.integers(min_value=1 << 63), min_size=1, max_size=3),
    st.lists(st.floats() | st.text(max_size=3) | st.none(), min_size=1, max_size=3),
)


def _assert_names(error: TraceError, line: int, *fields: str) -> None:
    assert error.line == line, str(error)
    assert any(field in error.problem for field in fields), str(error)


@FAST
@given(
    records=mooncake_records(),
    data=st.data(),
    field=st.sampled_from(["input_length", "output_length", "timestamp", "hash_ids"]),
)
def test_mooncake_bad_field_is_named_with_its_line(
    records: list[dict[str, Any]], data: st.DataObject, field: str
) -> None:
    if field == "hash_ids" and "hash_ids" not in records[0]:
        field = "input_length"
    k = data.draw(st.integers(0, len(records) - 1))
    strategy = {"timestamp": bad_ms_timestamps, "hash_ids": bad_block_lists}.get(field, bad_counts)
    value = data.draw(strategy | st.just(None))
    if value is None and not (field == "hash_ids" and k == 0):
        del records[k][field]  # missing (ids missing from line 1 would mean a trace without any)
    else:
        records[k][field] = value
    error = fails(jsonl(records), "mooncake")
    _assert_names(error, k + 1, f"`{field}`")


@FAST
@given(
    records=openai_records(),
    data=st.data(),
    field=st.sampled_from(["prompt_tokens", "completion_tokens", "timestamp", "messages", "prompt"]),
)
def test_openai_bad_field_is_named_with_its_line(
    records: list[dict[str, Any]], data: st.DataObject, field: str
) -> None:
    k = data.draw(st.integers(0, len(records) - 1))
    record = records[k]
    if field in ("prompt_tokens", "completion_tokens"):
        record["usage"] = {"prompt_tokens": 1, "completion_tokens": 1, field: data.draw(bad_counts)}
        names: tuple[str, ...] = (f"`{field}`",)
    elif field == "timestamp":
        record["timestamp"] = data.draw(
            st.sampled_from(["yesterday", "2023-13-01T00:00:00", "", "1e9", [1], {}, 1e300, -(10**20)])
        )
        names = ("timestamp",)
    elif field == "messages":
        record.pop("prompt", None)
        record["messages"] = data.draw(
            st.sampled_from(["hi", 3, {}, [1], [{"role": 1, "content": "x"}], [{"role": "u", "content": 7}]])
        )
        names = ("`messages`", "message needs")
    else:
        record.pop("messages", None)
        record["prompt"] = data.draw(st.sampled_from([3, {}, [1, "a"], True, 1.5]))
        names = ("`prompt`",)
    error = fails(jsonl(records), "openai")
    _assert_names(error, k + 1, *names)


bad_token_cells = st.sampled_from(
    ["", "-3", "1.5", "abc", "=1+1", "+1", "@x", "\t1", "1e3", "NaN", "inf", "99999999999", "١٢", "0x10"]
)
bad_time_cells = st.sampled_from(
    ["", "yesterday", "2023-11-16", "2023-13-01 00:00:00", "2023-02-30 10:00:00", "9999-01-01 00:00:00",
     "1000-01-01 00:00:00", "1700-06-01 00:00:00", "2200-01-01 00:00:00", "=NOW()", "٢٠٢٣-11-16 18:15:46", "2023-11-16 18:15:46.1234567891"]
)  # fmt: skip


@FAST
@given(rows=azure_rows(), data=st.data(), column=st.integers(0, 2))
def test_azure_bad_cell_is_named_with_its_line(
    rows: list[list[str]], data: st.DataObject, column: int
) -> None:
    k = data.draw(st.integers(0, len(rows) - 1))
    rows[k][column] = data.draw(bad_time_cells if column == 0 else bad_token_cells)
    error = fails(csv_file(AZURE_HEADER, rows), "azure")
    _assert_names(error, k + 2, f"`{AZURE_HEADER.split(',')[column]}`")


@FAST
@given(rows=burst_rows(), data=st.data(), column=st.sampled_from([0, 2, 3, 5]))
def test_burstgpt_bad_cell_is_named_with_its_line(
    rows: list[list[str]], data: st.DataObject, column: int
) -> None:
    k = data.draw(st.integers(0, len(rows) - 1))
    if column == 0:
        bad = data.draw(
            st.sampled_from(["", "-1", "1e3", "abc", "999999999999", "1234567890123", "=1", "1.2.3"])
        )
    elif column == 5:
        bad = data.draw(st.sampled_from(["=HYPERLINK()", "+cmd", "@SUM(1)", "\tx", "-x"]))
    else:
        bad = data.draw(bad_token_cells)
    rows[k][column] = bad
    error = fails(csv_file(BURST_HEADER, rows), "burstgpt")
    _assert_names(error, k + 2, f"`{BURST_HEADER.split(',')[column]}`")


@pytest.mark.parametrize("trace_format", ["openai", "mooncake"])
@FEW
@given(data=st.data(), token=st.sampled_from(["NaN", "Infinity", "-Infinity"]))
def test_non_finite_json_number_is_named_with_its_line(
    trace_format: str, data: st.DataObject, token: str
) -> None:
    raw = data.draw(valid_files[trace_format]).decode().splitlines()
    k = data.draw(st.integers(0, len(raw) - 1))
    raw[k] = raw[k].replace('"timestamp": ', f'"timestamp": {token}, "x": ', 1)
    error = fails(("\n".join(raw) + "\n").encode(), trace_format)
    _assert_names(error, k + 1, "not a number")


# --------------------------------------------------------------------------------------------
# What must not matter


@pytest.mark.parametrize("trace_format", FORMATS)
@FEW
@given(data=st.data())
def test_bom_crlf_gzip_and_blank_lines_do_not_change_the_profile(
    trace_format: str, data: st.DataObject
) -> None:
    raw = data.draw(valid_files[trace_format])
    expected = run(raw, trace_format).profile.to_json_dict()
    crlf = raw.replace(b"\n", b"\r\n")
    blank = raw.replace(b"\n", b"\n\n  \n", data.draw(st.integers(1, 3)))
    for variant in (b"\xef\xbb\xbf" + raw, crlf, gzip.compress(crlf, mtime=0), blank, raw.rstrip(b"\n")):
        assert run(variant, trace_format).profile.to_json_dict() == expected
        assert run(variant, "auto").profile.to_json_dict() == expected


# --------------------------------------------------------------------------------------------
# Limits and framing


def _lines(raw: bytes) -> list[bytes]:
    return raw.rstrip(b"\n").split(b"\n")


def _with_line(raw: bytes, k: int, line: bytes) -> bytes:
    """`raw` with `line` inserted so that it becomes physical line k + 1."""
    lines = _lines(raw)
    return b"\n".join([*lines[:k], line, *lines[k:]]) + b"\n"


def _first_data_line(trace_format: str) -> int:
    return 1 if trace_format in ("azure", "burstgpt") else 0


@pytest.mark.parametrize("trace_format", FORMATS)
@FEW
@given(data=st.data(), newline=st.booleans())
def test_line_beyond_the_limit_is_named(trace_format: str, data: st.DataObject, newline: bool) -> None:
    raw = data.draw(valid_files[trace_format])
    lines = _lines(raw)
    k = data.draw(st.integers(_first_data_line(trace_format), len(lines)))
    long = b'{"timestamp": 1, "prompt": "' + b"x" * LIMITS.max_line_bytes + b'"}'
    changed = _with_line(raw, k, long)
    if k == len(lines) and not newline:
        changed = changed.rstrip(b"\n")
    error = fails(changed, trace_format)
    assert error.line == k + 1 and "longer than" in error.problem, str(error)


@pytest.mark.parametrize("trace_format", FORMATS)
@FEW
@given(data=st.data(), byte=st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\x80"]))
def test_invalid_utf8_is_named_with_its_line(trace_format: str, data: st.DataObject, byte: bytes) -> None:
    raw = data.draw(valid_files[trace_format])
    lines = _lines(raw)
    k = data.draw(st.integers(0, len(lines) - 1))
    at = data.draw(st.integers(0, len(lines[k])))
    lines[k] = lines[k][:at] + byte + lines[k][at:]
    error = fails(b"\n".join(lines) + b"\n", trace_format)
    assert error.line == k + 1 and "UTF-8" in error.problem, str(error)


@pytest.mark.parametrize("trace_format", ["openai", "mooncake"])
@FEW
@given(data=st.data(), depth=st.integers(1, 3000), opener=st.sampled_from(["[", '{"a":']))
def test_deeply_nested_json_is_named_with_its_line(
    trace_format: str, data: st.DataObject, depth: int, opener: str
) -> None:
    raw = data.draw(valid_files[trace_format])
    k = data.draw(st.integers(0, len(_lines(raw))))
    closer = "]" if opener == "[" else "}"
    nested = (opener * depth + "1" + closer * depth).encode()[: LIMITS.max_line_bytes]
    error = fails(_with_line(raw, k, nested), trace_format)
    assert error.line == k + 1, str(error)


@pytest.mark.parametrize("trace_format", ["openai", "mooncake"])
@FEW
@given(data=st.data(), digits=st.integers(4301, 6000))
def test_numbers_with_too_many_digits_are_named(trace_format: str, data: st.DataObject, digits: int) -> None:
    raw = data.draw(valid_files[trace_format])
    k = data.draw(st.integers(0, len(_lines(raw))))
    line = b'{"timestamp": 5, "input_length": ' + b"7" * digits + b', "output_length": 1}'
    with pytest.raises(TraceError) as caught:
        ingest(io.BytesIO(_with_line(raw, k, line)), trace_format=trace_format)
    assert caught.value.line == k + 1 and "too many digits" in caught.value.problem


@pytest.mark.parametrize("trace_format", FORMATS)
@FEW
@given(data=st.data())
def test_truncated_file_ingests_or_names_a_line(trace_format: str, data: st.DataObject) -> None:
    raw = data.draw(valid_files[trace_format])
    cut = raw[: data.draw(st.integers(0, len(raw) - 1))]
    try:
        result = run(cut, trace_format)
    except TraceError as error:
        assert error.line is None or 1 <= error.line <= cut.count(b"\n") + 1
        return
    # A cut that falls on a line break loses whole requests, nothing else.
    assert result.profile.num_requests <= run(raw, trace_format).profile.num_requests


@pytest.mark.parametrize("trace_format", FORMATS)
@FEW
@given(data=st.data())
def test_truncated_or_corrupt_gzip_is_a_file_error(trace_format: str, data: st.DataObject) -> None:
    packed = gzip.compress(data.draw(valid_files[trace_format]), mtime=0)
    cut = packed[: data.draw(st.integers(2, len(packed) - 1))]
    assert fails(cut, trace_format).line is None
    flipped = bytearray(packed)
    flipped[data.draw(st.integers(10, len(packed) - 9))] ^= data.draw(st.integers(1, 255))
    check(trace_format, bytes(flipped))  # type: ignore[arg-type]


@pytest.mark.parametrize("trace_format", [*FORMATS, "auto"])
@pytest.mark.parametrize(
    "filler", [b"\n", b"0", b'{"timestamp": 1, "input_length": 1, "output_length": 1}\n']
)
def test_gzip_bomb_stops_at_the_decompressed_limit(trace_format: str, filler: bytes) -> None:
    bomb = gzip.compress(filler * (LIMITS.max_bytes // len(filler) + 2), compresslevel=9, mtime=0)
    assert len(bomb) < LIMITS.max_bytes // 10
    error = fails(bomb, trace_format)
    assert error.line is None and "larger than" in error.problem
    plain = fails(filler * (LIMITS.max_bytes // len(filler) + 2), trace_format)
    assert plain.line is None and "larger than" in plain.problem


OTHER_FORMAT_LINE = {
    "openai": b'{"timestamp": 5000, "input_length": 3, "output_length": 4}',
    "mooncake": b'{"timestamp": 1700000000, "usage": {"prompt_tokens": 1, "completion_tokens": 1}}',
    "azure": b'{"timestamp": 5000, "input_length": 3, "output_length": 4}',
    "burstgpt": b"2023-11-16 18:15:46.6805900,12,3",
}


@pytest.mark.parametrize("trace_format", FORMATS)
@FEW
@given(data=st.data())
def test_a_line_of_another_format_is_named(trace_format: str, data: st.DataObject) -> None:
    raw = data.draw(valid_files[trace_format])
    k = data.draw(st.integers(_first_data_line(trace_format), len(_lines(raw))))
    error = fails(_with_line(raw, k, OTHER_FORMAT_LINE[trace_format]), trace_format)
    assert error.line == k + 1, str(error)


EMPTY_LIKE = [b"", b"\n\n", b"   \r\n\t\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\r\n", gzip.compress(b"", mtime=0)]


@pytest.mark.parametrize("trace_format", [*FORMATS, "auto"])
@pytest.mark.parametrize("raw", EMPTY_LIKE, ids=range(len(EMPTY_LIKE)))
def test_empty_files_are_named_empty(trace_format: str, raw: bytes) -> None:
    error = fails(raw, trace_format)
    assert error.line is None and "empty" in error.problem


@pytest.mark.parametrize(
    ("trace_format", "raw", "line", "words"),
    [
        ("azure", AZURE_HEADER + "\n", None, "no requests"),
        ("azure", AZURE_HEADER + "\r\n\r\n", None, "no requests"),
        ("burstgpt", BURST_HEADER + "\n", None, "no requests"),
        ("burstgpt", BURST_HEADER + "\n0,a,1,0,1,x\n", None, "1 failed requests only"),
        ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", 1, "header must name the columns"),
        ("azure", AZURE_HEADER + ",GeneratedTokens\n", 1, "`GeneratedTokens` more than once"),
        ("azure", AZURE_HEADER + ",Extra\n", 1, "exactly 3 columns"),
        ("burstgpt", "Timestamp,Request tokens\n0,1\n", 1, "header must name the columns"),
        ("burstgpt", "Timestamp,Request tokens,Response tokens,request tokens\n0,1,2,3\n", 1, "`Request tokens`"),
        ("burstgpt", "Timestamp,Request tokens,Response tokens,Log Type,LOG TYPE\n0,1,2,a,b\n", 1, "`Log Type`"),
        ("burstgpt", '"Timestamp,Request tokens,Response tokens\n0,1,2\n', 1, "malformed CSV"),
        ("azure", "\xff\xfeT\x00I\x00M\x00", 1, "UTF-8"),
        ("auto", AZURE_HEADER.lower().replace(",", ";") + "\n", 1, "unrecognised format"),
    ],
)  # fmt: skip
def test_headers_only_missing_and_duplicate_columns(
    trace_format: str, raw: str, line: int | None, words: str
) -> None:
    data = raw.encode("latin-1") if raw.startswith("\xff") else raw.encode()
    error = fails(data, trace_format)
    assert error.line == line and words in error.problem, str(error)


def test_reordered_and_padded_csv_columns_are_read_by_name() -> None:
    plain = run(
        csv_file(BURST_HEADER, [["0", "a", "5", "6", "11", "x"], ["2", "b", "7", "8", "15", "y"]]), "burstgpt"
    )
    shuffled = run(
        b'"Log Type", Response tokens ,Model,request TOKENS,Timestamp\nx,6,a, 5 ,0\r\ny,8,b,7,2\r\n',
        "burstgpt",
    )
    assert shuffled.profile.to_json_dict() == plain.profile.to_json_dict()


# --------------------------------------------------------------------------------------------
# What the fuzzers found, one readable case per fix

MOON = '{"timestamp": %s, "input_length": 5, "output_length": 1}'
OPENAI = '{"timestamp": %s, "usage": {"prompt_tokens": 1, "completion_tokens": 1}%s}'


@pytest.mark.parametrize(
    ("trace_format", "raw", "message"),
    [
        # OverflowError: a finite float timestamp overflowed to inf when scaled to ns
        ("mooncake", (MOON % 0 + "\n" + MOON % "1e303").encode(), "line 2: `timestamp` is out of range"),
        ("openai", (OPENAI % (0, "") + "\n" + OPENAI % ("1e300", "")).encode(), "line 2: the timestamp is out of range"),
        # OverflowError: twelve digits of seconds overflowed the int64 column
        ("burstgpt", b"Timestamp,Request tokens,Response tokens\n0,1,2\n99999999999,3,4\n", "line 3: `Timestamp` is out of range"),
        # numpy wrapped years outside datetime64[ns] around silently (a wrong profile)
        ("azure", f"{AZURE_HEADER}\n2023-11-16 18:15:46,1,2\n9999-11-16 18:15:47,1,2\n".encode(), "line 3: `TIMESTAMP` is out of range (years 1824 to 2115)"),
        ("azure", f"{AZURE_HEADER}\n1700-11-16 18:15:46,1,2\n2023-11-16 18:15:47,1,2\n".encode(), "line 2: `TIMESTAMP` is out of range (years 1824 to 2115)"),
        # zlib.error: a corrupt deflate block is not an OSError
        ("mooncake", gzip.compress((MOON % 0).encode(), mtime=0)[:10] + b"\xff" * 12, "the gzip stream is corrupt or truncated"),
        # a second column of the same name was silently ignored
        ("burstgpt", b"Timestamp,Request tokens,Response tokens,Request tokens\n0,1,2,3\n", "line 1: the header names the column `Request tokens` more than once"),
        # an unbalanced quote was reported where the csv reader gave up (the end of the file)
        ("burstgpt", b"Timestamp,Request tokens,Response tokens\n0,1,2\n1,\"2,3\n2,3,4\n3,4,5\n", "line 3: malformed CSV"),
    ],
)  # fmt: skip
def test_fixed_crashes_give_clear_errors(trace_format: str, raw: bytes, message: str) -> None:
    assert str(fails(raw, trace_format)).startswith(message)


def test_lone_surrogates_in_session_ids_and_text_are_counted_not_refused() -> None:
    # UnicodeEncodeError (session ids), "the tokenizer failed" (text): JSON may escape a lone
    # surrogate, as a log that cut an emoji in half does.
    extra = ', "session_id": "\\ud83d{}", "prompt": "ok \\udc00"'
    lines = [OPENAI % (i, extra.format(i % 2)) for i in range(3)]
    profile = run("\n".join(lines).encode(), "openai").profile
    assert profile.num_requests == 3 and profile.num_sessions == 2


def test_timestamps_centuries_apart_cost_no_more_than_minutes_apart() -> None:
    # Window counts were dense: two requests 146 years apart made numpy count 77 million empty
    # 60 s windows (gigabytes). Sparse counts give the same moments.
    far = run((MOON % 0 + "\n" + MOON % 4_600_000_000_000).encode(), "mooncake").profile
    near = run((MOON % 0 + "\n" + MOON % 150_000).encode(), "mooncake").profile
    assert far.sketch.num_full_windows == 76_666_666 and near.sketch.num_full_windows == 2
    assert far.arrival.peak_rps_60s == near.arrival.peak_rps_60s == 1 / 60
    # full windows [0, 60 s) and [60 s, 120 s) hold 1 and 0 arrivals
    assert near.sketch.window_count_mean == 0.5 and near.sketch.window_count_var == 0.25
    assert far.sketch.window_count_mean == pytest.approx(1 / 76_666_666)


def test_one_large_block_id_does_not_grow_the_first_use_table() -> None:
    # One id near 2**25 used to grow the table to 2**25 entries (128 MiB, plus 256 MiB kept for
    # synthesis; 1 GiB at the peak) for a 300-byte file: the fuzzer's out-of-memory input. The
    # private sizes are the point of this regression test.
    ids = [[1, 2], [1, 2**25 - 1], [2**61, 3]]
    lines = [
        json.dumps({"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": h})
        for i, h in enumerate(ids)
    ]
    from tuning.workload.columns import PrefixTracker

    tracker = PrefixTracker(block_size_tokens=512, curve_max_blocks=100, keep_blocks=True)
    result = run("\n".join(lines).encode(), "mooncake")
    assert result.profile.prefix.unique_blocks == 5
    assert result.profile.prefix.reuse_ratio == pytest.approx(512 / 3072)
    assert result.blocks is not None and result.blocks.ids.tolist() == [0, 1, 0, 2, 3, 4]
    import numpy as np

    counts = np.array([2, 2, 2])
    tracker.add_chunk(np.array([1, 2, 1, 2**25 - 1, 2**61, 3]), counts, counts * 512, np.arange(3))
    assert tracker._first_use.nbytes < 1024 and tracker._renumber.nbytes < 1024


# --------------------------------------------------------------------------------------------
# Crash inputs the fuzzers found, and the CI-sized atheris run


def _regressions() -> list[tuple[str, Path]]:
    root = FUZZ_DIR / "regressions"
    return sorted((path.parent.name, path) for path in root.glob("*/*") if path.is_file())


@pytest.mark.parametrize(
    ("target", "path"), _regressions(), ids=lambda v: v if isinstance(v, str) else v.name
)
def test_saved_crash_inputs_no_longer_crash(target: str, path: Path) -> None:
    assert target in TARGETS
    check(target, path.read_bytes())  # type: ignore[arg-type]


def test_there_are_saved_crash_inputs() -> None:
    # The replay above is parametrized from the folder: an emptied folder must not pass silently.
    assert len(_regressions()) >= 1


def test_atheris_short_run_of_every_target(tmp_path: Path) -> None:
    """CI's share of the coverage-guided fuzzing (fuzz/run.py runs a million per target)."""
    pytest.importorskip("atheris", reason="atheris is in the dev extra")
    from fuzz.run import TargetResult, run_target

    def fuzz(target: str) -> TargetResult:
        return run_target(
            target,
            runs=CI_FUZZ_RUNS,
            corpus_dir=tmp_path / target / "corpus",
            artifact_dir=tmp_path / target / "artifacts",
            regressions_dir=None,
            max_crashes=1,
        )

    # One fuzzer process per target, side by side where there are cores for them.
    with ThreadPoolExecutor(max_workers=len(TARGETS)) as pool:
        results = list(pool.map(fuzz, TARGETS))
    for target, result in zip(TARGETS, results, strict=True):
        assert result.crashes == 0, f"{target}: crash input {result.crash_inputs} in {tmp_path / target}"
        assert result.completed and result.executions >= CI_FUZZ_RUNS
        assert result.corpus_files > 0  # coverage feedback worked: the fuzzer kept new inputs


def test_a_fuzzer_started_from_a_large_process_is_not_out_of_memory(tmp_path: Path) -> None:
    """A child's peak RSS starts at its parent's (Linux carries it across fork and exec): a test
    process past 2 GiB once made every fuzzer report out-of-memory before its first input."""
    pytest.importorskip("atheris", reason="atheris is in the dev extra")
    import subprocess
    import sys

    script = f"""
import numpy as np
big = np.ones(2300 << 20, dtype=np.uint8)  # this process's peak RSS past 2 GiB; libFuzzer checks each second
from pathlib import Path
from fuzz.run import run_target
r = run_target("mooncake", runs=20_000, corpus_dir=Path({str(tmp_path / "corpus")!r}),
               artifact_dir=Path({str(tmp_path / "artifacts")!r}), regressions_dir=None, max_crashes=1)
assert r.crashes == 0 and r.completed, r
print("ok", r.executions)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith("ok ")
