"""Bad input: every problem is a TraceError naming the line and the problem, nothing half-done."""

from __future__ import annotations

import gzip
import io
import json
import zipfile

import pytest

from tuning.workload import IngestLimits, IngestResult, TraceError, ingest

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def mooncake_line(ts: object = 0, il: object = 600, ol: object = 10, ids: object = None) -> str:
    return json.dumps({"timestamp": ts, "input_length": il, "output_length": ol, "hash_ids": ids or [1, 2]})


def azure_line(second: int, context: str = "100", generated: str = "10") -> str:
    return f"2023-11-16 18:15:{second:02d}.6805900,{context},{generated}\n"


def good_mooncake(n: int = 3) -> list[str]:
    return [mooncake_line(ts=i * 1000, ids=[i, i + 100]) for i in range(n)]


def run(data: bytes | str, **options: object) -> IngestResult:
    raw = data.encode() if isinstance(data, str) else data
    return ingest(io.BytesIO(raw), **options)  # type: ignore[arg-type]


def fails(data: bytes | str, line: int | None, *words: str, **options: object) -> TraceError:
    with pytest.raises(TraceError) as caught:
        run(data, **options)
    error = caught.value
    assert error.line == line, str(error)
    for word in words:
        assert word in str(error), str(error)
    if line is not None:
        assert str(error).startswith(f"line {line}: ")
    assert error.__cause__ is None and error.__context__ is None
    return error


def test_empty_file() -> None:
    fails(b"", None, "empty")
    fails(b"\n\n  \n", None, "empty")


def test_header_only_has_no_requests() -> None:
    fails(AZURE_HEADER, None, "no requests")


def test_single_request_cannot_be_profiled() -> None:
    fails(mooncake_line() + "\n", None, "at least two requests")


def test_unrecognised_format() -> None:
    fails(b"hello there\nthis is not a trace\n", 1, "unrecognised format")
    fails(b"\x89PNG\r\n\x1a\n....", 1, "unrecognised format")


def test_named_format_that_does_not_fit() -> None:
    fails("\n".join(good_mooncake()), 1, "not an Azure trace", trace_format="azure")
    fails(AZURE_HEADER + azure_line(1), 1, "not valid JSON", trace_format="mooncake")
    fails("\n".join(good_mooncake()), None, "unknown format", trace_format="parquet")


def test_truncated_last_line() -> None:
    lines = good_mooncake(4)
    text = "\n".join(lines[:3]) + "\n" + lines[3][:25]
    fails(text, 4, "not valid JSON", "truncated")


def test_truncated_csv_row() -> None:
    fails(AZURE_HEADER + azure_line(1) + "2023-11-16 18:15:02.68,37", 3, "expected 3 columns", "found 2")


@pytest.mark.parametrize(
    ("value", "problem"),
    [(-5, "`input_length` is negative"), ("12", "not a string"), (12.5, "not a fraction"), (True, "boolean")],
)
def test_bad_mooncake_lengths(value: object, problem: str) -> None:
    lines = good_mooncake(3)
    lines[1] = mooncake_line(ts=1000, il=value)
    fails("\n".join(lines), 2, problem)


@pytest.mark.parametrize(
    ("cell", "problem"),
    [
        ("-5", "`ContextTokens` is negative"),
        ("abc", "is not a whole number"),
        ("", "is empty"),
        ("1.5", "not a"),
    ],
)
def test_bad_azure_lengths(cell: str, problem: str) -> None:
    fails(AZURE_HEADER + azure_line(1) + azure_line(2, context=cell) + azure_line(3), 3, problem)


def test_missing_field() -> None:
    lines = good_mooncake(3)
    lines[2] = json.dumps({"timestamp": 5000, "input_length": 5, "hash_ids": [1]})
    fails("\n".join(lines), 3, "missing `output_length`")


def test_timestamps_going_backwards_name_the_line() -> None:
    lines = [mooncake_line(ts=t, ids=[t]) for t in (0, 1000, 2000, 1500, 3000)]
    fails("\n".join(lines), 4, "earlier than the previous request")
    rows = AZURE_HEADER + azure_line(1) + azure_line(5) + azure_line(3)
    fails(rows, 4, "earlier than the previous request")


def test_equal_timestamps_are_fine() -> None:
    lines = [mooncake_line(ts=t, ids=[t]) for t in (0, 0, 1000, 1000)]
    assert run("\n".join(lines)).profile.num_requests == 4


@pytest.mark.parametrize("cell", ["=cmd|' /C calc'!A0", "+SUM(A1:A2)", "@SUM(A1)", "-2+3+cmd|' /C calc'!A0"])
def test_csv_formula_injection_is_refused(cell: str) -> None:
    text = AZURE_HEADER + azure_line(1) + f"{cell},5,5\n"
    error = fails(text, 3, "formula")
    assert "cmd" not in str(error) and "SUM" not in str(error)
    text = AZURE_HEADER + azure_line(1) + f"2023-11-16 18:15:02.6805900,5,{cell}\n"
    fails(text, 3, "formula")


def test_csv_formula_injection_in_a_text_column() -> None:
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    rows = "5,ChatGPT,100,20,120,Conversation log\n" + '6,"=HYPERLINK(""http://x"")",100,20,120,API log\n'
    fails(header + rows, 3, "formula", "CSV injection")


def test_json_nested_100000_deep() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    body = f'{{"timestamp": 1000, "input_length": 5, "output_length": 5, "hash_ids": {deep}}}'
    lines = [*good_mooncake(1), body, *good_mooncake(1)]
    fails("\n".join(lines), 2, "nested too deeply")
    fails(deep + "\n", 1, "nested too deeply", trace_format="openai")


def test_integer_with_thousands_of_digits() -> None:
    huge = "9" * 5000
    lines = good_mooncake(3)
    lines[1] = f'{{"timestamp": 1000, "input_length": {huge}, "output_length": 1, "hash_ids": [1]}}'
    error = fails("\n".join(lines), 2, "too many digits")
    assert "9999" not in str(error)
    lines[1] = f'{{"timestamp": 1000, "input_length": {"9" * 1000}, "output_length": 1, "hash_ids": [1]}}'
    fails("\n".join(lines), 2, "larger than the limit")
    lines[1] = f'{{"timestamp": 1000, "input_length": 1, "output_length": 1, "hash_ids": [{"9" * 1000}]}}'
    fails("\n".join(lines), 2, "hash_ids")
    fails(AZURE_HEADER + azure_line(1) + azure_line(2, context="7" * 3000), 3, "larger than the limit")


def test_nan_and_infinity() -> None:
    lines = good_mooncake(3)
    lines[1] = '{"timestamp": 1000, "input_length": NaN, "output_length": 1, "hash_ids": [1]}'
    fails("\n".join(lines), 2, "NaN is not a number")
    lines[1] = '{"timestamp": Infinity, "input_length": 1, "output_length": 1, "hash_ids": [1]}'
    fails("\n".join(lines), 2, "Infinity is not a number")
    lines[1] = '{"timestamp": 1e999, "input_length": 1, "output_length": 1, "hash_ids": [1]}'
    fails("\n".join(lines), 2, "`timestamp`")
    fails(AZURE_HEADER + azure_line(1) + azure_line(2, generated="NaN"), 3, "not a number")


def test_duplicate_keys() -> None:
    lines = good_mooncake(3)
    lines[2] = (
        '{"timestamp": 5000, "input_length": 5, "output_length": 1, "hash_ids": [1], "input_length": 9}'
    )
    fails("\n".join(lines), 3, "duplicate key `input_length`")
    lines[2] = (
        '{"timestamp": 5000, "input_length" : 5, "output_length": 1, "hash_ids": [1], "input_length":9}'
    )
    fails("\n".join(lines), 3, "duplicate key `input_length`")
    lines[2] = (
        '{"timestamp": 5000, "input_length": 5, "output_length": 1, "hash_ids": [1], "x": {"a": 1, "a": 2}}'
    )
    fails("\n".join(lines), 3, "duplicate key in one JSON object")


def test_hash_ids_must_be_integers() -> None:
    lines = good_mooncake(3)
    lines[1] = mooncake_line(ts=1000, ids=[1, "two"])
    fails("\n".join(lines), 2, "`hash_ids`")
    lines[1] = mooncake_line(ts=1000, ids=[1, -2])
    fails("\n".join(lines), 2, "non-negative")


def test_oversize_file_stops_at_the_limit() -> None:
    text = "\n".join(good_mooncake(200))
    fails(text, None, "larger than the 1,000 bytes limit", limits=IngestLimits(max_bytes=1000))
    assert run(text, limits=IngestLimits(max_bytes=len(text))).profile.num_requests == 200


def test_overlong_line() -> None:
    lines = good_mooncake(3)
    lines[1] = mooncake_line(ts=1000, ids=list(range(5000)))
    fails("\n".join(lines), 2, "longer than", limits=IngestLimits(max_line_bytes=4096))
    # a line with no newline at all is stopped at the limit too
    fails(b"x" * 3_000_000, 1, "longer than", limits=IngestLimits(max_line_bytes=1 << 20))


def test_gzip_is_read_and_a_gzip_bomb_is_stopped() -> None:
    text = "\n".join(good_mooncake(50)).encode()
    assert run(gzip.compress(text)).profile.num_requests == 50
    bomb = gzip.compress(AZURE_HEADER.encode() + b"\n" * 20_000_000, compresslevel=9)
    assert len(bomb) < 40_000  # 500x
    fails(bomb, None, "decompressed file is larger", limits=IngestLimits(max_bytes=4 << 20))


def test_truncated_gzip() -> None:
    packed = gzip.compress("\n".join(good_mooncake(2000)).encode())
    fails(packed[: len(packed) // 2], None, "gzip", "corrupt or truncated")


def test_zip_archives_are_refused() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("trace.jsonl", "\n".join(good_mooncake()))
    fails(buffer.getvalue(), None, "zip archives are not accepted")


def test_invalid_utf8() -> None:
    lines = [line.encode() for line in good_mooncake(3)]
    lines[1] = lines[1].replace(b'"timestamp"', b'"times\xfftamp"')
    fails(b"\n".join(lines), 2, "not valid UTF-8")
    fails(AZURE_HEADER.encode() + azure_line(1).encode() + b"\xff\xfe,1,1\n", 3, "not valid UTF-8")


def test_impossible_azure_dates() -> None:
    bad = "2023-13-16 18:15:02.6805900,5,5\n"
    fails(AZURE_HEADER + azure_line(1) + bad, 3, "`TIMESTAMP` is not a valid date")
    fails(AZURE_HEADER + azure_line(1) + "2023-11-16 18:15:02+01:00,5,5\n", 3, "`TIMESTAMP` is not a date")


def test_not_an_object() -> None:
    fails("\n".join([*good_mooncake(2), "[1, 2, 3]"]), 3, "expected a JSON object")


def test_azure_with_bom_and_crlf_and_blank_lines() -> None:
    text = "\ufeff" + AZURE_HEADER.replace("\n", "\r\n") + azure_line(1) + "\r\n" + azure_line(2)
    result = run(text.replace("\n", "\r\n").replace("\r\r\n", "\r\n"))
    assert result.profile.num_requests == 2
    assert result.profile.duration_s == 1.0


def test_mooncake_without_hash_ids_has_no_prefix_information() -> None:
    lines = [json.dumps({"timestamp": t, "input_length": 10, "output_length": 2}) for t in (0, 500, 900)]
    profile = run("\n".join(lines)).profile
    assert profile.prefix.reuse_ratio is None
    assert profile.trace_format == "mooncake"
