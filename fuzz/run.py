"""Run every fuzz target for a number of executions and record the outcome in fuzz/results.json.

    nice -n 19 taskset -c 1 .venv/bin/python fuzz/run.py --runs 1000000 [--targets openai,azure]

Each target runs `fuzz/fuzz_traces.py` (atheris/libFuzzer) in a child process, with its
growing corpus in `fuzz/corpus/<target>/` (not committed) and the committed seeds in
`fuzz/seeds/<target>/`. A crash stops libFuzzer: its input is copied to
`fuzz/regressions/<target>/` (where pytest replays it) and the target is restarted for the
remaining executions, up to `--max-crashes` times. libFuzzer's log of each process is kept in
`fuzz/artifacts/<target>/fuzz-N.log` (`tail -f` it to follow a long run). `results.json` gets one entry per target
(executions, seconds, crashes, corpus size) with the machine, date and versions; targets not
run this time keep their previous entry, so targets can be run one after another.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
REPO_ROOT = FUZZ_DIR.parent
sys.path.insert(0, str(REPO_ROOT))

from fuzz.targets import TARGETS  # noqa: E402 - needs the path above when run as a script

HARNESS = FUZZ_DIR / "fuzz_traces.py"
DICTIONARY = FUZZ_DIR / "traces.dict"
RESULTS = FUZZ_DIR / "results.json"
# Inputs stay small: the targets' limits are a few KiB, and small inputs run fast.
MAX_LEN = 8192
UNIT_TIMEOUT_S = 30
RSS_LIMIT_MB = 2048  # what one fuzzer process may use on top of what it inherits (below)

_EXECUTED = re.compile(rb"stat::number_of_executed_units:\s*(\d+)")
_PROGRESS = re.compile(rb"^#(\d+)\s", re.M)
_ARTIFACT = re.compile(rb"Test unit written to (\S+)")


@dataclass
class TargetResult:
    target: str
    executions: int = 0
    seconds: float = 0.0
    crashes: int = 0
    crash_inputs: list[str] = field(default_factory=list)  # under fuzz/regressions/
    corpus_files: int = 0  # inputs the fuzzer kept for new coverage (seeds not counted)
    seed_files: int = 0
    fuzzer_processes: int = 0  # 1 unless a crash restarted it
    # "timeouts" of inputs that ran well within the limit when replayed alone: the process
    # had been stopped from outside while on them (not crashes; see run_target)
    spurious_timeouts: list[str] = field(default_factory=list)
    completed: bool = False  # reached the asked-for executions

    @property
    def executions_per_s(self) -> float:
        return self.executions / self.seconds if self.seconds else 0.0


def _executed(output: bytes) -> int:
    final = _EXECUTED.findall(output)
    if final:
        return int(final[-1])
    progress = _PROGRESS.findall(output)
    return int(progress[-1]) if progress else 0


def _replays_cleanly(target: str, unit: Path) -> bool:
    """Whether one input passes when run again alone, within the unit timeout."""
    command = [sys.executable, str(HARNESS), target, f"-timeout={UNIT_TIMEOUT_S}", str(unit)]
    done = subprocess.run(command, capture_output=True, cwd=REPO_ROOT, check=False)
    return done.returncode == 0


def run_target(
    target: str,
    *,
    runs: int,
    corpus_dir: Path,
    artifact_dir: Path,
    regressions_dir: Path | None,
    seed: int = 1,
    max_crashes: int = 5,
) -> TargetResult:
    """Fuzz `target` for `runs` executions (restarting after a crash); returns what happened."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    seeds = FUZZ_DIR / "seeds" / target
    corpus_dir.mkdir(parents=True, exist_ok=True)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    result = TargetResult(target=target, seed_files=sum(1 for _ in seeds.iterdir()))
    started = time.monotonic()
    while result.executions < runs:
        command = [
            sys.executable,
            str(HARNESS),
            target,
            f"-runs={runs - result.executions}",
            f"-seed={seed + result.fuzzer_processes}",
            f"-max_len={MAX_LEN}",
            f"-timeout={UNIT_TIMEOUT_S}",
            f"-rss_limit_mb={rss_limit_mb()}",
            f"-dict={DICTIONARY}",
            f"-artifact_prefix={artifact_dir}/",
            "-print_final_stats=1",
            "-print_pcs=0",
            str(corpus_dir),
            str(seeds),
        ]
        result.fuzzer_processes += 1
        # libFuzzer's own log, written as it goes (progress lines show how far a long run is).
        log = artifact_dir / f"fuzz-{result.fuzzer_processes}.log"
        with log.open("wb") as sink:
            done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO_ROOT, check=False)
        output = log.read_bytes()
        result.executions += _executed(output)
        if done.returncode == 0:
            continue
        written = _ARTIFACT.findall(output)
        if not written:
            raise RuntimeError(
                f"fuzzer for {target} exited with {done.returncode} without a crash input:\n"
                + output[-4000:].decode(errors="replace")
            )
        crash = Path(written[-1].decode())
        if crash.name.startswith("timeout-") and _replays_cleanly(target, crash):
            # The unit timer is wall-clock: a fuzzer stopped from outside (this machine pauses
            # background work during benchmarks) times out on an input that is not slow.
            result.spurious_timeouts.append(crash.name)
            continue
        result.crashes += 1
        if regressions_dir is not None:
            keep = regressions_dir / target
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(crash, keep / crash.name)
        result.crash_inputs.append(crash.name)
        if result.crashes >= max_crashes:
            break
    result.seconds = round(time.monotonic() - started, 1)
    result.completed = result.executions >= runs
    result.corpus_files = sum(1 for _ in corpus_dir.iterdir())
    return result


def rss_limit_mb() -> int:
    """libFuzzer's -rss_limit_mb for a fuzzer started from this process.

    libFuzzer reads its peak RSS from getrusage, and on Linux a child's peak starts at its
    parent's high-water mark (the kernel carries it across fork and exec). A fuzzer started from
    a test process that had grown past 2 GiB (torch and the engine clients loaded) reported
    "out-of-memory (used: 2057Mb)" before its first input. So the limit is counted from there.
    """
    inherited_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux
    return RSS_LIMIT_MB + int(inherited_mb)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):  # no /proc here: fall back to what platform knows
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, object]:
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cores_used": sorted(os.sched_getaffinity(0)),
        "niceness": os.nice(0),
        "os": platform.platform(),
    }


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    return done.stdout.strip()


def versions() -> dict[str, str]:
    """What was fuzzed: the commit, and the parsers' own tree (others commit on top meanwhile)."""
    found = {
        "python": platform.python_version(),
        "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
        "tuning_workload_tree": _git("rev-parse", "--short", "HEAD:tuning/workload") or "unknown",
        "tuning_workload_uncommitted_changes": str(
            bool(_git("status", "--porcelain", "--", "tuning/workload"))
        ),
    }
    for package in ("atheris", "numpy"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def stamp(runs: int) -> dict[str, object]:
    """When, where and on what a run starts."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "runs_asked": runs,
    }


def record(result: TargetResult, started: dict[str, object], path: Path = RESULTS) -> None:
    """Merge one target's result into the results file (other targets keep their last entry)."""
    existing = json.loads(path.read_text()) if path.exists() else {}
    targets = existing.get("targets", {})
    entry = asdict(result)
    entry["executions_per_s"] = round(result.executions_per_s, 1)
    entry.update(started)
    targets[result.target] = entry
    document = {
        "description": "atheris coverage-guided fuzzing of the trace parsers (fuzz/run.py); "
        "a crash is any exception other than TraceError or a broken ingest promise",
        "targets": {name: targets[name] for name in TARGETS if name in targets},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000, help="executions per target")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated targets")
    parser.add_argument("--max-crashes", type=int, default=5, help="stop a target after this many")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {', '.join(unknown)}: use {', '.join(TARGETS)}")
    total_crashes = 0
    for target in chosen:
        started = stamp(args.runs)
        result = run_target(
            target,
            runs=args.runs,
            corpus_dir=FUZZ_DIR / "corpus" / target,
            artifact_dir=FUZZ_DIR / "artifacts" / target,
            regressions_dir=FUZZ_DIR / "regressions",
            seed=args.seed,
            max_crashes=args.max_crashes,
        )
        record(result, started, args.results)
        total_crashes += result.crashes
        print(
            f"{target}: {result.executions:,} executions in {result.seconds:,.0f} s "
            f"({result.executions_per_s:,.0f}/s), {result.crashes} crashes, "
            f"corpus {result.corpus_files} files",
            flush=True,
        )
    return 1 if total_crashes else 0


if __name__ == "__main__":
    sys.exit(main())
