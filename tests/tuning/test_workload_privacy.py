"""No prompt text survives ingest: not in results, reprs, errors, tracebacks or CLI output.

A marker string is planted in every text-bearing place of an OpenAI-style log (system and user
messages, prompt, completion, session id, model, an unknown field, even a key), then everything
ingest produces is searched for it.
"""

from __future__ import annotations

import io
import json
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pytest

from tailguard.cli import main
from tuning.workload import IngestResult, TraceError, ingest

MARKER = "ZZ-PATIENT-Jane-Doe-MRN-55501-7f3a"


def log_line(i: int, **extra: Any) -> str:
    record: dict[str, Any] = {
        "timestamp": 1_732_950_000 + 1.5 * i,
        "model": f"model-{MARKER}",
        "session_id": f"{MARKER}-{i % 3}",
        "messages": [
            {"role": "system", "content": f"You are a clinical assistant for {MARKER}. " * 40},
            {"role": "user", "content": [{"type": "text", "text": f"{MARKER} asks about dose {i}"}]},
        ],
        "completion": f"Dear {MARKER}, take {i} mg.",
        "metadata": {"note": MARKER, MARKER: 1},
    }
    record.update(extra)
    return json.dumps(record)


def clean_log(n: int = 30) -> bytes:
    return "\n".join(log_line(i) for i in range(n)).encode()


def assert_no_marker(text: str) -> None:
    assert MARKER not in text
    assert MARKER.lower() not in text.lower()


def arrays_of(result: IngestResult) -> Iterator[np.ndarray]:
    for holder in (result.columns, result.blocks):
        if holder is None:
            continue
        for value in vars(holder).values():
            if isinstance(value, np.ndarray):
                yield value


def library_frame_locals(tb: TracebackType | None) -> Iterator[str]:
    """Locals of the library's frames an error report would capture (the test's own excluded)."""
    while tb is not None:
        if f"{Path('tuning')}" in tb.tb_frame.f_code.co_filename.replace("tests/tuning", ""):
            for value in tb.tb_frame.f_locals.values():
                yield repr(value)
        tb = tb.tb_next


def test_the_marker_is_really_in_the_input() -> None:
    assert MARKER.encode() in clean_log()


def test_results_hold_no_text() -> None:
    result = ingest(io.BytesIO(clean_log()), salt=b"org-a", keep_blocks=True)
    assert result.profile.num_requests == 30
    assert result.profile.num_sessions == 3
    assert result.profile.prefix.reuse_ratio is not None and result.profile.prefix.reuse_ratio > 0.5
    assert_no_marker(json.dumps(result.profile.to_json_dict()))
    assert_no_marker(json.dumps(result.charts.to_json_dict()))
    for thing in (result, result.profile, result.charts, result.columns, result.blocks):
        assert_no_marker(repr(thing))
        assert_no_marker(str(thing))
    for array in arrays_of(result):
        assert MARKER.encode() not in array.tobytes()


def test_salt_changes_hashes_not_numbers() -> None:
    a = ingest(io.BytesIO(clean_log()), salt=b"org-a")
    b = ingest(io.BytesIO(clean_log()), salt=b"org-b")
    assert a.profile == b.profile


def broken_lines() -> list[tuple[str, bytes]]:
    good = log_line(0)
    return [
        ("truncated JSON", log_line(1)[: log_line(1).index(MARKER) + len(MARKER) + 3].encode()),
        ("duplicate key", good[:-1].encode() + f', "{MARKER}": 2, "{MARKER}": 3}}'.encode()),
        ("NaN", good[:-1].encode() + f', "x": NaN, "y": "{MARKER}"}}'.encode()),
        ("bad messages", log_line(1, messages=MARKER).encode()),
        ("bad prompt type", json.dumps({"timestamp": 5e9, "prompt": {MARKER: MARKER}}).encode()),
        ("bad timestamp", log_line(1, timestamp=MARKER).encode()),
        ("negative count", log_line(1, usage={"prompt_tokens": -1, "note": MARKER}).encode()),
        ("no completion", json.dumps({"timestamp": 1_732_950_010, "prompt": MARKER}).encode()),
        ("bad UTF-8", good.encode().replace(MARKER.encode(), MARKER.encode() + b"\xff", 1)),
        ("deep nesting", good[:-1].encode() + f', "x": {"[" * 50_000}"{MARKER}"{"]" * 50_000}}}'.encode()),
        ("not an object", json.dumps([MARKER]).encode()),
    ]


@pytest.mark.parametrize(("label", "bad"), broken_lines(), ids=[label for label, _ in broken_lines()])
def test_errors_never_echo_text(label: str, bad: bytes, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    data = clean_log(3) + b"\n" + bad + b"\n" + clean_log(2)
    with pytest.raises(TraceError) as caught:
        ingest(io.BytesIO(data), salt=b"org-a")
    error = caught.value
    assert error.line == 4, (label, str(error))
    assert error.__cause__ is None and error.__context__ is None
    for text in (str(error), repr(error), repr(error.args), "".join(traceback.format_exception(error))):
        assert_no_marker(text)
    library_frames = list(library_frame_locals(error.__traceback__))
    assert library_frames, "the ingest frame should be in the traceback"
    for local in library_frames:
        assert_no_marker(local)
    for record in caplog.records:
        assert_no_marker(record.getMessage())


def test_a_failing_tokenizer_does_not_leak_its_message() -> None:
    class Leaky:
        name = "leaky"

        def encode(self, text: str) -> list[int]:
            raise ValueError(f"cannot encode {text!r}")

    with pytest.raises(TraceError) as caught:
        ingest(io.BytesIO(clean_log(3)), tokenizer=Leaky())
    assert "tokenizer leaky failed" in str(caught.value)
    assert_no_marker(str(caught.value))
    assert caught.value.__context__ is None


def test_cli_output_holds_no_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "log.jsonl"
    good.write_bytes(clean_log())
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(clean_log(2) + b"\n" + broken_lines()[0][1])
    assert main(["profile", str(good), "--json"]) == 0
    assert main(["profile", str(good)]) == 0
    assert main(["profile", str(bad)]) == 1
    assert main(["synth", str(good), "--target-rps", "2", "--duration-s", "30", "--seed", "1",
                 "--out", str(tmp_path / "s.jsonl")]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "line 3:" in captured.err
    assert_no_marker(captured.out + captured.err)
    assert_no_marker((tmp_path / "s.jsonl").read_text())
