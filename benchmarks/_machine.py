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


def git_state(repo: Path) -> dict[str, object]:
    """The commit the run measured and whether the tree differed from it (a dirty run's figures
    belong to no commit)."""
    import subprocess

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return out.stdout.strip()

    tree = working_tree_hash(repo)
    if os.environ.get("TAILGUARD_GIT_COMMIT"):
        # A copy of the tree on another host (the GPU host gets the working tree, and its .git,
        # where there is one, is an older snapshot's): the launcher states the commit it copied
        # and whether that tree was dirty.
        return {
            "commit": os.environ["TAILGUARD_GIT_COMMIT"],
            "dirty": os.environ.get("TAILGUARD_GIT_DIRTY", "1") != "0",
            "source": "stated by the launcher (a copy of the tree on another host)",
            "note": os.environ.get("TAILGUARD_GIT_NOTE", ""),
            "tree": tree,
        }
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "tree": tree,
    }


def working_tree_hash(repo: Path) -> str | None:
    """Git's tree hash of the files as they are (tracked and untracked, .gitignore honoured),
    from a scratch index: equal to `git rev-parse COMMIT^{tree}` of the commit whose files ran.
    A copy of the tree on another host (its .git an older snapshot, so `dirty` there) can so be
    matched to the commit it was copied from; None without git."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}

        def git(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False, env=env
            )

        if git("add", "--all", ".").returncode != 0:
            return None
        out = git("write-tree")
        return out.stdout.strip() or None if out.returncode == 0 else None


def machine_facts() -> dict[str, object]:
    """CPU model, cores, the ISA flags that decide fast dtypes, and the GPU if there is one."""
    import shutil
    import subprocess

    from serving.engine.host import cpu_facts

    facts: dict[str, object] = {**cpu_facts(), "description": machine()}
    gpu = "none"
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        gpu = out.stdout.strip() or "none"
    facts["gpu"] = gpu
    return facts
