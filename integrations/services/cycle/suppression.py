"""Asking the suppression list, and recording that it was exported.

A broker's pipeline asks before it collects (``POST /api/v1/drop/suppression/check``)::

    answers = suppression_check(broker=broker, entries=parse_api_identifiers(body),
                                actor="apikey:dpk_ab12cd34")
    answers[0].suppressed, answers[0].list_types

Clear identifiers were standardized and hashed on arrival (``consumers.api_reader``);
nothing of the call is stored, and its one ledger event holds counts only, never a hash.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import transaction

from integrations.consumers.api_reader import IdentifierEntry
from integrations.consumers.readers import RejectedRecord
from integrations.ledger_kinds import LedgerKind
from integrations.list_types import LABELS
from integrations.models import Broker
from integrations.selectors.suppression import suppressed_digests
from integrations.services.ledger import ledger_event_append

# The list types in DROP's order, for a stable answer.
_ORDER = {hash_type: position for position, hash_type in enumerate(LABELS)}


@dataclass(frozen=True)
class SuppressionAnswer:
    """One entry's answer: suppressed or not, and by which list types; or, for an entry
    that could not be read, ``suppressed`` None and the errors by path of the bad value."""

    index: int
    suppressed: bool | None
    list_types: tuple[str, ...] = ()
    errors: dict[str, list[str]] = field(default_factory=dict)


def suppression_check(
    *, broker: Broker, entries: Iterable[IdentifierEntry | RejectedRecord], actor: str
) -> list[SuppressionAnswer]:
    """Answer, for each entry in order, whether one of its hashes is on ``broker``'s
    suppression list (a hash DROP sent and did not remove), and by which list types.

    One ``suppression.checked`` ledger event counts the entries, the rejected and the
    suppressed ones (and these by list type); no hash or value is kept.
    """
    entries = list(entries)
    accepted = [entry for entry in entries if isinstance(entry, IdentifierEntry)]
    with transaction.atomic():
        found = suppressed_digests(
            broker=broker, digests=(pair for entry in accepted for pair in entry.hashes)
        )
        answers: list[SuppressionAnswer] = []
        by_list_type: Counter[str] = Counter()
        for entry in entries:
            if isinstance(entry, RejectedRecord):
                answers.append(SuppressionAnswer(entry.position, None, errors=entry.errors))
                continue
            list_types = tuple(
                sorted(
                    {t for t, digest in entry.hashes if (t, digest) in found},
                    key=_ORDER.__getitem__,
                )
            )
            by_list_type.update(list_types)
            answers.append(SuppressionAnswer(entry.position, bool(list_types), list_types))
        ledger_event_append(
            kind=LedgerKind.SUPPRESSION_CHECKED,
            broker_id=broker.broker_id,
            subject="suppression check",
            actor=actor,
            data={
                "entries": len(entries),
                "rejected": len(entries) - len(accepted),
                "hashes_checked": sum(len(entry.hashes) for entry in accepted),
                "suppressed": sum(1 for answer in answers if answer.suppressed),
                "suppressed_by_list_type": dict(sorted(by_list_type.items())),
            },
        )
    return answers


def suppression_export_record(
    *, broker: Broker, actor: str, fmt: str, destination: str, hashes: int, sha256: str
) -> None:
    """One ``suppression.exported`` event, once the export is written whole: where to, how
    many hashes, and the SHA-256 of what was written."""
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.SUPPRESSION_EXPORTED,
            broker_id=broker.broker_id,
            subject=destination,
            actor=actor,
            data={"format": fmt, "destination": destination, "hashes": hashes, "sha256": sha256},
        )
