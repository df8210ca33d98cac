"""``audit rematch``: a cycle's matching re-performed in one consistent snapshot, streamed
for the command, or bounded (counts and a few examples per reason) for the evidence pack::

    with cycle_rematch(broker=broker, cycle=cycle) as rematch:
        for difference in rematch.differences():
            print(difference.describe())
        rematch.summary.passed

    result = cycle_rematch_result(broker=broker, cycle=cycle, examples=20)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from integrations.models import Broker, DropCycle
from integrations.selectors.rematch import CycleRematch, RematchDifference, RematchSummary


@contextlib.contextmanager
def cycle_rematch(*, broker: Broker, cycle: DropCycle) -> Iterator[CycleRematch]:
    """The rematch of ``cycle``, read in one snapshot: REPEATABLE READ, read-only, when this
    is the outermost transaction (the recorded matches and the consumer hashes as of one
    moment, so a registration committing meanwhile is not half seen); inside another one
    (an evidence export), that one's snapshot."""
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield CycleRematch(broker=broker, cycle=cycle)


@dataclass
class RematchResult:
    """A rematch's counts, and at most ``examples`` differences of each reason."""

    summary: RematchSummary
    examples: dict[str, list[RematchDifference]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            **self.summary.as_json(),
            "examples": {
                reason: [d.as_json(identifiers=False) for d in differences]
                for reason, differences in sorted(self.examples.items())
            },
        }


def cycle_rematch_result(*, broker: Broker, cycle: DropCycle, examples: int) -> RematchResult:
    with cycle_rematch(broker=broker, cycle=cycle) as rematch:
        kept: dict[str, list[RematchDifference]] = {}
        for difference in rematch.differences():
            some = kept.setdefault(difference.reason, [])
            if len(some) < examples:
                some.append(difference)
        return RematchResult(summary=rematch.summary, examples=kept)
