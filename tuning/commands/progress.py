"""Progress on the terminal for the workload commands: a bar while a trace is read, then a
spinner with the elapsed time while it is profiled or a trace is synthesised.

Drawn on stderr, and only when stderr is a terminal: `--json` output on stdout stays clean for
pipes, and logs of scripted runs get no escape codes. Uses `rich`, a maintained library.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tuning.workload import IngestResult, ingest


def console() -> Console:
    return Console(stderr=True)


def _progress(out: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=out,
        transient=True,  # the bar gives way to the command's own output
        disable=not out.is_terminal,
    )


def ingest_with_progress(path: str | os.PathLike[str], *, out: Console, **options: Any) -> IngestResult:
    """`ingest_path` with a bar over the file's bytes (compressed ones for a .gz), then a spinner
    while the requests read are profiled."""
    name = Path(path).name
    with Path(path).open("rb") as stream, _progress(out) as bar:
        size = os.fstat(stream.fileno()).st_size
        task: TaskID = bar.add_task(f"reading {name}", total=size or None)

        def read_so_far(_decompressed_bytes: int) -> None:
            # The file's own offset, not the decompressed count: it is what the total measures.
            position = stream.tell()
            if size and position >= size:
                # Read: what is left (the profile) has no known length, so the bar pulses.
                bar.update(task, description=f"profiling {name}", completed=size, total=None)
            else:
                bar.update(task, completed=position)

        return ingest(stream, progress=read_so_far, **options)


@contextmanager
def working(out: Console, description: str) -> Iterator[None]:
    """A spinner with the elapsed time for work whose length is not known in advance."""
    with _progress(out) as bar:
        bar.add_task(description, total=None)
        yield
