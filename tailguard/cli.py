"""The `tailguard` command line.

Each command module exposes `register(subparsers)`, which adds its subcommands and sets `func` on
each (a callable taking the parsed namespace and returning an exit status). The modules are
imported here by name, not looked up from strings, so the layer contract sees every library the
CLI reaches; each keeps its heavy imports (torch, triton, vLLM) inside the command that needs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from kernels import cli as kernels_cli
from serving import commands as serving_commands
from serving import sim_commands
from serving.runner import cli as runner_cli
from tailguard import moe_cli
from tuning import __version__
from tuning.commands import tune as tune_commands
from tuning.commands import workload as workload_commands

# The order is the order of `tailguard --help`.
REGISTRARS: tuple[Callable[[Any], None], ...] = (
    workload_commands.register,  # profile, drift, synth
    kernels_cli.register,  # kernels tune
    moe_cli.register,  # moe-tables tune
    serving_commands.register,  # engine, replay
    sim_commands.register,  # simulate
    tune_commands.register,  # tune
    runner_cli.register,  # endpoint, agent
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailguard",
        description="Tailguard: tune, deploy and re-tune LLM endpoints against real traffic and an SLO.",
    )
    parser.add_argument("--version", action="version", version=f"tailguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    # A command that hands over to another process (`tune --pool`) passes its own words on.
    args.argv = raw
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    status: int = func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
