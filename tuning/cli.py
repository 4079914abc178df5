"""The `tailguard` command line.

Each module in `COMMAND_MODULES` exposes `register(subparsers)`, which adds its subcommands and
sets `func` on each (a callable taking the parsed namespace and returning an exit status). The
modules are imported only when the CLI runs, so importing `tuning` stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tuning import __version__

COMMAND_MODULES: list[str] = [
    # one line per module that registers subcommands
    "tuning.commands.workload",
    "kernels.cli",
    "serving.commands",
    "serving.sim_commands",
    "tuning.commands.tune",
    "serving.runner.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailguard",
        description="Tailguard: tune, deploy and re-tune LLM endpoints against real traffic and an SLO.",
    )
    parser.add_argument("--version", action="version", version=f"tailguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    status: int = func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
