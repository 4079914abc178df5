"""`tailguard tune --pool NAME`: the command line's trials, measured on a pool's engine hosts.

The command keeps its job where it always does, in its work dir (`state.json`: the spec and the
recorded trials). Each trial it wants measured goes to the pool's queue as a task naming the work
dir and the trial's number (Celery routing on `pool`, as the portal's job steps go), with the
planned trial written beside it (`trial-N/planned.json`); the agent that takes it plans the job
from the same files, measures the trial under its host's lock and writes `trial-N/result.json`,
which the command collects. The work dir, the trace and the model must therefore be at the same
paths on the pool's hosts (a shared folder), as the portal's own files are for its agents.

With several idle hosts the command sends a batch of search trials at once (one per host: an
agent measures one trial at a time) and records them in trial-number order once all are back.
A host that stops heartbeating while it holds a trial fails that trial with the host named; a
pool left with no live host stops the command with the pool's waiting reason (re-running the
same command resumes after the last recorded trial).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kombu.exceptions import OperationalError as BrokerError

from portal.pools import selectors
from portal.pools.models import Host, Pool
from tuning.commands.tune import read_job
from tuning.search.job import PlannedTrial, Prepared, TrialRecord, execute, plan_job

logger = logging.getLogger(__name__)

PLANNED, RESULT, CLAIM = "planned.json", "result.json", "claim.json"


class PoolUnavailable(RuntimeError):
    """The pool cannot take trials now (no live host, or the broker refused them); the message
    says why and what to do."""


def _write(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, allow_nan=False))
    tmp.replace(path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _failed(planned: PlannedTrial, prepared: Prepared | None, error: str) -> dict[str, Any]:
    config = prepared.space.to_config(planned.assignment).to_mapping() if prepared is not None else {}
    return {"config": config, "status": "failed", "error": error, **planned.stamp()}


# --- on the engine host (the agent's task) ------------------------------------------------------


def cli_trial_run(*, work_dir: str, number: int) -> str:
    """Measure trial `number` of the command-line job in `work_dir` on this host. Idempotent: a
    trial with a result is not measured again (a redelivered message)."""
    root = Path(work_dir)
    folder = root / f"trial-{number}"
    if (folder / RESULT).exists():
        return "measured already"
    here = selectors.host_here()
    name = here.name if here is not None else "this machine"
    holder = _claim(folder / CLAIM, here, name)
    if holder:
        return f"trial {number}: measured by host {holder}"
    raw = _read(folder / PLANNED) or {}
    planned = PlannedTrial(**raw) if raw else PlannedTrial("unknown", {})
    prepared: Prepared | None = None
    try:
        spec, history = read_job(root)
        prepared = plan_job(spec, root)
        result = execute(
            prepared,
            planned,
            [r for r in history if r.number < number],
            folder,
            holder=f"tailguard tune trial {number} ({root})",
        )
    except Exception as exc:
        # Never silent: the command records the trial as failed, with the host and the cause.
        logger.exception("trial %s of %s failed on host %s", number, root, name)
        result = _failed(planned, prepared, f"on host {name}: {type(exc).__name__}: {exc}")
    if here is not None:
        result = {**result, "host": selectors.host_summary(here)}
    _write(folder / RESULT, result)
    return f"trial {number}: {result.get('status')}"


def _claim(path: Path, here: Host | None, name: str) -> str:
    """Take the trial for this host; '' when taken, else the live host that holds it already (a
    message delivered twice, or a stale one from an earlier run of the command, never measures
    a trial twice at once). A claim by a host that stopped reporting is taken over."""
    mine = {"host_id": str(here.id) if here else None, "host": name, "pid": os.getpid()}
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        claim = _read(path) or {}
        other = Host.objects.filter(id=claim["host_id"]).first() if claim.get("host_id") else None
        if other is not None and (here is None or other.id != here.id) and selectors.host_is_live(other):
            return other.name
        _write(path, mine)
        return ""
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(mine))
    return ""


# --- in the command (the executor run_trials calls) ---------------------------------------------


class PoolExecutor:
    """Runs the command's trials on the pool's hosts (tuning.search.job.TrialExecutor)."""

    def __init__(self, pool: Pool, *, poll_s: float = 1.0, log: Callable[[str], None] | None = None) -> None:
        self.pool, self.poll_s, self.log = pool, poll_s, log

    def _live(self) -> Any:
        return selectors.hosts_live(pool=self.pool)

    def capacity(self) -> int:
        """The pool's idle live hosts (at least 1: a trial waits in the queue for a busy one)."""
        live = self._live()
        if not live.exists():
            raise PoolUnavailable(selectors.pool_waiting_reason(pool=self.pool))
        return max(1, live.filter(current_task="").count())

    def run_batch(
        self,
        prepared: Prepared,
        history: Sequence[TrialRecord],
        batch: Sequence[tuple[int, PlannedTrial]],
        work_dir: Path,
    ) -> list[dict[str, Any]]:
        from portal.pools.tasks import cli_trial_run as task

        for number, planned in batch:
            folder = work_dir / f"trial-{number}"
            folder.mkdir(parents=True, exist_ok=True)
            # A trial left unfinished by an earlier run of the command is measured afresh.
            for stale in (RESULT, CLAIM):
                (folder / stale).unlink(missing_ok=True)
            _write(folder / PLANNED, asdict(planned))
            try:
                task.apply_async(kwargs={"work_dir": str(work_dir), "number": number, "pool": self.pool.name})
            except (BrokerError, OSError) as exc:
                raise PoolUnavailable(
                    f"the task queue (CELERY_BROKER_URL) did not take trial {number}: {exc}"
                ) from exc
        results: dict[int, dict[str, Any]] = {}
        said: set[int] = set()
        while len(results) < len(batch):
            for number, planned in batch:
                if number in results:
                    continue
                folder = work_dir / f"trial-{number}"
                result = _read(folder / RESULT)
                if result is not None:
                    results[number] = result
                    continue
                claim = _read(folder / CLAIM)
                if claim and number not in said and self.log:
                    said.add(number)
                    self.log(f"  trial {number}: measuring on host {claim.get('host')}")
                # No host id: no host (filtering on id=None matched nothing either).
                host_id = claim.get("host_id") if claim else None
                host = Host.objects.filter(id=host_id).first() if host_id is not None else None
                if host is not None and not selectors.host_is_live(host):
                    # Its agent died (or was stopped) with the trial: failed, the host named.
                    results[number] = {
                        **_failed(
                            planned,
                            prepared,
                            f"host {host.name} of pool {self.pool.name} stopped reporting while it "
                            f"measured this trial ({selectors.host_health(host)})",
                        ),
                        "host": selectors.host_summary(host),
                    }
                    _write(folder / RESULT, results[number])
            if len(results) < len(batch):
                if not self._live().exists():
                    raise PoolUnavailable(selectors.pool_waiting_reason(pool=self.pool))
                time.sleep(self.poll_s)
        return [results[number] for number, _ in batch]
