"""A running job's page says how long it has run, how far its search is and roughly how long the
search has left at its pace so far (issue 24 item 3: no silent waits)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.jobs import selectors
from portal.jobs.models import Trial, TuningJob
from portal.jobs.templatetags.job_format import duration_words
from tests.factories import finished_job

pytestmark = pytest.mark.django_db


def test_durations_read_as_words() -> None:
    assert [duration_words(s) for s in (0, 44.6, 60, 252, 3600, 3900, None)] == [
        "0 s",
        "45 s",
        "1 min",
        "4 min 12 s",
        "1 h",
        "1 h 5 min",
        "",
    ]


def test_a_running_job_shows_elapsed_time_and_the_searchs_estimate(alice, alice_org, alice_client) -> None:  # type: ignore[no-untyped-def]
    now = timezone.now()
    job = finished_job(alice_org, alice)
    job.trials.all().delete()
    job.spec = {**job.spec, "budget_trials": 4, "confirm_repeats": 3}
    job.status, job.started_at, job.finished_at = TuningJob.Status.RUNNING, now - timedelta(minutes=12), None
    job.save()
    url = reverse("jobs:trials", args=[job.id])
    html = alice_client.get(url).content.decode()
    assert "0 of 4 search trials done; an estimate follows the first finished trial" in html

    def trial(number: int, phase: str, minutes: float | None) -> None:
        row = Trial.objects.create(
            organization=alice_org,
            job=job,
            number=number,
            assignment={},
            label=f"t{number}",
            status=Trial.Status.RUNNING if minutes is None else Trial.Status.DONE,
            result={"phase": phase},
        )
        start = now - timedelta(minutes=11 - 3 * number)
        Trial.objects.filter(id=row.id).update(
            started_at=start, finished_at=None if minutes is None else start + timedelta(minutes=minutes)
        )

    trial(0, "reference", 1.0)  # the capture is no search trial
    trial(1, "search", 2.0)
    trial(2, "search", 3.0)
    trial(3, "search", None)  # still running
    progress = selectors.job_progress(job=job, now=now)
    assert progress is not None
    assert (progress["search_done"], progress["per_trial_s"], progress["search_left_s"]) == (2, 150.0, 300.0)
    html = alice_client.get(url).content.decode()
    assert 'id="job-progress"' in html and "Running for 12 min" in html
    assert "2 of 4 search trials done, about 5 min more for the search at 2 min 30 s per trial so far" in html
    assert "(then 3 confirmation rounds)" in html
    job.status = TuningJob.Status.SUCCEEDED
    job.save()
    assert selectors.job_progress(job=job) is None
    assert 'id="job-progress"' not in alice_client.get(reverse("jobs:detail", args=[job.id])).content.decode()
