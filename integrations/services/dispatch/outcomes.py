"""Recording the broker's deletion outcome (docs/contracts.md §2.2) on its deletion request.

The callback view has already authenticated the key, found the request of the key's broker
and checked the signature; this is the write::

    result = deletion_outcome_record(deletion_request=request, drop_outcome="opted_out",
                                     opt_out_email="Ann.Smith@Example.com ", actor="apikey:dpk_…")
    result.changed      # False: the same outcome again (200, nothing changes)
    # raises OutcomeConflict: a different final outcome (409, ledger records the attempt)

Idempotency (docs/contracts.md §5.3): the same outcome twice changes nothing; a different
final outcome is refused; after ``failed`` a new outcome is accepted, but a failure while a
redispatch waits to be sent is a repeat (it answers the dispatch before). Recording is one
statement, the SQL function in ``integrations/sql/deletion_outcome_record.sql`` (the
callbacks' hot path): the outcome, its opt-out record, its ledger event and the work item's
settlement, in one transaction. That function alone judges the answer (recorded, an
identical repeat, a conflict, or refused: cancelled); ``deletion_repeat_check`` acts on its
verdict. A resolution's answer is judged in ``services/dispatch/resolutions.py``.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from functools import partial

from django.db import connection
from django.utils import timezone

from integrations.dispatch import masking
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    DROP_STATUS_CODES,
    OUTCOME_REFUSING_STATES,
    OUTCOMES_NOT_FINAL,
    DeletionRequest,
    DeliveryAttempt,
    DropOutcome,
    OptOutRecord,
    RequestState,
)
from integrations.services.cycle.work_items import settle_rules
from integrations.services.ledger import canonical_data, ledger_event_append
from integrations.wire_fields import OPT_OUT_EMAIL

ERROR_MESSAGE_MAX = 2000
# integrations/sql/deletion_outcome_record.sql, with the rules it applies as arguments.
_RECORD = """
SELECT * FROM dropportal_deletion_outcome_record(
    p_request => %(request)s, p_state => %(state)s, p_outcome => %(outcome)s,
    p_code => %(code)s, p_at => %(at)s, p_details => %(details)s::jsonb, p_actor => %(actor)s,
    p_event_data => %(event_data)s,
    p_open_outcomes => %(open_outcomes)s, p_refusing_states => %(refusing_states)s,
    p_settle_outcomes => %(settle_outcomes)s, p_settle_codes => %(settle_codes)s,
    p_settle_all_cancelled => %(settle_all_cancelled)s
)
"""
_RECORD_RULES: dict[str, int | list[int] | list[str]] = {
    "open_outcomes": list(OUTCOMES_NOT_FINAL),
    "refusing_states": list(OUTCOME_REFUSING_STATES),
}
_OPT_OUT_EMAIL = OptOutRecord._meta.get_field("email")  # encrypted at rest


class OutcomeConflict(Exception):
    """The request already has a different final outcome (or was cancelled)."""

    def __init__(self, detail: str, *, current: str, attempted: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.current = current
        self.attempted = attempted


@dataclass(frozen=True)
class OutcomeRecorded:
    request_uuid: str
    drop_outcome: str
    state: str
    changed: bool  # False: an identical repeat, nothing was written but its ledger event


# How far a broker's own completion time may stray: clocks differ by minutes.
BROKER_CLOCK_TOLERANCE = dt.timedelta(minutes=5)


def broker_completed_at_refusal(
    *, deletion_request: DeletionRequest, completed_at: dt.datetime, now: dt.datetime | None = None
) -> str | None:
    """Why a broker's ``completed_at`` cannot be right, or None: more than
    ``BROKER_CLOCK_TOLERANCE`` before the request was first sent (its first delivery attempt,
    else its acknowledgement, else its creation) or after now. The first send, not the
    acknowledgement: when a 2xx was lost and a retry acknowledged later, the broker may well
    have finished the first one, and that true time must not be refused for ever."""
    now = now or timezone.now()
    row = DeletionRequest.objects.values("dispatched_at", "created_at").get(pk=deletion_request.pk)
    first_attempt = (
        DeliveryAttempt.objects.filter(deletion_request_id=deletion_request.pk)
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    dispatched = first_attempt or row["dispatched_at"] or row["created_at"]
    tolerance = int(BROKER_CLOCK_TOLERANCE.total_seconds() // 60)
    if completed_at < dispatched - BROKER_CLOCK_TOLERANCE:
        return (
            f"completed_at {completed_at.isoformat()} is before the delete was sent"
            f" ({dispatched.isoformat()}); clocks may differ by up to {tolerance} minutes,"
            " not more."
        )
    if completed_at > now + BROKER_CLOCK_TOLERANCE:
        return (
            f"completed_at {completed_at.isoformat()} is in the future (now is"
            f" {now.isoformat()}); clocks may differ by up to {tolerance} minutes, not more."
        )
    return None


def deletion_outcome_record(
    *,
    deletion_request: DeletionRequest,
    drop_outcome: str,
    error_message: str = "",
    opt_out_email: str = "",
    actor: str,
    now: dt.datetime | None = None,
    broker_completed_at: dt.datetime | None = None,
) -> OutcomeRecorded:
    """Record ``drop_outcome`` (already validated) on ``deletion_request``.

    ``opt_out_email`` (for ``opted_out``) is kept verbatim, encrypted, as an ``OptOutRecord``;
    it never reaches the ledger. ``error_message`` is kept, on the row and in the ledger,
    with what looks like an identifier in it masked (``masking.free_text_masked``). ``now``
    (the service's clock) dates the outcome and its ledger event; a time the broker gives
    (``broker_completed_at``, ISI) is kept in the event's data only, so a broker cannot date
    the ledger.
    """
    now = now or timezone.now()
    # Masked before anything compares or keeps it: a repeat is judged on what is kept. The
    # row's own UUIDs are read only for a text holding a UUID: the callback read the row in
    # part, and reading the rest would add a statement to its hot path.
    error_message = masking.free_text_masked(
        error_message,
        limit=ERROR_MESSAGE_MAX,
        own_uuids=partial(masking.row_own_uuids, deletion_request),
    )
    failed = drop_outcome == DropOutcome.FAILED
    state = RequestState.FAILED if failed else RequestState.COMPLETED
    uuid_text = str(deletion_request.request_uuid)
    opted_out = drop_outcome == DropOutcome.OPTED_OUT
    data: dict[str, object] = {
        "drop_outcome": drop_outcome,
        "drop_status_code": DROP_STATUS_CODES.get(drop_outcome),
        # Filled by the SQL function from the row it locks (deletion_outcome_record.sql):
        # this copy was read before the lock.
        "previous_state": None,
        "previous_outcome": None,
    }
    if error_message:
        data["error_message"] = error_message
    if deletion_request.round:
        # A recurring deletion round's: recorded, never settling DROP's status.
        data["recurring"] = True
        data["round"] = deletion_request.round
    if broker_completed_at is not None:
        data["broker_completed_at"] = broker_completed_at.isoformat()
    if opted_out:
        data["opt_out_record"] = True  # the email itself stays out of the ledger
    # The optional details, one key per column the SQL fills (docs/architecture.md, "Add a
    # field to a callback body").
    details: dict[str, str] = {"error_message": error_message}
    if opted_out:
        details["opt_out_email"] = _OPT_OUT_EMAIL.get_db_prep_value(opt_out_email, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            _RECORD,
            {
                "request": deletion_request.pk,
                "state": state,
                "outcome": drop_outcome,
                "code": DROP_STATUS_CODES.get(drop_outcome),
                "at": now,
                "details": json.dumps(details, ensure_ascii=False),
                "actor": actor,
                "event_data": canonical_data(data),
                **_RECORD_RULES,
                **settle_rules(),
            },
        )
        verdict, current_state, current_outcome = cursor.fetchone()
    if verdict == "recorded":
        return OutcomeRecorded(uuid_text, drop_outcome, state, changed=True)
    deletion_repeat_check(
        verdict=verdict,
        current_state=current_state,
        current_outcome=current_outcome,
        drop_outcome=drop_outcome,
        opt_out_email=opt_out_email,
        deletion_request_id=deletion_request.pk,
    )
    ledger_event_append(
        kind=LedgerKind.DELETION_REQUEST_OUTCOME_REPEATED,
        broker_id=deletion_request.broker_id_code,
        subject=uuid_text,
        actor=actor,
        data={"drop_outcome": drop_outcome},
    )
    return OutcomeRecorded(uuid_text, drop_outcome, current_state, changed=False)


def deletion_repeat_check(
    *,
    verdict: str,
    current_state: str,
    current_outcome: str,
    drop_outcome: str,
    opt_out_email: str,
    deletion_request_id: int,
) -> None:
    """Raise ``OutcomeConflict`` unless the SQL function's ``verdict`` on a deletion outcome
    it did not record is an identical repeat: ``repeated`` (the same outcome; for a failure,
    the same error), and for ``opted_out`` the email already recorded."""
    if verdict == "refused":
        raise cancelled_conflict(state=current_state, attempted=drop_outcome)
    if verdict == "repeated" and (
        drop_outcome != DropOutcome.OPTED_OUT
        or opt_out_recorded_as(opt_out_email, deletion_request_id=deletion_request_id)
    ):
        return
    if verdict == "repeated":
        # Only an opt-out's email can differ in an outcome the SQL function found repeated.
        # The field is named, never its value: an email is personal data (and this detail
        # is kept in the ledger).
        raise OutcomeConflict(
            f"The request already has the outcome '{current_outcome}' with another"
            f" {OPT_OUT_EMAIL}; it is kept, and this one is refused.",
            current=current_outcome,
            attempted=drop_outcome,
        )
    raise OutcomeConflict(
        f"The request already has the outcome '{current_outcome}'; another outcome,"
        f" '{drop_outcome}', is refused.",
        current=current_outcome or current_state,
        attempted=drop_outcome,
    )


def cancelled_conflict(*, state: str, attempted: str) -> OutcomeConflict:
    """The refusal of any answer to a request in ``OUTCOME_REFUSING_STATES``."""
    return OutcomeConflict(
        "The request was cancelled; no outcome is recorded for it.",
        current=state,
        attempted=attempted,
    )


def opt_out_recorded_as(
    email: str, *, deletion_request_id: int | None = None, resolution_request_id: int | None = None
) -> bool:
    """Whether the request's opt-out record holds ``email``, for a repeated ``opted_out``.
    A different email is a different opt-out: refusing it keeps it from being lost."""
    record = OptOutRecord.objects.filter(
        deletion_request_id=deletion_request_id, resolution_request_id=resolution_request_id
    ).first()
    return record is not None and record.email == email
