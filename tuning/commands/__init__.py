"""Subcommands of the `tailguard` CLI, one module per area (see `tuning.cli.COMMAND_MODULES`)."""
