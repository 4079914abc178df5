"""`tailguard profile`, `drift` and `synth` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tailguard.cli import main

CONTRACT_KEYS = {"num_requests", "duration_s", "input_tokens", "output_tokens", "arrival", "prefix"}


def test_profile_json_on_both_traces(
    mooncake_path: Path, azure_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", str(mooncake_path), "--json"]) == 0
    mooncake = json.loads(capsys.readouterr().out)
    assert set(mooncake) >= CONTRACT_KEYS
    assert mooncake["num_requests"] == 3993
    assert set(mooncake["arrival"]) >= {"mean_rps", "peak_rps_60s", "interarrival_cv"}
    assert 0 < mooncake["prefix"]["reuse_ratio"] < 1
    assert main(["profile", str(azure_path), "--format", "azure", "--json"]) == 0
    azure = json.loads(capsys.readouterr().out)
    assert azure["num_requests"] == 19366
    assert azure["prefix"]["reuse_ratio"] is None


def test_profile_readable_summary(mooncake_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", str(mooncake_path)]) == 0
    out = capsys.readouterr().out
    assert "3,993 requests" in out
    assert "input tokens" in out and "prefix reuse: 65.1%" in out


def test_profile_errors_exit_1_naming_the_line(
    mooncake_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", str(mooncake_path), "--format", "azure"]) == 1
    err = capsys.readouterr().err
    assert "line 1: not an Azure trace" in err
    assert main(["profile", str(tmp_path / "missing.jsonl")]) == 1
    assert "No such file" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    assert main(["profile", str(empty)]) == 1
    assert "the file is empty" in capsys.readouterr().err


def test_drift_on_traces_and_on_saved_profiles(
    mooncake_path: Path, azure_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["drift", str(azure_path), str(mooncake_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drifted"] is True
    assert {d["dimension"] for d in report["dimensions"]} == {
        "input_tokens",
        "output_tokens",
        "arrival_rate",
        "burstiness",
        "prefix_reuse",
    }
    saved = tmp_path / "azure-profile.json"
    assert main(["profile", str(azure_path), "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["drift", str(saved), str(azure_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no drift")
    assert "input_tokens" in out


def test_synth_writes_a_replayable_file(
    mooncake_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "synthetic.jsonl"
    args = ["synth", str(mooncake_path), "--target-rps", "5", "--duration-s", "120", "--seed", "3"]
    assert main([*args, "--out", str(out)]) == 0
    assert "wrote 600 requests" in capsys.readouterr().out
    first = out.read_bytes()
    assert main([*args, "--out", str(out)]) == 0
    assert out.read_bytes() == first
    capsys.readouterr()
    assert main(["profile", str(out), "--json"]) == 0
    profile = json.loads(capsys.readouterr().out)
    assert profile["num_requests"] == 600
    assert profile["duration_s"] == pytest.approx(120, abs=1e-3)
    assert main([*args[:2], "--target-rps", "0", "--duration-s", "1", "--seed", "1", "--out", str(out)]) == 2


def test_the_console_entry_point_runs(mooncake_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "profile", str(mooncake_path), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(done.stdout)["num_requests"] == 3993


def _run_on_a_terminal(args: list[str], cwd: Path) -> tuple[str, str]:
    """Run `tailguard ARGS` with stderr on a pseudo-terminal (as in a shell) and stdout on a pipe."""
    import os
    import pty

    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "tailguard.cli", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(slave)
    terminal = bytearray()
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        terminal += chunk
    os.close(master)
    stdout, _ = process.communicate(timeout=120)
    assert process.returncode == 0, terminal.decode(errors="replace")
    return stdout.decode(), terminal.decode(errors="replace")


def test_workload_commands_show_progress_on_a_terminal_and_keep_stdout_clean(
    mooncake_path: Path, tmp_path: Path
) -> None:
    stdout, terminal = _run_on_a_terminal(["profile", str(mooncake_path), "--json"], tmp_path)
    assert json.loads(stdout)["num_requests"] == 3993  # the bar never reaches stdout
    assert "reading mooncake_synthetic.jsonl" in terminal and "profiling mooncake_synthetic.jsonl" in terminal
    from rich.filesize import decimal

    assert f"/{decimal(mooncake_path.stat().st_size)}" in terminal  # the bar counts the file's bytes

    out = tmp_path / "synthetic.jsonl"
    args = [
        "synth",
        str(mooncake_path),
        "--target-rps",
        "5",
        "--duration-s",
        "120",
        "--seed",
        "3",
        "--out",
        str(out),
    ]
    stdout, terminal = _run_on_a_terminal(args, tmp_path)
    assert "wrote 600 requests" in stdout
    assert "synthesising 120 s at 5 req/s" in terminal and "writing 600 requests" in terminal

    # Without a terminal (a pipe, a CI log) nothing is drawn.
    done = subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "profile", str(mooncake_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stderr == "" and "3,993 requests" in done.stdout
