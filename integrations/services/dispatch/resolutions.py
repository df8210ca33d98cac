"""Identifier retrieval answers (docs/contracts.md §2.4) and the SaaS deletions they start.

::

    result = resolution_outcome_record(resolution_request=request, drop_outcome="",
                                       exemption_basis="", identifiers={"email": [...]},
                                       actor="apikey:dpk_…")

Unless the answer is ``opted_out`` or ``exempt``, every SaaS connection of the broker that is
not retired gets one ``SaasDeletion``, delivered as its own job (a disabled connection's
waits until it is enabled). An answer for a work item DROP removed starts none: nothing more
is sent for a removed identifier. The resolved identifiers are kept
verbatim, encrypted, only as long as a SaaS deletion may still need them: once every one of
them is final (``completed`` or ``cancelled``) they are purged.
"""

from __future__ import annotations

import datetime as dt
import json
from functools import partial
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from integrations import enqueue
from integrations.dispatch import masking
from integrations.dispatch.saas import categories_or_default
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    OUTCOME_REFUSING_STATES,
    DropOutcome,
    OptOutRecord,
    RequestState,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle.work_items import work_item_settle
from integrations.services.dispatch.outcomes import (
    OutcomeConflict,
    OutcomeRecorded,
    cancelled_conflict,
    opt_out_recorded_as,
)
from integrations.services.ledger import ledger_event_append
from integrations.wire_fields import OPT_OUT_EMAIL

EXEMPTION_BASIS_MAX = ResolutionRequest._meta.get_field("exemption_basis").max_length or 0
FINAL_SAAS_STATES = (RequestState.COMPLETED, RequestState.CANCELLED)
NOT_DELETED_OUTCOMES = (DropOutcome.OPTED_OUT, DropOutcome.EXEMPT)


def resolution_outcome_record(
    *,
    resolution_request: ResolutionRequest,
    drop_outcome: str,
    exemption_basis: str,
    identifiers: dict[str, Any],
    actor: str,
    opt_out_email: str = "",
    now: dt.datetime | None = None,
) -> OutcomeRecorded:
    """Record the broker's (validated) answer and start the SaaS deletions it calls for.

    ``opt_out_email`` (``identifiers.email[0].email`` of an ``opted_out`` answer) is kept
    verbatim, encrypted, as an ``OptOutRecord``; it never reaches the ledger. The
    ``exemption_basis`` is kept, on the row and in the ledger, with what looks like an
    identifier in it masked (``masking.free_text_masked``). The same answer twice changes
    nothing; a different one is an ``OutcomeConflict``.
    """
    now = now or timezone.now()
    # Masked before anything compares or keeps it: a repeat is judged on what is kept (the
    # row's own UUIDs read only for a text holding a UUID, as for a deletion's outcome).
    exemption_basis = masking.free_text_masked(
        exemption_basis,
        limit=EXEMPTION_BASIS_MAX,
        own_uuids=partial(masking.row_own_uuids, resolution_request),
    )
    request = resolution_request
    uuid_text = str(request.request_uuid)
    with transaction.atomic():
        # Locked in the order retiring a connection and importing a Removed file take them
        # (connections, then the request, then the work item): a connection retired
        # meanwhile gets no deletion, nor does an item DROP removed meanwhile.
        connections = (
            _saas_connections_locked(broker_id=request.broker_id)
            if drop_outcome not in NOT_DELETED_OUTCOMES
            else []
        )
        updated = _resolution_complete(
            request,
            drop_outcome=drop_outcome,
            exemption_basis=exemption_basis,
            identifiers=identifiers,
            keep=bool(connections),  # identifiers are kept only for a SaaS deletion
            now=now,
        )
        # The item locked whatever its state: an import closing it (it holds the lock until
        # it commits) is waited for and its removal read, never read past as still open.
        removed = updated and (
            WorkItem.objects.select_for_update()
            .filter(pk=request.work_item_id)
            .values_list("state", flat=True)
            .get()
            == WorkItemState.REMOVED
        )
        if removed and connections:
            connections = []
            ResolutionRequest.objects.filter(pk=request.pk).update(
                identifiers="", identifiers_purged_at=now
            )
        keep = bool(connections)
        if not updated:
            current = ResolutionRequest.objects.get(pk=request.pk)
            resolution_repeat_check(
                current=current,
                drop_outcome=drop_outcome,
                exemption_basis=exemption_basis,
                identifiers=identifiers,
                opt_out_email=opt_out_email,
            )
            ledger_event_append(
                kind=LedgerKind.RESOLUTION_REQUEST_OUTCOME_REPEATED,
                broker_id=request.broker.broker_id,
                subject=uuid_text,
                actor=actor,
                data={"drop_outcome": drop_outcome},
            )
            return OutcomeRecorded(uuid_text, drop_outcome, current.state, changed=False)
        deletions = SaasDeletion.objects.bulk_create(
            SaasDeletion(
                resolution_id=request.pk,
                saas_connection=target,
                state=RequestState.QUEUED,
                next_attempt_at=Now(),  # the database's time (see ``redelivery``)
            )
            for target in connections
        )
        if deletions:
            enqueue.saas_deletions_enqueue([d.pk for d in deletions])
        if drop_outcome == DropOutcome.OPTED_OUT:
            OptOutRecord.objects.create(
                resolution_request_id=request.pk, broker_id=request.broker_id, email=opt_out_email
            )
        ledger_event_append(
            kind=LedgerKind.RESOLUTION_REQUEST_OUTCOME_RECORDED,
            broker_id=request.broker.broker_id,
            subject=uuid_text,
            actor=actor,
            data={
                "drop_outcome": drop_outcome,
                "exemption_basis": exemption_basis,
                # Categories and counts only: the clear identifiers never reach the ledger,
                # nor a category key the broker made of one.
                "identifiers": masking.category_counts(
                    identifiers,
                    categories=(
                        category
                        for c in connections
                        for category in categories_or_default(c.identifier_categories)
                    ),
                ),
                "saas_deletions": [c.name for c in connections],
                "identifiers_kept": keep,
                # DROP removed the identifier: nothing more is sent for it.
                **({"work_item_removed": True} if removed else {}),
                "opt_out_record": drop_outcome == DropOutcome.OPTED_OUT,
                # A recurring deletion round's: recorded, never settling DROP's status.
                **recurring_marks(request.round),
            },
        )
        work_item_settle(work_item=WorkItem(pk=request.work_item_id))
    return OutcomeRecorded(uuid_text, drop_outcome, RequestState.COMPLETED, changed=True)


def recurring_marks(round_: int) -> dict[str, Any]:
    """What a recurring deletion round's ledger events add (round 0, the match's, nothing):
    ``"recurring": true`` and the round, so they are told apart from DROP's own answers."""
    return {"recurring": True, "round": round_} if round_ else {}


def _saas_connections_locked(*, broker_id: int) -> list[SaasConnection]:
    """The broker's SaaS connections that are not retired (a paused one included: its deletion
    waits), share-locked until the transaction ends so none is retired meanwhile."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM integrations_saasconnection"
            " WHERE broker_id = %s AND retired_at IS NULL ORDER BY id FOR SHARE",
            [broker_id],
        )
        ids = [row[0] for row in cursor.fetchall()]
    return list(SaasConnection.objects.filter(pk__in=ids))


def _resolution_complete(
    request: ResolutionRequest,
    *,
    drop_outcome: str,
    exemption_basis: str,
    identifiers: dict[str, Any],
    keep: bool,
    now: dt.datetime,
) -> bool:
    """Complete the request with the broker's answer unless it is complete or cancelled
    already; whether it was. ``identifiers`` are kept (encrypted) for the SaaS deletions if
    ``keep``, else purged at once. Taken as for a deletion (``OUTCOME_REFUSING_STATES``), but
    any answer is final."""
    return bool(
        ResolutionRequest.objects.filter(pk=request.pk, completed_at__isnull=True)
        .exclude(state__in=OUTCOME_REFUSING_STATES)
        .update(
            state=RequestState.COMPLETED,
            drop_outcome=drop_outcome,
            exemption_basis=exemption_basis,
            identifiers=_identifiers_text(identifiers) if keep else "",
            identifiers_purged_at=None if keep else now,
            completed_at=now,
            next_attempt_at=None,
            dispatched_at=Coalesce(F("dispatched_at"), now),
        )
    )


def _identifiers_text(identifiers: dict[str, Any]) -> str:
    # Values stay exactly as the broker sent them (no case change, no trimming).
    return json.dumps(identifiers, ensure_ascii=False, separators=(",", ":"))


def resolution_repeat_check(
    *,
    current: ResolutionRequest,
    drop_outcome: str,
    exemption_basis: str,
    identifiers: dict[str, Any],
    opt_out_email: str,
) -> None:
    """Raise ``OutcomeConflict`` unless an answer that was not taken repeats the one
    recorded on ``current``: the same outcome, exemption basis and identifiers, and for
    ``opted_out`` the email already recorded. A request in ``OUTCOME_REFUSING_STATES``
    takes nothing."""
    if current.state in OUTCOME_REFUSING_STATES:
        raise cancelled_conflict(state=current.state, attempted=drop_outcome)
    # The first field found to differ, named (never its value: identifiers are personal data,
    # and this detail is kept in the ledger); "" for a repeat.
    differs = ""
    if current.drop_outcome != drop_outcome:
        differs = "drop_outcome"
    elif current.exemption_basis != exemption_basis:
        differs = "exemption_basis"
    # Once purged, the earlier identifiers cannot be compared; the outcome decides.
    elif current.identifiers and json.loads(current.identifiers) != identifiers:
        differs = "identifiers"
    elif drop_outcome == DropOutcome.OPTED_OUT and not opt_out_recorded_as(
        opt_out_email, resolution_request_id=current.pk
    ):
        differs = OPT_OUT_EMAIL
    if differs:
        # An answer without an outcome is one with identifiers.
        raise OutcomeConflict(
            f"The request already has an answer with another {differs}; it is kept, and this"
            " one is refused.",
            current=current.drop_outcome or "identifiers",
            attempted=drop_outcome or "identifiers",
        )


def resolution_settle(*, resolution_id: int, actor: str = "system") -> bool:
    """After one of its SaaS deletions became final: purge the resolved identifiers if every
    one is final, and settle the work item. Returns whether the identifiers were purged."""
    with transaction.atomic():
        # The lock makes two deletions that finish together agree on who purges.
        resolution = (
            ResolutionRequest.objects.select_for_update(of=("self",))
            .select_related("broker")
            .get(pk=resolution_id)
        )
        purged = False
        open_deletions = SaasDeletion.objects.filter(resolution_id=resolution_id).exclude(
            state__in=FINAL_SAAS_STATES
        )
        if resolution.identifiers_purged_at is None and not open_deletions.exists():
            resolution.identifiers = ""
            resolution.identifiers_purged_at = timezone.now()
            resolution.save(update_fields=["identifiers", "identifiers_purged_at"])
            ledger_event_append(
                kind=LedgerKind.RESOLUTION_REQUEST_IDENTIFIERS_PURGED,
                broker_id=resolution.broker.broker_id,
                subject=str(resolution.request_uuid),
                actor=actor,
                data={
                    "saas_deletions": dict(
                        SaasDeletion.objects.filter(resolution_id=resolution_id).values_list(
                            "saas_connection__name", "state"
                        )
                    )
                },
            )
            purged = True
        work_item_settle(work_item=WorkItem(pk=resolution.work_item_id))
    return purged


def resolutions_purge_final(*, limit: int = 1000) -> int:
    """Purge the identifiers of every answered resolution whose SaaS deletions are all final.

    A safety net run periodically (``tasks.purge_resolved_identifiers``): SaaS deletions
    normally trigger the purge themselves, but some end in bulk without passing through
    here (cancelled with their removed work item). Returns how many were purged.
    """
    open_deletions = SaasDeletion.objects.filter(resolution=OuterRef("pk")).exclude(
        state__in=FINAL_SAAS_STATES
    )
    due = (
        ResolutionRequest.objects.filter(identifiers_purged_at__isnull=True)
        .exclude(identifiers="")
        .exclude(Exists(open_deletions))
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(resolution_settle(resolution_id=pk) for pk in list(due))


def saas_deletion_cancel(*, saas_deletion: SaasDeletion, reason: str, actor: str) -> SaasDeletion:
    """Staff give up on a SaaS deletion (queued or undeliverable); it becomes final."""
    reason = (reason or "").strip()[:500] or "cancelled by staff"
    with transaction.atomic():
        locked = (
            SaasDeletion.objects.select_for_update(of=("self",))
            .select_related("resolution__broker", "saas_connection")
            .get(pk=saas_deletion.pk)
        )
        if locked.state not in (RequestState.QUEUED, RequestState.UNDELIVERABLE):
            raise ValidationError(
                f"SaaS deletion {locked.pk} is {locked.state}: only a queued or undeliverable "
                "one can be cancelled"
            )
        locked.state = RequestState.CANCELLED
        locked.last_error = reason
        locked.next_attempt_at = None
        locked.completed_at = timezone.now()
        locked.save(update_fields=["state", "last_error", "next_attempt_at", "completed_at"])
        ledger_event_append(
            kind=LedgerKind.SAAS_DELETION_CANCELLED,
            broker_id=locked.resolution.broker.broker_id,
            subject=str(locked.resolution.request_uuid),
            actor=actor,
            data={
                "saas_deletion": locked.pk,
                "saas_connection": locked.saas_connection.name,
                "reason": reason,
                **recurring_marks(locked.resolution.round),
            },
        )
        resolution_settle(resolution_id=locked.resolution_id, actor=actor)
    return locked
