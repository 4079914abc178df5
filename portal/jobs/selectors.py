from __future__ import annotations

from django.db.models import QuerySet

from portal.accounts.models import Organization
from portal.jobs.models import ServedModel, TuningJob
from portal.traffic.models import TrafficSample


def served_model_list(*, organization: Organization) -> QuerySet[ServedModel]:
    return ServedModel.objects.filter(organization=organization).order_by("name")


def tuning_job_list(*, organization: Organization) -> QuerySet[TuningJob]:
    return TuningJob.objects.filter(organization=organization).select_related(
        "traffic_sample", "served_model"
    )


def ready_samples(*, organization: Organization) -> QuerySet[TrafficSample]:
    return TrafficSample.objects.filter(organization=organization, status=TrafficSample.Status.READY).defer(
        "charts"
    )
