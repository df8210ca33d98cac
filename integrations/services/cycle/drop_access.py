"""DROP access: outages of the automated connection, and the notice a long one obliges.

Every pull and every upload tells this module how DROP answered. A failure that is not the
broker's doing (``drop_failure_not_ours``: 5xx, timeouts, stalls, cut bodies, a package
still not ready; never a 401/403) starts an outage, or extends the one under way; the next
call DROP answers, whatever it says, ends it. An outage seen failing more than a day after
it started creates an obligation (11 CCR 7612(b)(1)): download by hand and notify
CalPrivacy in writing, through the DROP account, within 45 days of the failure. It stays
open, alerted and on the dashboard, until staff record the notice::

    drop_access_record(broker=broker, actor=actor, error=exc)   # a pull or upload failed
    drop_access_record(broker=broker, actor=actor)              # DROP answered it
    drop_access_notice_record(broker=broker, sent_on=day, reference="DROP msg 1182",
                              actor="staff:alice")
"""

from __future__ import annotations

import datetime as dt

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from integrations.drop.calendar import drop_date, drop_today
from integrations.drop.errors import DropApiError, DropAuthError, DropPending, DropUnavailable
from integrations.enqueue import alerts_evaluate_enqueue
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropAccessObligation, DropOutage
from integrations.services.ledger import ledger_event_append
from integrations.validators import column_fits

# The regulation's figures: an outage longer than this obliges a notice within NOTICE_DAYS.
OUTAGE_OBLIGES_AFTER = dt.timedelta(days=1)
NOTICE_DAYS = 45


def drop_failure_not_ours(error: BaseException) -> bool:
    """Whether ``error`` is the automated connection failing through no doing of the
    broker's: DROP or the network failing past the client's retries (5xx, timeouts, stalls,
    cut bodies, throttling), or a package DROP still had not prepared. A refused key or
    account (401/403), a request DROP refused, a local failure (no key, a full disk) is not."""
    if isinstance(error, DropAuthError):
        return False
    if isinstance(error, DropUnavailable | DropPending):
        return True
    return isinstance(error, DropApiError) and error.status is not None and error.status >= 500


def drop_answered(error: BaseException) -> bool:
    """Whether DROP answered the call that raised ``error`` (a 401, a 409...): it is up."""
    return (
        isinstance(error, DropApiError)
        and error.status is not None
        and not drop_failure_not_ours(error)
    )


def drop_access_record(*, broker: Broker, actor: str, error: BaseException | None = None) -> None:
    """What one pull or upload says of the connection: DROP answered (no ``error``, or one
    DROP answered with) and an outage ends; it failed through no doing of the broker's and
    one starts or goes on; anything else (no key, a full disk) says nothing of DROP."""
    if error is None or drop_answered(error):
        drop_access_answered(broker=broker, actor=actor)
    elif drop_failure_not_ours(error):
        drop_access_failed(broker=broker, error=error, actor=actor)


def drop_access_failed(
    *, broker: Broker, error: BaseException, actor: str, now: dt.datetime | None = None
) -> DropOutage:
    """Record a failed call of ``broker`` to DROP (``drop_failure_not_ours``): the start of
    an outage, or one more failure of the one under way; the obligation once it has lasted
    more than a day."""
    now = now or timezone.now()
    message = str(error)
    with transaction.atomic():
        Broker.objects.select_for_update().filter(pk=broker.pk).first()  # one writer a broker
        outage = DropOutage.objects.ongoing().filter(broker=broker).first()
        if outage is None:
            outage = DropOutage.objects.create(
                broker=broker, started_at=now, last_failure_at=now, last_error=message
            )
            ledger_event_append(
                kind=LedgerKind.DROP_OUTAGE_STARTED,
                broker_id=broker.broker_id,
                subject=broker.broker_id,
                actor=actor,
                data={"outage": outage.pk, "started_at": now.isoformat(), "error": message},
            )
        else:
            outage.failures += 1
            outage.last_failure_at = max(now, outage.last_failure_at)
            outage.last_error = message
            outage.save(update_fields=["failures", "last_failure_at", "last_error"])
        if outage.last_failure_at - outage.started_at > OUTAGE_OBLIGES_AFTER:
            _obligation_create(outage, actor=actor)
    return outage


def _obligation_create(outage: DropOutage, *, actor: str) -> None:
    if DropAccessObligation.objects.filter(outage=outage).exists():
        return
    obligation = DropAccessObligation.objects.create(
        broker=outage.broker,
        outage=outage,
        failure_started_at=outage.started_at,
        due_date=drop_date(outage.started_at) + dt.timedelta(days=NOTICE_DAYS),
    )
    ledger_event_append(
        kind=LedgerKind.DROP_ACCESS_OBLIGATION_CREATED,
        broker_id=outage.broker.broker_id,
        subject=outage.broker.broker_id,
        actor=actor,
        data={
            "obligation": obligation.pk,
            "outage": outage.pk,
            "failure_started_at": outage.started_at.isoformat(),
            "last_failure_at": outage.last_failure_at.isoformat(),
            "failures": outage.failures,
            "due_date": obligation.due_date.isoformat(),
            "error": outage.last_error,
        },
    )
    alerts_evaluate_enqueue()  # staff hear of it now, not at the next periodic evaluation


def drop_access_answered(
    *, broker: Broker, actor: str, now: dt.datetime | None = None
) -> DropOutage | None:
    """DROP answered a call of ``broker``'s: the outage under way, if any, ends (returned).
    Its obligation, if it has one, stays until the notice is recorded."""
    if not DropOutage.objects.ongoing().filter(broker=broker).exists():
        return None  # the usual case: nothing to write
    now = now or timezone.now()
    with transaction.atomic():
        Broker.objects.select_for_update().filter(pk=broker.pk).first()
        outage = DropOutage.objects.ongoing().filter(broker=broker).first()
        if outage is None:
            return None
        outage.ended_at = now
        outage.save(update_fields=["ended_at"])
        ledger_event_append(
            kind=LedgerKind.DROP_OUTAGE_ENDED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={
                "outage": outage.pk,
                "started_at": outage.started_at.isoformat(),
                "last_failure_at": outage.last_failure_at.isoformat(),
                "ended_at": now.isoformat(),
                "failures": outage.failures,
                "obligation": DropAccessObligation.objects.filter(outage=outage)
                .values_list("pk", flat=True)
                .first(),
            },
        )
    return outage


def drop_access_notice_record(
    *,
    broker: Broker,
    sent_on: dt.date,
    reference: str,
    actor: str,
    obligations: list[int] | None = None,
) -> list[DropAccessObligation]:
    """Record the written notice to CalPrivacy on ``broker``'s obligations awaiting one
    (those of ``obligations``, by pk, when given): one ledger event each. Raises
    ``ValidationError`` when none awaits a notice, the reference is empty or the day is in
    the future."""
    reference = reference.strip()
    if not reference:
        raise ValidationError("the notice's reference is required (DROP's message number, ...)")
    column_fits(reference, DropAccessObligation, "notice_reference", key="reference")
    if sent_on > drop_today():
        raise ValidationError(f"the notice cannot have been sent on {sent_on}, a future day")
    now = timezone.now()
    with transaction.atomic():
        waiting = DropAccessObligation.objects.select_for_update().awaiting_notice()
        waiting = waiting.filter(broker=broker)
        if obligations is not None:
            waiting = waiting.filter(pk__in=obligations)
        found = list(waiting.order_by("pk"))
        if not found:
            raise ValidationError(
                f"broker {broker.broker_id} has no DROP access obligation awaiting a notice"
            )
        for obligation in found:
            if sent_on < drop_date(obligation.failure_started_at):
                raise ValidationError(
                    f"the notice cannot have been sent on {sent_on}, before the failure it "
                    f"reports ({drop_date(obligation.failure_started_at)})"
                )
            obligation.notice_sent_on = sent_on
            obligation.notice_reference = reference
            obligation.notice_recorded_by = actor
            obligation.notice_recorded_at = now
            obligation.save(
                update_fields=[
                    "notice_sent_on",
                    "notice_reference",
                    "notice_recorded_by",
                    "notice_recorded_at",
                ]
            )
            ledger_event_append(
                kind=LedgerKind.DROP_ACCESS_NOTICE_RECORDED,
                broker_id=broker.broker_id,
                subject=broker.broker_id,
                actor=actor,
                data={
                    "obligation": obligation.pk,
                    "failure_started_at": obligation.failure_started_at.isoformat(),
                    "due_date": obligation.due_date.isoformat(),
                    "sent_on": sent_on.isoformat(),
                    "late": sent_on > obligation.due_date,
                    "reference": reference,
                },
            )
        alerts_evaluate_enqueue()  # its alert clears now
    return found
