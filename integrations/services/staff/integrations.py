"""Write paths for integrations (where the broker's systems are reached) and their secrets.

Each is one transaction with its ledger event; the Webhook Secret is returned to the caller
(to show once) and never written to the ledger::

    created = webhook_integration_create(broker=broker, name="Acme CRM",
                                         url="https://crm.acme.example/drop", actor="cli:ann")
    created.integration.uuid, created.webhook_secret      # shown once
    integration_secret_rotate(integration=created.integration, actor=...)  # old one: 24 h

Disabling pauses the integration: it stays a deletion target, its requests (those matched
meanwhile included) wait, and enabling it again queues them. Retiring ends it for good::

    integration_retire(integration=integration, reason="CRM decommissioned", actor="cli:ann")
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, models, transaction
from django.db.models.functions import Now
from django.utils import timezone

from integrations import enqueue
from integrations.dispatch import signing, webhook
from integrations.dispatch.transport import Message, answer_kept
from integrations.drop.calendar import drop_time_text
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
from integrations.services.cycle.requests import (
    cancelled_requests_wait_for_target,
    pending_requests_target,
)
from integrations.services.cycle.work_items import work_items_settle_by_id
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock
from integrations.services.row_updates import Audited, row_update
from integrations.validators import (
    column_fits,
    disabled_reason_validate,
    integration_name_validate,
    target_url_validate,
)

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


def integration_updated(integration: Integration, actor: str) -> Audited:
    """The one ledger shape of an integration's changed settings, whatever its kind."""
    return Audited(
        LedgerKind.INTEGRATION_UPDATED,
        broker_id=integration.broker.broker_id,
        subject=str(integration.uuid),
        actor=actor,
    )


def integration_update(
    *, integration: Integration, actor: str, name: str | None = None, url: str | None = None
) -> Integration:
    """Rename it or point it elsewhere; the ledger records what changed."""
    changes: dict[str, str] = {}
    if name is not None:
        changes["name"] = integration_name_validate(name)
    if url is not None and integration.kind == IntegrationKind.WEBHOOK:
        changes["url"] = target_url_validate(url)
    return row_update(integration, changes=changes, audit=integration_updated(integration, actor))


def secret_rotation_state(integration: Integration) -> str:
    """Which secret rotation a page that offers to regenerate the Webhook Secret showed:
    when the previous secret expires ("" if none), which every rotation changes. Not
    derived from a secret."""
    expires = integration.previous_secret_expires_at
    return expires.isoformat() if expires else ""


def integration_secret_rotate(
    *,
    integration: Integration,
    actor: str,
    now: dt.datetime | None = None,
    shown_rotation_state: str | None = None,
) -> str:
    """A new Webhook Secret; the current one stays valid for callbacks for 24 hours.

    ``shown_rotation_state`` (``secret_rotation_state`` as the page showed it): when the
    secret was regenerated since (the same button pressed twice, say), the secret the broker
    holds is the previous one, not the one that rotation showed nobody: that one is replaced
    and the previous one keeps its 24 hours, rather than ending at once.

    Raises ValidationError, nothing written, when it is retired: retired is final."""
    now = now or timezone.now()
    secret = signing.generate_webhook_secret()
    with transaction.atomic():
        locked = _locked(integration)
        _refuse_retired(locked)
        regenerated_since = (
            shown_rotation_state is not None
            and secret_rotation_state(locked) != shown_rotation_state
            and _previous_secret_valid(locked, now)
        )
        if not regenerated_since:
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
            data={
                "previous_secret_valid_until": locked.previous_secret_expires_at.isoformat(),
                # The secret of the rotation before, shown to no one (or to another member of
                # staff), is the one replaced: the broker's stays previous.
                "replaced_unused_secret": regenerated_since,
            },
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
    if _previous_secret_valid(integration, now or timezone.now()):
        secrets.append(integration.previous_webhook_secret)
    return secrets


def _previous_secret_valid(integration: Integration, now: dt.datetime) -> bool:
    expires = integration.previous_secret_expires_at
    return bool(integration.previous_webhook_secret) and expires is not None and now < expires


def integration_disable(*, integration: Integration, reason: str, actor: str) -> Integration:
    """Stop delivering to it; queued deliveries wait (``integration_enable`` resumes them).

    It stays a deletion target: matches made while it is disabled get their requests, which
    wait too, and their work items owe a status until it answers (or is retired)."""
    reason = disabled_reason_validate(reason, Integration)
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
    # Already enabled: nothing waits for it, so no lock (a delivery batch meanwhile skips the
    # requests this would hold, and nothing would queue them again).
    if Integration.objects.filter(pk=integration.pk, enabled=True).exists():
        return 0
    with transaction.atomic():
        # pending_requests_target below takes it: first, before any row (``matching_lock``).
        matching_lock(broker=integration.broker)
        waiting = models.Q(integration=integration.pk, state=RequestState.QUEUED) & (
            models.Q(next_attempt_at__isnull=True) | models.Q(next_attempt_at__lte=Now())
        )
        # The requests before the integration, as retiring takes them (``_requests_locked``).
        deletion_ids, resolution_ids = _requests_locked(waiting)
        locked = _locked(integration)
        if locked.enabled:
            # Enabled meanwhile (staff at once): its job may have run while these rows were
            # held here and skipped them. Queue them again; a second job finds them delivered
            # or not due, the delivery loop's row locks and states send each once.
            _requeue(deletion_ids, resolution_ids)
            return 0
        _refuse_retired(locked)
        locked.enabled = True
        reason, locked.disabled_reason = locked.disabled_reason, ""
        locked.save(update_fields=["enabled", "disabled_reason"])
        # The database's time, as the delivery loop's due check reads it (``redelivery``).
        DeletionRequest.objects.filter(pk__in=deletion_ids).update(next_attempt_at=Now())
        ResolutionRequest.objects.filter(pk__in=resolution_ids).update(next_attempt_at=Now())
        _requeue(deletion_ids, resolution_ids)
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


# Requests not final: a retired target will never answer them.
_OPEN_REQUEST_STATES = (
    RequestState.QUEUED,
    RequestState.DISPATCHED,
    RequestState.FAILED,
    RequestState.UNDELIVERABLE,
)


@dataclass(frozen=True)
class IntegrationRetired:
    integration: Integration
    deletion_requests_cancelled: int
    resolution_requests_cancelled: int
    work_items: int  # the work items of those requests, settled again
    waiting_for_a_target: int  # matches left with no request: one pending request each
    pending_requests_queued: int  # of those, given another target at once


def integration_retire(*, integration: Integration, reason: str, actor: str) -> IntegrationRetired:
    """End the integration for good: no request is made for it any more, and it can never be
    enabled again (add a new one instead). One transaction, one ledger event.

    Its open requests (queued, dispatched, failed, undeliverable: it will never answer them)
    are cancelled with ``reason``; their work items settle on their other requests. A match
    left with no request but cancelled ones gets one waiting for a target (given the targets
    left at once, if any), so its work item stays owed instead of settling as unmatched.
    Serialized with matching: a match made meanwhile either sees it retired or is cancelled
    here. Raises ValidationError (nothing written) without a reason or when already retired.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": "say why the integration is retired (--reason)"})
    column_fits(reason, Integration, "retired_reason", key="reason")
    with transaction.atomic():
        # The matching lock, then its open requests, then it (``matching_lock``).
        matching_lock(broker=integration.broker)
        _requests_locked(models.Q(integration=integration.pk, state__in=_OPEN_REQUEST_STATES))
        locked = _locked(integration)
        if locked.retired_at is not None:
            raise ValidationError(
                f"integration {locked.uuid} ({locked.name}) was already retired on "
                f"{drop_time_text(locked.retired_at)}: {locked.retired_reason}"
            )
        now = timezone.now()
        was_enabled = locked.enabled
        locked.enabled = False
        locked.retired_at = now
        locked.retired_reason = reason
        locked.save(update_fields=["enabled", "retired_at", "retired_reason"])
        cancelled_ids, deletion_items = _requests_cancel(
            "integrations_deletionrequest", locked, reason
        )
        resolution_ids, resolution_items = _requests_cancel(
            "integrations_resolutionrequest", locked, reason
        )
        waiting = cancelled_requests_wait_for_target(cancelled_ids=cancelled_ids)
        targeted = pending_requests_target(broker=locked.broker, actor=actor) if waiting else None
        items = sorted(deletion_items | resolution_items)  # by id (``matching_lock``)
        work_items_settle_by_id(items=items, actor=actor)
        result = IntegrationRetired(
            integration=locked,
            deletion_requests_cancelled=len(cancelled_ids),
            resolution_requests_cancelled=len(resolution_ids),
            work_items=len(items),
            waiting_for_a_target=waiting,
            pending_requests_queued=targeted.deletion_requests_queued if targeted else 0,
        )
        ledger_event_append(
            kind=LedgerKind.INTEGRATION_RETIRED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.uuid),
            actor=actor,
            data={
                "name": locked.name,
                "kind": locked.kind,
                "reason": reason,
                "was_enabled": was_enabled,
                "deletion_requests_cancelled": result.deletion_requests_cancelled,
                "resolution_requests_cancelled": result.resolution_requests_cancelled,
                "work_items": result.work_items,
                "waiting_for_a_target": result.waiting_for_a_target,
                "pending_requests_queued": result.pending_requests_queued,
            },
        )
    return result


def _requests_cancel(
    table: str, integration: Integration, reason: str
) -> tuple[list[int], set[int]]:
    """Cancel the integration's open requests in ``table``; their ids and work item ids."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table}"  # noqa: S608 (one of two table names, never input)
            "   SET state = %(cancelled)s, next_attempt_at = NULL, completed_at = now(),"
            "       last_error = %(reason)s"
            " WHERE integration_id = %(integration)s AND state = ANY(%(open)s)"
            " RETURNING id, work_item_id",
            {
                "cancelled": RequestState.CANCELLED,
                "reason": f"target retired: {reason}",
                "integration": integration.pk,
                "open": list(_OPEN_REQUEST_STATES),
            },
        )
        rows = cursor.fetchall()
    # A canary round's request belongs to no work item: nothing of it to settle.
    items = {item for _, item in rows if item is not None}
    return sorted(request_id for request_id, _ in rows), items


def integration_test_send(*, integration: Integration, actor: str) -> DeliveryResult:
    """POST a signed test notification (topic ``drop.test``) and report the broker's answer,
    as an attempt keeps it (``transport.answer_kept``: a token of the URL's query it quotes
    redacted, identifiers masked): it is shown to staff, and kept in their session's messages.

    Sent even to a disabled integration: checking it is how staff decide to enable it; never
    to a retired one (``ValidationError``).
    """
    if integration.retired_refusal:
        raise ValidationError(integration.retired_refusal)
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
    return answer_kept(Message(address=integration.url, body=body, headers=headers), result)


def _requests_locked(which: models.Q) -> tuple[list[int], list[int]]:
    """The ids of the deletion and of the resolution requests ``which`` selects, locked.

    Taken before their integration's row, in the order a delivery batch takes them: it holds
    its requests and then, answered 410 Gone, disables their integration. A service holding
    the integration while it waited for a batch's requests would deadlock with it.
    """
    return (
        list(
            DeletionRequest.objects.select_for_update()
            .filter(which)
            .order_by("pk")
            .values_list("pk", flat=True)
        ),
        list(
            ResolutionRequest.objects.select_for_update()
            .filter(which)
            .order_by("pk")
            .values_list("pk", flat=True)
        ),
    )


def _requeue(deletion_ids: list[int], resolution_ids: list[int]) -> None:
    if deletion_ids:
        enqueue.deletion_requests_enqueue(deletion_ids)
    if resolution_ids:
        enqueue.resolution_requests_enqueue(resolution_ids)


def _refuse_retired(locked: Integration) -> None:
    """ValidationError when ``locked`` (its row held) is retired: nothing brings it back, not
    enabling it, nor a new secret for it."""
    if locked.retired_at is not None:
        raise ValidationError(
            f"integration {locked.uuid} ({locked.name}) was retired on "
            f"{drop_time_text(locked.retired_at)} ({locked.retired_reason}): retired is final; "
            "add a new integration instead"
        )


def _locked(integration: Integration) -> Integration:
    return (
        Integration.objects.select_for_update(of=("self",))
        .select_related("broker")
        .get(pk=integration.pk)
    )
