"""Subcommands of the `tailguard` CLI, one module per area (see `tailguard.cli.REGISTRARS`)."""
