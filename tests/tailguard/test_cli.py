"""The `tailguard` command line puts every library's commands together (tailguard/cli.py)."""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points

import pytest

from tailguard.cli import build_parser, main

COMMANDS = [
    "profile",
    "drift",
    "synth",
    "kernels",
    "moe-tables",
    "engine",
    "replay",
    "simulate",
    "tune",
    "endpoint",
    "agent",
]


def test_help_lists_every_command_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    (commands,) = [
        action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)
    ]
    assert list(commands.choices) == COMMANDS
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    # A name longer than argparse's column has its help on the next line.
    assert all(f"    {name} " in out or f"    {name}\n" in out for name in COMMANDS)


def test_every_command_has_something_to_run() -> None:
    parser = build_parser()
    assert parser.parse_args(["profile", "trace.jsonl"]).func is not None
    assert parser.parse_args(["agent", "--pool", "h200"]).func is not None
    assert parser.parse_args(["kernels", "tune", "--model", "m", "--profile", "p.json"]).func is not None


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: tailguard" in capsys.readouterr().out


def test_the_console_script_runs_this_cli() -> None:
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "tailguard"]
    assert script.value == "tailguard.cli:main"
