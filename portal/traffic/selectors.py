from __future__ import annotations

from django.db.models import QuerySet

from portal.accounts.models import Organization
from portal.traffic.models import TrafficSample


def traffic_sample_list(*, organization: Organization) -> QuerySet[TrafficSample]:
    return TrafficSample.objects.filter(organization=organization).defer("charts")
