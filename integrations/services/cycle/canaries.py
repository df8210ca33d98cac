"""Canaries: staff name them, and every round tests the broker's deletion system with them.

A canary is a consumer the broker keeps in its systems only for testing, named by its
``remote_identifier`` (it must be registered for that broker). Each imported DROP cycle (the
import calls ``canary_round_send`` in its transaction) and ``drop canary`` at once send a
round: each canary a deletion request to every deletion target, with ``drop_session_id``
"0". Only ``deleted`` within ``DROPPORTAL_CANARY_HOURS`` passes (``selectors.canaries``
judges a round; the ``canary_failed`` alert tells staff)::

    canary_add(broker=broker, remote_identifier="TEST-0001", actor="cli:alice")
    canary_round = canary_round_send(broker=broker, actor="cli:alice")   # None: no canary
    canary_remove(broker=broker, remote_identifier="TEST-0001", actor="cli:alice")

A round is not a DROP cycle (``models.canaries``): nothing of it is reported to DROP or
counted in DROP's figures.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from integrations.drop.calendar import drop_date
from integrations.ledger_kinds import LedgerKind
from integrations.models import CANARY_SESSION_ID, Broker, Canary, CanaryRound, Consumer, DropCycle
from integrations.services.cycle.requests import canary_requests_create
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock


def canary_add(*, broker: Broker, remote_identifier: str, actor: str) -> Canary:
    """Name the broker's consumer ``remote_identifier`` a canary. A ValidationError (nothing
    written) when no such consumer is registered for the broker, or it is a canary already."""
    if not Consumer.objects.filter(broker=broker, remote_identifier=remote_identifier).exists():
        raise ValidationError(
            f"broker {broker.broker_id} has no consumer registered as {remote_identifier!r}: "
            "a canary is a consumer the broker registered (with its remote_identifier)"
        )
    with transaction.atomic():
        canary, created = Canary.objects.get_or_create(
            broker=broker, remote_identifier=remote_identifier, defaults={"added_by": actor}
        )
        if not created:
            raise ValidationError(
                f"{remote_identifier!r} is a canary of broker {broker.broker_id} already"
            )
        ledger_event_append(
            kind=LedgerKind.CANARY_ADDED,
            broker_id=broker.broker_id,
            subject=remote_identifier,
            actor=actor,
            data={"remote_identifier": remote_identifier},
        )
    return canary


def canary_remove(*, broker: Broker, remote_identifier: str, actor: str) -> None:
    """``remote_identifier`` is no longer a canary of ``broker`` (its consumer stays
    registered, its rounds stay recorded). A ValidationError when it is not one."""
    with transaction.atomic():
        deleted, _ = Canary.objects.filter(
            broker=broker, remote_identifier=remote_identifier
        ).delete()
        if not deleted:
            raise ValidationError(
                f"{remote_identifier!r} is not a canary of broker {broker.broker_id}"
            )
        ledger_event_append(
            kind=LedgerKind.CANARY_REMOVED,
            broker_id=broker.broker_id,
            subject=remote_identifier,
            actor=actor,
            data={"remote_identifier": remote_identifier},
        )


def canary_round_send(
    *,
    broker: Broker,
    actor: str,
    cycle: DropCycle | None = None,
    now: dt.datetime | None = None,
) -> CanaryRound | None:
    """Send a canary round of ``broker`` now (after ``cycle``'s import, or by hand): each
    canary a deletion request to every target, with its ledger event, in one transaction.
    None when the broker has no canary. A canary whose consumer is no longer registered is
    named in the round's ``missing`` (the round fails), as is a round with no target."""
    names = sorted(Canary.objects.filter(broker=broker).values_list("remote_identifier", flat=True))
    if not names:
        return None
    now = now or timezone.now()
    with transaction.atomic():
        # Its requests name targets: taken as matching does, first (``matching_lock``), so a
        # target retired meanwhile is either seen retired or has this round's request
        # cancelled by its retirement. An import's round holds it already.
        matching_lock(broker=broker)
        canary_round = CanaryRound.objects.create(
            broker=broker,
            cycle=cycle,
            started_at=now,
            answer_by=now + dt.timedelta(hours=settings.DROPPORTAL_CANARY_HOURS),
            actor=actor,
        )
        created = canary_requests_create(
            broker=broker,
            canary_round_id=canary_round.pk,
            remote_identifiers=names,
            session_id=CANARY_SESSION_ID,
            match_date=drop_date(now),
        )
        canary_round.canaries = created.canaries
        canary_round.missing = created.missing
        canary_round.targets = created.targets
        canary_round.save(update_fields=["canaries", "missing", "targets"])
        ledger_event_append(
            kind=LedgerKind.CANARY_ROUND_SENT,
            broker_id=broker.broker_id,
            subject=str(canary_round.pk),
            actor=actor,
            data={
                "canary_round": canary_round.pk,
                "drop_session_id": CANARY_SESSION_ID,
                "cycle": cycle.drop_session_id if cycle is not None else None,
                "canaries": created.canaries,
                "missing": created.missing,
                "targets": created.targets,
                "deletion_requests": created.deletion_requests,
                "answer_by": canary_round.answer_by.isoformat(),
            },
        )
    return canary_round
