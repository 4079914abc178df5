"""A one-line progress bar on a terminal (silent when the output is not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(
        self, total: int, *, label: str = "replay", stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self.errors = 0
        self._started = time.monotonic()
        self._last_draw = 0.0

    def update(self, *, error: bool = False) -> None:
        self.done += 1
        self.errors += int(error)
        now = time.monotonic()
        # Redrawing costs loop time that requests need: at most ten times a second.
        if self.enabled and (now - self._last_draw >= 0.1 or self.done == self.total):
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        elapsed = now - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        line = (
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            f" {rate:5.2f} req/s  errors {self.errors}  {elapsed:6.1f} s"
        )
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
