"""Registered models, tuning jobs and their trials. Every trial is persisted as it finishes."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal

from django.conf import settings
from django.db import models

from portal.leases import Leased
from portal.outbox.selectors import outbox_waiting
from tuning.search.job import JobSpec
from tuning.search.slo import SLOParseError, SLOTarget, parse_slo

# The sections of a finished job's report that the portal reads (TuningJob.report_section).
ReportSection = Literal["selection", "confirmation", "caps", "golden_set", "baselines"]


# The task outbox's keys of a job's messages (portal.outbox.selectors): one per step owed, and
# one per time a trial of a batch is sent to its pool.
def step_key_prefix(job_id: object) -> str:
    return f"tuning_job.step:{job_id}:"


def trial_key_prefix(trial_id: object) -> str:
    return f"tuning_trial.run:{trial_id}:"


class ServedModel(models.Model):
    """A model directory on the serving host that this organization may tune and deploy."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, related_name="served_models"
    )
    name = models.CharField(max_length=120)
    path = models.CharField(max_length=500)
    architecture = models.CharField(max_length=120, blank=True)
    num_params = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["organization", "name"], name="served_model_name_unique")
        ]

    def __str__(self) -> str:
        return self.name


class TuningJob(Leased):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Finished"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    class Dispatch(models.TextChoices):
        # A step is owed: its message is in the task outbox (portal.outbox), waiting for the
        # broker or sent to it, and no step has claimed the job yet.
        PENDING = "pending", "Step owed"
        TAKEN = "taken", "Taken by a worker"
        # A batch of its trials is out on the pool's hosts (one per host, each a task with its
        # own lease); the last of them to finish owes the job's next step.
        TRIALS = "trials", "Trials out on the pool's hosts"

    TERMINAL: ClassVar[set[str]] = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "accounts.Organization", on_delete=models.CASCADE, related_name="tuning_jobs"
    )
    name = models.CharField(max_length=120)
    traffic_sample = models.ForeignKey(
        "traffic.TrafficSample", on_delete=models.PROTECT, related_name="tuning_jobs"
    )
    served_model = models.ForeignKey(ServedModel, on_delete=models.PROTECT, related_name="tuning_jobs")
    # The hardware pool whose hosts run the trials (their agents take the steps from its queue);
    # empty: this deployment's own workers run them (the embedded setup).
    pool = models.ForeignKey(
        "pools.Pool", null=True, blank=True, on_delete=models.PROTECT, related_name="tuning_jobs"
    )
    # `tuning.search.job.JobSpec.to_dict()`: everything a worker needs to run the job.
    spec = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    # `tuning.search.job.report()`, kept current after each trial and final once the job ends:
    # trials, caps, confirmation, selection, reasons.
    report = models.JSONField(null=True, blank=True)
    winner_trial = models.IntegerField(null=True, blank=True)
    # The worker step that holds the job (`Leased`: its lease owner and heartbeat; another worker
    # takes over only when the heartbeat is older than TUNING_LEASE_S, a killed worker).
    # Whether the job's next step is owed (PENDING: recorded in the task outbox, `portal.outbox`, in
    # the transaction that made it due), taken by a step (TAKEN), or waiting for a batch of trials
    # (TRIALS). `jobs_redispatch` owes a new step where the broker lost its copy or a step died,
    # so a job is never shown as queued or running with nothing to run it.
    dispatch = models.CharField(max_length=16, choices=Dispatch.choices, default=Dispatch.PENDING)
    # Steps that died (worker killed, database lost) since the job's last finished trial; the
    # job fails at TUNING_MAX_INTERRUPTIONS rather than retrying a step that cannot finish.
    interruptions = models.IntegerField(default=0)
    # What the job is doing now, in words ("confirmation round 2 of 3: finalist-1", "waiting for
    # the engine host: ... holds it"): written by the worker as it goes, shown on the job page.
    phase = models.CharField(max_length=300, blank=True)
    # The job's fused-MoE kernel tables (issue 25), tuned for its traffic by the last step when
    # the spec asks for them (`moe_tables: true`): vLLM file name -> table JSON. The note says
    # what the step did or why it tuned none (a dense model, a host without a GPU).
    moe_tables = models.JSONField(default=dict, blank=True)
    moe_tables_note = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]
        indexes: ClassVar = [models.Index(fields=["organization", "-created_at"])]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status not in self.TERMINAL

    @property
    def awaits_broker(self) -> bool:
        """Its next step is owed but the task queue has not taken it yet (it was unreachable)."""
        return (
            self.is_active
            and self.dispatch == self.Dispatch.PENDING
            and outbox_waiting(key_prefix=step_key_prefix(self.id))
        )

    # Typed reads of the spec (issue 22): every reader goes through these, with one default each,
    # instead of `(job.spec or {}).get(...)` and its own fallback.

    @property
    def hardware(self) -> str:
        """The hardware the job tuned for (a catalog name; jobs before pools: "local-cpu")."""
        return str((self.spec or {}).get("hardware") or "local-cpu")

    @property
    def budget_trials(self) -> int:
        return int((self.spec or {}).get("budget_trials") or 0)

    @property
    def slo_text(self) -> str:
        """The SLO as the person wrote it (validated when the job was created)."""
        return str((self.spec or {}).get("slo") or "")

    def job_spec(self) -> JobSpec:
        """The whole spec as the library's dataclass (what the job's steps plan from)."""
        return JobSpec.from_dict(self.spec or {})

    def slo(self) -> SLOTarget:
        """The job's SLO, parsed; SLOParseError only for a spec written by hand or by an older
        release (every job is validated when created)."""
        return parse_slo(self.slo_text)

    def slo_or_none(self) -> SLOTarget | None:
        try:
            return self.slo()
        except SLOParseError:
            return None

    # Typed reads of the finished job's report (`tuning.search.job`'s report, stored whole): one
    # place says which sections exist and that a missing or malformed one reads as None.

    def report_section(self, name: ReportSection) -> dict[str, Any] | None:
        section = (self.report or {}).get(name) if isinstance(self.report, dict) else None
        return section if isinstance(section, dict) else None

    @property
    def selection(self) -> dict[str, Any]:
        """Which trial won and why (`winner`, `reasons`, `outcome`, ...); empty before the end."""
        return self.report_section("selection") or {}


class Trial(Leased):
    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        DONE = "done", "Done"

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(TuningJob, on_delete=models.CASCADE, related_name="trials")
    number = models.IntegerField()
    assignment = models.JSONField()
    label = models.CharField(max_length=300)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    # `TrialResult.to_dict()` (the reference trial's golden answers included).
    result = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Times this trial was started: above 1 when a worker died during it and another re-ran it.
    attempts = models.IntegerField(default=1)
    # The last lines of the trial's engine log, kept current while it runs by the step that
    # measures it (`trial_engine_log_record`: bounded, server paths replaced), so the job page can
    # show them whichever host runs the engine.
    engine_log = models.TextField(blank=True, default="")
    # A trial of a batch measured at once on a pool's hosts (its own task, not the job's step):
    # what to measure (`tuning.search.job.PlannedTrial`, as a dict), the number of the batch's
    # first trial (it is measured against the history before the batch, whichever sibling ends
    # first), the host measuring it, and its own lease, as the job's step has (its task's messages
    # are in the outbox under `trial_key_prefix`).
    planned = models.JSONField(null=True, blank=True)
    batch = models.IntegerField(null=True, blank=True)
    host = models.ForeignKey("pools.Host", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering: ClassVar = ["number"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["job", "number"], name="trial_number_unique")
        ]

    def __str__(self) -> str:
        return f"trial {self.number} of {self.job_id}"
