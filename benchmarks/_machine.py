"""What every benchmark result records about where it ran: the machine and the versions."""

from __future__ import annotations

import contextlib
import os
import platform
from importlib import metadata
from pathlib import Path


def machine() -> str:
    """CPU model, core count, memory and kernel, e.g. "AMD EPYC ..., 2 cores, 24 GiB, Linux 6.1"."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.system()} {platform.release()}"


def versions(*dists: str) -> dict[str, str]:
    """Python's version and each installed distribution's (absent ones are left out)."""
    out = {"python": platform.python_version()}
    for dist in dists:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out
