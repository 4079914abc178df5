"""Writes of alerts: channels, raising an alert (once per episode), and delivering it.

`alert_raise` is called inside the transaction that observed the condition: it stores the alert
and one delivery per subscribed channel there (the outbox), and asks a worker to send them after
the commit. If that request is lost (broker down, worker killed), `alert_deliveries_due` (part of
the one redispatch beat, portal.outbox.recovery, every REDISPATCH_INTERVAL_S) sends whatever is due, so nothing is lost and nothing is sent
twice: a delivery is claimed with a conditional update before it is attempted.

Failed attempts retry with exponential back-off (ALERT_RETRY_BASE_S x 2^n) up to
ALERT_MAX_ATTEMPTS, then the delivery is kept as abandoned with its last error; every attempt is
in the delivery log.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from compliance.services import audit_record
from portal import outbound
from portal.accounts.models import Organization, Role, User
from portal.accounts.services import require_role
from portal.alerts import signing
from portal.alerts.models import Alert, AlertAttempt, AlertChannel, AlertDelivery, AlertKind

logger = logging.getLogger(__name__)

_CLAIM = timedelta(minutes=2)
MAX_CHANNELS_PER_ORGANIZATION = 50
# At most this many deliveries are sent per redispatch run; the rest wait for the next run.
REDISPATCH_BATCH = 200


def _allowed_networks() -> list[outbound.IPNetwork]:
    return outbound.parse_networks(settings.ALERT_WEBHOOK_ALLOWED_NETWORKS)


def webhook_url_problem(url: str, *, require_resolution: bool) -> str | None:
    """Why alerts may not be sent to `url`, as a sentence, or None."""
    url = (url or "").strip()
    problem = _webhook_url_shape_problem(url)
    if problem is not None:
        return problem
    problem = outbound.url_problem(url, allowed=_allowed_networks(), require_resolution=require_resolution)
    return None if problem is None else _internal(problem)


def _internal(problem: str) -> str:
    return (
        f"Alerts are not sent to internal addresses: {problem}. (An operator can allow a "
        "network with ALERT_WEBHOOK_ALLOWED_NETWORKS.)"
    )


def _webhook_url_shape_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in {"https", "http"}:
        return "Use an http:// or https:// URL."
    if not parts.hostname:
        return "The URL has no host name."
    if parts.username or parts.password:
        return "Put no user name or password in the URL; the signature authenticates the alert."
    try:
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError:
        return "The URL's port is not a number from 1 to 65535."
    return None


def _kinds(kinds: list[str]) -> list[str]:
    unknown = sorted(set(kinds) - set(AlertKind.values))
    if unknown:
        raise ValidationError({"kinds": f"Unknown alert kinds: {', '.join(unknown)}."})
    if not kinds:
        raise ValidationError({"kinds": "Choose at least one kind of alert."})
    return [k for k in AlertKind.values if k in set(kinds)]


def _require_manager(
    actor: User, organization: Organization, *, kind: str, target: str, channel: AlertChannel | None = None
) -> None:
    """Owners and admins manage every channel; any member manages their own subscription (an
    e-mail channel to their own address that they made). Else PermissionDenied saying so."""
    membership = require_role(actor=actor, organization=organization, minimum=Role.VIEWER, doing="see alerts")
    if membership.has_role(Role.ADMIN):
        return
    own = kind == AlertChannel.Kind.EMAIL and target.lower() == actor.email.lower()
    if own and (channel is None or channel.created_by_id == actor.pk):
        return
    raise PermissionDenied(
        "Only an owner or admin manages the organization's alert channels; you can subscribe your own "
        f"address ({actor.email}) to the alerts you want."
    )


def alert_channel_create(
    *, actor: User, organization: Organization, kind: str, name: str, target: str, kinds: list[str]
) -> AlertChannel:
    """A new channel. For a webhook the signing secret is generated here and returned on the
    channel (show it once)."""
    name, target = (name or "").strip(), (target or "").strip()
    _require_manager(actor, organization, kind=kind, target=target)
    errors: dict[str, str] = {}
    if not name or len(name) > 100:
        errors["name"] = "Name the channel in 1 to 100 characters."
    if kind == AlertChannel.Kind.EMAIL:
        try:
            validate_email(target)
        except ValidationError:
            errors["target"] = "Enter an email address."
    elif kind == AlertChannel.Kind.WEBHOOK:
        if len(target) > 500:
            errors["target"] = "Use a URL of at most 500 characters."
        elif (problem := webhook_url_problem(target, require_resolution=False)) is not None:
            errors["target"] = problem
    else:
        errors["kind"] = "Choose email or webhook."
    try:
        chosen = _kinds(list(kinds))
    except ValidationError as exc:
        errors.update({k: " ".join(v) for k, v in exc.message_dict.items()})
        chosen = []
    if AlertChannel.objects.filter(organization=organization).count() >= MAX_CHANNELS_PER_ORGANIZATION:
        errors["name"] = f"An organization has at most {MAX_CHANNELS_PER_ORGANIZATION} alert channels."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        channel = AlertChannel.objects.create(
            organization=organization,
            kind=kind,
            name=name,
            target=target,
            secret=signing.new_secret() if kind == AlertChannel.Kind.WEBHOOK else "",
            kinds=chosen,
            created_by=actor,
        )
        audit_record(
            actor=actor,
            organization=organization,
            action="alerts.channel.create",
            target=channel,
            data={"kind": kind, "name": name, "target": target, "kinds": chosen},
        )
    return channel


def alert_channel_update(
    *, actor: User, channel: AlertChannel, kinds: list[str], enabled: bool
) -> AlertChannel:
    """Which alerts the channel receives, and whether it is on."""
    _require_manager(actor, channel.organization, kind=channel.kind, target=channel.target, channel=channel)
    chosen = _kinds(list(kinds))
    with transaction.atomic():
        before = {"kinds": channel.kinds, "enabled": channel.enabled}
        channel.kinds, channel.enabled = chosen, bool(enabled)
        channel.save(update_fields=["kinds", "enabled"])
        audit_record(
            actor=actor,
            organization=channel.organization,
            action="alerts.channel.update",
            target=channel,
            data={"kinds": chosen, "enabled": channel.enabled},
            before=before,
            after={"kinds": chosen, "enabled": channel.enabled},
        )
    return channel


def alert_channel_delete(*, actor: User, channel: AlertChannel) -> None:
    _require_manager(actor, channel.organization, kind=channel.kind, target=channel.target, channel=channel)
    with transaction.atomic():
        audit_record(
            actor=actor,
            organization=channel.organization,
            action="alerts.channel.delete",
            target=channel,
            data={"kind": channel.kind, "name": channel.name},
        )
        channel.delete()


# --- Raising ------------------------------------------------------------------------------------


def alert_raise(
    *,
    organization: Organization | uuid.UUID | str,
    kind: str,
    subject: str,
    summary: str,
    data: dict[str, Any],
) -> Alert | None:
    """Records the alert and its deliveries, once per `subject`; None when it was raised before.
    Call inside the transaction that observed the condition."""
    if kind not in AlertKind.values:
        raise ValueError(f"unknown alert kind {kind!r}")
    organization_id = organization.pk if isinstance(organization, Organization) else organization
    with transaction.atomic():
        try:
            with transaction.atomic():
                alert = Alert.objects.create(
                    organization_id=organization_id,
                    kind=kind,
                    subject=subject[:200],
                    summary=summary[:300],
                    data=data,
                )
        except IntegrityError:
            return None
        now = timezone.now()
        channels = [
            c
            for c in AlertChannel.objects.filter(organization_id=organization_id, enabled=True)
            if kind in c.kinds
        ]
        deliveries = AlertDelivery.objects.bulk_create(
            [
                AlertDelivery(organization_id=organization_id, alert=alert, channel=c, next_attempt_at=now)
                for c in channels
            ]
        )
        audit_record(
            actor=None,
            organization=organization_id,
            action="alerts.raise",
            target=alert,
            data={"kind": kind, "subject": alert.subject, "channels": len(deliveries)},
        )
        ids = [str(d.id) for d in deliveries]
        transaction.on_commit(lambda: _dispatch(ids))
    return alert


def _dispatch(delivery_ids: list[str]) -> None:
    from portal.alerts.tasks import alert_delivery_send

    for delivery_id in delivery_ids:
        try:
            alert_delivery_send.apply_async((delivery_id,), retry=False)
        except Exception:
            # The delivery row is pending: the scheduled redispatch sends it.
            logger.warning("alert delivery %s waits for the redispatch", delivery_id, exc_info=True)


# --- Delivering -----------------------------------------------------------------------------------


def _payload(alert: Alert, delivery: AlertDelivery) -> dict[str, Any]:
    return {
        "id": str(alert.id),
        "delivery": str(delivery.id),
        "type": alert.kind,
        "created": int(alert.created_at.timestamp()),
        "organization": str(alert.organization_id),
        "summary": alert.summary,
        "data": alert.data,
    }


def _send_webhook(channel: AlertChannel, body: bytes, delivery: AlertDelivery) -> int:
    problem = _webhook_url_shape_problem(channel.target)
    if problem is not None:
        raise RuntimeError(problem)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Tailguard-Alerts/1",
        signing.HEADER: signing.sign(secret=channel.secret, body=body, timestamp=int(time.time())),
        "Tailguard-Event": delivery.alert.kind,
        "Tailguard-Delivery": str(delivery.id),
    }
    # The address is checked again at send time (a name may resolve elsewhere now than when it
    # was entered), once: the connection goes to the address checked, so a name that answers
    # differently to the connection (DNS rebinding) gets nowhere. A redirect is not followed
    # (the signed alert goes where it was configured or not at all): it counts as a failure.
    # Streamed and never read: only the status matters, and a receiver's body (of any size) is
    # not ours to download.
    try:
        with outbound.stream(
            "POST",
            channel.target.strip(),
            allowed=_allowed_networks(),
            content=body,
            headers=headers,
            timeout_s=settings.ALERT_WEBHOOK_TIMEOUT_S,
            max_redirects=0,
        ) as response:
            status_code = response.status_code
    except outbound.OutboundUnresolved as exc:
        raise RuntimeError(f"Not sent: {exc}.") from None
    except outbound.OutboundRefused as exc:
        raise RuntimeError(_internal(str(exc))) from None
    if not 200 <= status_code < 300:
        raise _HTTPFailure(status_code)
    return status_code


class _HTTPFailure(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"the receiver answered HTTP {status_code}")
        self.status_code = status_code


def _send_email(channel: AlertChannel, alert: Alert) -> None:
    lines = [alert.summary, ""]
    lines += [f"{key}: {value}" for key, value in sorted(alert.data.items())]
    lines += ["", f"Alert {alert.id} ({alert.kind}) at {alert.created_at:%Y-%m-%d %H:%M:%S} UTC."]
    lines += [f"Change which alerts you receive: {settings.SITE_URL}/alerts/"]
    send_mail(
        subject=f"[Tailguard] {alert.summary}"[:200],
        message="\n".join(lines),
        from_email=None,
        recipient_list=[channel.target],
        fail_silently=False,
    )


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=settings.ALERT_RETRY_BASE_S * 2 ** max(attempts - 1, 0))


def alert_delivery_send(*, delivery_id: uuid.UUID | str, now: datetime | None = None) -> str:
    """One attempt at one delivery. Returns "delivered", "retry", "abandoned" or "busy-or-done"."""
    now = now or timezone.now()
    claimed = (
        AlertDelivery.objects.filter(
            id=delivery_id, status=AlertDelivery.Status.PENDING, next_attempt_at__lte=now
        )
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claimed_until=now + _CLAIM)
    )
    if not claimed:
        return "busy-or-done"
    delivery = AlertDelivery.objects.select_related("alert", "channel").get(id=delivery_id)
    channel, alert = delivery.channel, delivery.alert
    attempts = delivery.attempts + 1
    started = time.monotonic()
    status_code: int | None = None
    error = ""
    try:
        if channel.kind == AlertChannel.Kind.WEBHOOK:
            body = json.dumps(_payload(alert, delivery), sort_keys=True).encode()
            status_code = _send_webhook(channel, body, delivery)
        else:
            _send_email(channel, alert)
    except _HTTPFailure as exc:
        status_code, error = exc.status_code, str(exc)
    except (httpx.HTTPError, OSError, RuntimeError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    duration_ms = (time.monotonic() - started) * 1000
    with transaction.atomic():
        AlertAttempt.objects.create(
            delivery=delivery,
            organization_id=delivery.organization_id,
            ok=not error,
            status_code=status_code,
            error=error,
            duration_ms=duration_ms,
        )
        update: dict[str, Any] = {
            "attempts": attempts,
            "claimed_until": None,
            "last_status_code": status_code,
            "last_error": error,
        }
        if not error:
            update.update(status=AlertDelivery.Status.DELIVERED, delivered_at=timezone.now())
            outcome = "delivered"
        elif attempts >= settings.ALERT_MAX_ATTEMPTS:
            update["status"] = AlertDelivery.Status.ABANDONED
            outcome = "abandoned"
            audit_record(
                actor=None,
                organization=delivery.organization_id,
                action="alerts.delivery.abandoned",
                target=delivery,
                data={"channel": channel.name, "attempts": attempts, "error": error[:300]},
            )
        else:
            update["next_attempt_at"] = now + _backoff(attempts)
            outcome = "retry"
        AlertDelivery.objects.filter(id=delivery.id).update(**update)
    return outcome


def alert_deliveries_due(*, now: datetime | None = None) -> dict[str, int]:
    """The redispatch: every pending delivery that is due, oldest first (at most REDISPATCH_BATCH)."""
    now = now or timezone.now()
    due = (
        AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING, next_attempt_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:REDISPATCH_BATCH]
    )
    outcome: dict[str, int] = {}
    for delivery_id in list(due):
        result = alert_delivery_send(delivery_id=delivery_id, now=now)
        outcome[result] = outcome.get(result, 0) + 1
    return outcome


def alert_delivery_retry(*, actor: User, delivery: AlertDelivery) -> None:
    """Sends an abandoned delivery again (after the receiver was fixed)."""
    require_role(actor=actor, organization=delivery.organization, minimum=Role.ADMIN, doing="resend alerts")
    if delivery.status != AlertDelivery.Status.ABANDONED:
        raise ValidationError("Only a delivery that gave up can be sent again.")
    with transaction.atomic():
        AlertDelivery.objects.filter(id=delivery.id).update(
            status=AlertDelivery.Status.PENDING, attempts=0, next_attempt_at=timezone.now()
        )
        audit_record(
            actor=actor, organization=delivery.organization, action="alerts.delivery.retry", target=delivery
        )
        ids = [str(delivery.id)]
        transaction.on_commit(lambda: _dispatch(ids))
