"""Helpers of the compliance tests (and of portal tests that need a second factor done)."""

from __future__ import annotations

from datetime import timedelta


def s3_keys(settings, region: str) -> list[str]:  # type: ignore[no-untyped-def]
    import boto3

    client = boto3.client(
        "s3",
        region_name=settings.COMPLIANCE_S3_REGION_NAMES[region],
        endpoint_url=settings.COMPLIANCE_S3_ENDPOINT_URL,
    )
    response = client.list_objects_v2(Bucket=settings.COMPLIANCE_S3_BUCKETS[region])
    return [item["Key"] for item in response.get("Contents", [])]


def two_factor_done(client, user) -> None:  # type: ignore[no-untyped-def]
    """Marks the client's session as having verified a code (for tests about other things)."""
    from compliance.middleware import TWO_FACTOR_KEY

    session = client.session
    session[TWO_FACTOR_KEY] = str(user.pk)
    session.save()


def baa_recorded(actor, org) -> None:  # type: ignore[no-untyped-def]
    """A BAA the organization's owner records (signed yesterday, effective today; not
    countersigned): from then on its owners must use a second factor."""
    from django.utils import timezone

    from compliance import services

    today = timezone.now().date()
    services.baa_record_create(
        actor=actor,
        organization=org,
        counterparty="Tailguard Inc.",
        version="v1",
        signed_on=today - timedelta(days=1),
        effective_on=today,
    )
