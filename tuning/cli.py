"""Moved to `tailguard.cli`: the command line sits above the libraries it puts together.

This module only keeps `python -m tuning.cli` and `from tuning.cli import main` working for the
callers that still use them; it is the one upward import the layer contract lists
(`ignore_imports` in pyproject.toml). New code imports `tailguard.cli`.
"""

from __future__ import annotations

import sys

from tailguard.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
