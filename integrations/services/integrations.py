"""Write paths for integrations (where the broker's systems are reached) and their secrets.

Each is one transaction with its ledger event; the Webhook Secret is returned to the caller
(to show once) and never written to the ledger::

    created = webhook_integration_create(broker=broker, name="Acme CRM",
                                         url="https://crm.acme.example/drop", actor="cli:ann")
    created.integration.uuid, created.webhook_secret      # shown once
    integration_secret_rotate(integration=created.integration, actor=...)  # old one: 24 h

Disabling holds every queued delivery of the integration; enabling it again queues them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from integrations import enqueue
from integrations.dispatch import signing, webhook
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    DeletionRequest,
    Integration,
    IntegrationKind,
    RequestState,
    ResolutionRequest,
)
from integrations.outbound_http import DeliveryResult, deliver
from integrations.services.ledger import ledger_event_append
from integrations.services.requests import pending_requests_target
from integrations.services.row_updates import row_update
from integrations.validators import integration_name_validate, target_url_validate

PREVIOUS_SECRET_VALIDITY = dt.timedelta(hours=24)


@dataclass(frozen=True)
class CreatedIntegration:
    integration: Integration
    webhook_secret: str  # show it once; it is stored encrypted and never shown again


def webhook_integration_create(
    *, broker: Broker, name: str, url: str, actor: str
) -> CreatedIntegration:
    """A webhook integration with a new Webhook Secret. Raises ValidationError, nothing written.

    Requests matched while the broker had no target (state ``pending``) get their targets
    and are queued for delivery (``pending_requests_target``).
    """

    name = integration_name_validate(name)
    url = target_url_validate(url)
    secret = signing.generate_webhook_secret()
    with transaction.atomic():
        integration = Integration.objects.create(
            broker=broker, kind=IntegrationKind.WEBHOOK, name=name, url=url, webhook_secret=secret
        )
        targeted = pending_requests_target(broker=broker, actor=actor)
        ledger_event_append(
            kind=LedgerKind.INTEGRATION_CREATED,
            broker_id=broker.broker_id,
            subject=str(integration.uuid),
            actor=actor,
            data={
                "kind": integration.kind,
                "name": name,
                "url": url,
                "pending_requests_queued": targeted.deletion_requests_queued,
            },
        )
    return CreatedIntegration(integration=integration, webhook_secret=secret)


def integration_update(
    *, integration: Integration, actor: str, name: str | None = None, url: str | None = None
) -> Integration:
    """Rename it or point it elsewhere; the ledger records what changed."""
    changes: dict[str, str] = {}
    if name is not None:
        changes["name"] = integration_name_validate(name)
    if url is not None and integration.kind == IntegrationKind.WEBHOOK:
        changes["url"] = target_url_validate(url)
    return row_update(
        integration,
        changes=changes,
        kind=LedgerKind.INTEGRATION_UPDATED,
        actor=actor,
        broker_id=lambda row: row.broker.broker_id,
        subject=lambda row: str(row.uuid),
        related=("broker",),
    )


def integration_secret_rotate(
    *, integration: Integration, actor: str, now: dt.datetime | None = None
) -> str:
    """A new Webhook Secret; the current one stays valid for callbacks for 24 hours."""
    now = now or timezone.now()
    secret = signing.generate_webhook_secret()
    with transaction.atomic():
        locked = _locked(integration)
        locked.previous_webhook_secret = locked.webhook_secret
        locked.previous_secret_expires_at = now + PREVIOUS_SECRET_VALIDITY
        locked.webhook_secret = secret
        locked.save(
            update_fields=[
                "webhook_secret",
                "previous_webhook_secret",
                "previous_secret_expires_at",
            ]
        )
        ledger_event_append(
            kind=LedgerKind.INTEGRATION_SECRET_ROTATED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.uuid),
            actor=actor,
            data={"previous_secret_valid_until": locked.previous_secret_expires_at.isoformat()},
        )
    integration.webhook_secret = secret
    integration.previous_webhook_secret = locked.previous_webhook_secret
    integration.previous_secret_expires_at = locked.previous_secret_expires_at
    return secret


def integration_callback_secrets(
    integration: Integration, *, now: dt.datetime | None = None
) -> list[str]:
    """The secrets a callback may be signed with: the current one, and the previous one
    until ``previous_secret_expires_at``."""
    secrets = [integration.webhook_secret]
    expires = integration.previous_secret_expires_at
    if integration.previous_webhook_secret and expires and (now or timezone.now()) < expires:
        secrets.append(integration.previous_webhook_secret)
    return secrets


def integration_disable(*, integration: Integration, reason: str, actor: str) -> Integration:
    """Stop delivering to it; queued deliveries wait (``integration_enable`` resumes them)."""
    reason = (reason or "").strip()[:200] or "disabled by staff"
    with transaction.atomic():
        locked = _locked(integration)
        if not locked.enabled:
            return locked
        locked.enabled = False
        locked.disabled_reason = reason
        locked.save(update_fields=["enabled", "disabled_reason"])
        ledger_event_append(
            kind=LedgerKind.INTEGRATION_DISABLED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.uuid),
            actor=actor,
            data={"name": locked.name, "reason": reason},
        )
    return locked


def integration_enable(*, integration: Integration, actor: str) -> int:
    """Deliver to it again, and queue at once what waited while it was disabled.

    Requests matched while the broker had no target get theirs (``pending_requests_target``).
    Returns how many deletion and resolution requests were queued. Requests whose retry is
    scheduled later keep their own job.
    """
    with transaction.atomic():
        locked = _locked(integration)
        if locked.enabled:
            return 0
        locked.enabled = True
        reason, locked.disabled_reason = locked.disabled_reason, ""
        locked.save(update_fields=["enabled", "disabled_reason"])
        now = timezone.now()
        waiting = models.Q(integration=locked, state=RequestState.QUEUED) & (
            models.Q(next_attempt_at__isnull=True) | models.Q(next_attempt_at__lte=now)
        )
        deletion_ids = list(
            DeletionRequest.objects.filter(waiting).order_by("pk").values_list("pk", flat=True)
        )
        resolution_ids = list(
            ResolutionRequest.objects.filter(waiting).order_by("pk").values_list("pk", flat=True)
        )
        DeletionRequest.objects.filter(pk__in=deletion_ids).update(next_attempt_at=now)
        ResolutionRequest.objects.filter(pk__in=resolution_ids).update(next_attempt_at=now)
        if deletion_ids:
            enqueue.deletion_requests_enqueue(deletion_ids)
        if resolution_ids:
            enqueue.resolution_requests_enqueue(resolution_ids)
        targeted = pending_requests_target(broker=locked.broker, actor=actor)
        ledger_event_append(
            kind=LedgerKind.INTEGRATION_ENABLED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.uuid),
            actor=actor,
            data={
                "name": locked.name,
                "was_disabled_because": reason,
                "deletion_requests_queued": len(deletion_ids),
                "resolution_requests_queued": len(resolution_ids),
                "pending_requests_queued": targeted.deletion_requests_queued,
                "pending_resolution_requests": targeted.resolution_requests,
            },
        )
    return (
        len(deletion_ids)
        + len(resolution_ids)
        + targeted.deletion_requests_queued
        + targeted.resolution_requests
    )


def integration_test_send(*, integration: Integration, actor: str) -> DeliveryResult:
    """POST a signed test notification (topic ``drop.test``) and report the broker's answer.

    Sent even to a disabled integration: checking it is how staff decide to enable it.
    """
    payload = {
        "integration_name": integration.name,
        "integration_kind": integration.kind,
        "webhook_request_id": str(uuid.uuid4()),
        "request_type": "test",
        "topic": "drop.test",
        "integration_id": str(integration.uuid),
        "broker_id": integration.broker.broker_id,
        "mode": integration.broker.mode,
    }
    body = webhook.encode(payload)
    headers = webhook.webhook_headers(
        integration.webhook_secret, body, webhook_request_id=payload["webhook_request_id"]
    )
    result = deliver(
        "POST",
        integration.url,
        body=body,
        headers=headers,
        allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
    )
    ledger_event_append(
        kind=LedgerKind.INTEGRATION_TEST_SENT,
        broker_id=integration.broker.broker_id,
        subject=str(integration.uuid),
        actor=actor,
        data={
            "url": integration.url,
            "status": result.status,
            "error": result.error or "",
            "duration_ms": result.duration_ms,
        },
    )
    return result


def _locked(integration: Integration) -> Integration:
    return (
        Integration.objects.select_for_update(of=("self",))
        .select_related("broker")
        .get(pk=integration.pk)
    )
