"""The dashboard's first-steps checklist, read from what the organization has actually done.

Nothing is stored: each step is done when the rows that prove it exist (a sample, a profile, a
finished job, an endpoint), so the list can never disagree with the rest of the portal. It sits
above the traffic, jobs and endpoints apps (it reads all three) and nothing imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from django.urls import reverse

from portal.accounts.models import Organization
from portal.endpoints.models import Endpoint
from portal.jobs.models import TuningJob
from portal.jobs.selectors import served_model_list, tuning_job_list
from portal.traffic.models import TrafficSample
from portal.traffic.selectors import traffic_sample_list

State = Literal["done", "working", "failed", "todo"]


@dataclass(frozen=True)
class OnboardingStep:
    key: str  # stable id, used as the list item's id on the page
    title: str
    state: State
    detail: str  # one sentence: what was done, or what this step is for
    url: str  # where to go next for this step
    action: str  # the link's words ("Upload a sample", "See the profile")


@dataclass(frozen=True)
class OnboardingChecklist:
    steps: tuple[OnboardingStep, ...]

    @property
    def done_count(self) -> int:
        return sum(step.state == "done" for step in self.steps)

    @property
    def complete(self) -> bool:
        return self.done_count == len(self.steps)

    @property
    def next_step(self) -> OnboardingStep | None:
        return next((step for step in self.steps if step.state != "done"), None)


def _sample_steps(organization: Organization) -> tuple[OnboardingStep, OnboardingStep]:
    samples = traffic_sample_list(organization=organization).order_by("-created_at")
    latest = samples.first()
    upload_url = reverse("traffic:list") + "#upload-form"
    if latest is None:
        uploaded = OnboardingStep(
            "sample-uploaded",
            "Upload a traffic sample",
            "todo",
            "A log of your real requests (JSONL or CSV, gzip is fine): the tuning replays its shape.",
            upload_url,
            "Upload a sample",
        )
        profiled = OnboardingStep(
            "sample-ready",
            "Sample profiled",
            "todo",
            "Tailguard reads the sample: prompt and output lengths, arrival rate, prefix reuse.",
            reverse("traffic:list"),
            "Traffic samples",
        )
        return uploaded, profiled
    uploaded = OnboardingStep(
        "sample-uploaded",
        "Upload a traffic sample",
        "done",
        f"Uploaded “{latest.name}”.",
        reverse("traffic:detail", args=[latest.id]),
        "Open it",
    )
    ready = samples.filter(status=TrafficSample.Status.READY).first()
    if ready is not None:
        profiled = OnboardingStep(
            "sample-ready",
            "Sample profiled",
            "done",
            f"“{ready.name}” is ready to tune against.",
            reverse("traffic:detail", args=[ready.id]),
            "See its profile",
        )
    elif samples.filter(status__in=[TrafficSample.Status.QUEUED, TrafficSample.Status.VALIDATING]).exists():
        profiled = OnboardingStep(
            "sample-ready",
            "Sample profiled",
            "working",
            f"Reading “{latest.name}”: this usually takes under a minute.",
            reverse("traffic:detail", args=[latest.id]),
            "Watch its progress",
        )
    else:
        profiled = OnboardingStep(
            "sample-ready",
            "Sample profiled",
            "failed",
            f"“{latest.name}” could not be read; the sample page says which line and why.",
            reverse("traffic:detail", args=[latest.id]),
            "See the error",
        )
    return uploaded, profiled


def _model_step(organization: Organization) -> OnboardingStep:
    model = served_model_list(organization=organization).first()
    url = reverse("jobs:list") + "#model-form"
    if model is None:
        return OnboardingStep(
            "model",
            "Register a model",
            "todo",
            "The model to serve: an administrator registers its directory on the serving host.",
            url,
            "Register a model",
        )
    return OnboardingStep(
        "model", "Register a model", "done", f"“{model.name}” is registered.", url, "Models"
    )


def _job_step(organization: Organization) -> tuple[OnboardingStep, TuningJob | None]:
    jobs = tuning_job_list(organization=organization).order_by("-created_at")
    succeeded = jobs.filter(status=TuningJob.Status.SUCCEEDED).first()
    title = "Run a tuning job against your SLO"
    if succeeded is not None:
        step = OnboardingStep(
            "job",
            title,
            "done",
            f"“{succeeded.name}” finished.",
            reverse("jobs:detail", args=[succeeded.id]),
            "See the result",
        )
        return step, succeeded
    active = jobs.exclude(status__in=TuningJob.TERMINAL).first()
    if active is not None:
        return OnboardingStep(
            "job",
            title,
            "working",
            f"“{active.name}” is running: its page shows the phase and each trial as it ends.",
            reverse("jobs:detail", args=[active.id]),
            "Follow the job",
        ), None
    latest = jobs.first()
    if latest is not None:
        return OnboardingStep(
            "job",
            title,
            "failed",
            f"“{latest.name}” did not finish ({latest.get_status_display().lower()}); its page says why.",
            reverse("jobs:detail", args=[latest.id]),
            "See why",
        ), None
    return OnboardingStep(
        "job",
        title,
        "todo",
        "State the latency you need (p50/p95 time to first token at peak); each candidate runs live "
        "on the engine with your traffic and must pass the correctness gate.",
        reverse("jobs:list") + "#job-form",
        "Start a job",
    ), None


def _endpoint_step(organization: Organization, finished_job: TuningJob | None) -> OnboardingStep:
    endpoints = Endpoint.objects.filter(organization=organization).order_by("-created_at")
    title = "Deploy the winner"
    serving = endpoints.exclude(status=Endpoint.Status.FAILED).first()
    if serving is not None:
        if serving.status == Endpoint.Status.STARTING:
            state: State = "working"
            detail = f"“{serving.name}” is starting."
        else:
            state = "done"
            detail = f"“{serving.name}” was deployed ({serving.get_status_display().lower()})."
        return OnboardingStep(
            "endpoint",
            title,
            state,
            detail,
            reverse("endpoints:detail", args=[serving.id]),
            "Open the endpoint",
        )
    failed = endpoints.first()
    if failed is not None:
        return OnboardingStep(
            "endpoint",
            title,
            "failed",
            f"“{failed.name}” failed to start; its page has the engine's last error.",
            reverse("endpoints:detail", args=[failed.id]),
            "See why",
        )
    if finished_job is not None:
        return OnboardingStep(
            "endpoint",
            title,
            "todo",
            "A dedicated endpoint serving the chosen configuration, with its own key and SLA tracking.",
            reverse("jobs:detail", args=[finished_job.id]) + "#deploy-form",
            "Deploy it",
        )
    return OnboardingStep(
        "endpoint",
        title,
        "todo",
        "Once a job has finished, deploy its winner as a dedicated endpoint.",
        reverse("endpoints:list"),
        "Endpoints",
    )


def onboarding_checklist(*, organization: Organization) -> OnboardingChecklist:
    """Organization → sample → profile → model → job (with the SLO) → endpoint."""
    organization_step = OnboardingStep(
        "organization",
        "Create your organization",
        "done",
        f"“{organization.name}” is set up.",
        reverse("accounts:members"),
        "Invite your team",
    )
    uploaded, profiled = _sample_steps(organization)
    job, finished_job = _job_step(organization)
    return OnboardingChecklist(
        steps=(
            organization_step,
            uploaded,
            profiled,
            _model_step(organization),
            job,
            _endpoint_step(organization, finished_job),
        )
    )
