"""What long device runs share (gpu_tuning.py, kernels_e2e.py): a deadline per command, state
kept between commands, and timestamped progress lines."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def log(line: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S} {line}", file=sys.stderr, flush=True)


class Clock:
    """The command's deadline: a step starts only when its estimated length still fits."""

    def __init__(self, deadline_s: float) -> None:
        self.start = time.monotonic()
        self.deadline_s = deadline_s

    def left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.start)

    def fits(self, estimate_s: float) -> bool:
        return self.left() >= estimate_s


# What `git_state` may write at the top of a state (an earlier stamp is replaced, never kept).
_STAMP_KEYS = ("commit", "dirty", "source", "note")


def load_state(path: Path, *, stamp: Mapping[str, Any]) -> dict[str, Any]:
    """The state an earlier command kept, stamped at the top with `stamp` (the commit and dirty
    flag of the command about to extend it, from `git_state`), so every saved state says which
    tree last wrote it."""
    kept = json.loads(path.read_text()) if path.exists() else {}
    return {**stamp, **{k: v for k, v in kept.items() if k not in _STAMP_KEYS}}


def save_state(path: Path, data: Mapping[str, Any]) -> None:
    """Written whole or not at all (a command killed at its limit leaves the previous state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False))
    tmp.replace(path)
