"""The matching component: each cycle of the pack matched again at export against the
consumers registered then (``audit rematch``), every difference with what the service
recorded explained by its ledger event; ``components/matching/<cycle>.json`` holds each
cycle's counts and a few examples per reason, by work item id (no consumer pointer, no
hash)::

    component = build(context)
    component.records["cycles"]  # per cycle: matched recorded, now, differences by reason
"""

from __future__ import annotations

import json
from typing import Any, Final

from integrations.evidence import components as layout
from integrations.services.evidence.components.base import Component, PackContext
from integrations.services.evidence.rematch import cycle_rematch_result

EXAMPLES: Final = 20  # per reason and cycle, in the cycle's file

PROVES = (
    "At export, each DROP cycle of the pack was matched again, by the deployed code's own "
    "rule (same broker, hash and list type), against the consumer hashes registered then, "
    "and compared with the matches the service recorded (the deletion requests of each "
    "match). Every difference is explained by the ledger event of the service path that "
    "makes it: a late match (drop.late_matched) and whether it was dispatched, a consumer "
    "forgotten since (consumer.forgotten, consumers.replaced), a hash a full replacement "
    "took from a consumer it listed without it (consumers.replaced), a work item DROP removed "
    "before its consumer came (drop.work_items_removed). A consumer hash that matches with "
    "no match recorded (written outside the service), or a match recorded for a consumer "
    "that is gone or lost its hash without such an event, fails the cycle's test."
)
CANNOT_PROVE = (
    "That the broker's consumer list is complete: the rematch tests matching against the "
    "consumers registered in dropportal, not those the broker holds elsewhere (the "
    "actioning component's canaries test the broker's own systems). A forgotten consumer's "
    "hashes are gone, so its past match is explained by its event but cannot be matched "
    "again; a full replacement's event names counts, not consumers."
)


def build(context: PackContext) -> Component:
    component = Component(key="matching", proves=PROVES, cannot_prove=CANNOT_PROVE)
    cycles: list[dict[str, Any]] = []
    for cycle in context.period.cycles().order_by("downloaded_at"):
        result = cycle_rematch_result(broker=context.broker, cycle=cycle, examples=EXAMPLES)
        summary = result.summary
        name = f"{layout.MATCHING_DIR}{cycle.drop_session_id}.json"
        document = {"format": layout.REMATCH_FORMAT, "examples_per_reason": EXAMPLES}
        document |= result.as_json()
        differences = sum(summary.explained.values()) + sum(summary.unexplained.values())
        context.writer.write(
            name,
            [json.dumps(document, indent=2, sort_keys=True).encode()],
            rows=differences,
            description=f"cycle {cycle.drop_session_id} matched again at export: the "
            "differences with what was recorded, by reason, with examples (JSON)",
        )
        component.files.append(name)
        cycles.append(
            {
                "cycle": cycle.drop_session_id,
                "work_items": summary.work_items,
                "matched_at_import": summary.matched_at_import,
                "matched_recorded": summary.matched_recorded,
                "matched_now": summary.matched_now,
                "explained": dict(sorted(summary.explained.items())),
                "unexplained": dict(sorted(summary.unexplained.items())),
            }
        )
        unexplained = [
            f"{count} {reason} (e.g. work item "
            f"{', '.join(d.work_item_id for d in result.examples[reason][:3])})"
            for reason, count in sorted(summary.unexplained.items())
        ]
        explained = sum(summary.explained.values())
        component.test(
            f"cycle {cycle.drop_session_id}: every difference of the rematch is explained",
            passed=summary.passed,
            detail="; ".join(unexplained)
            or f"{summary.matched_now} work items match now, {summary.matched_recorded} "
            f"recorded; {explained} difference(s), each explained by its ledger event",
        )
    component.records["cycles"] = cycles
    if not cycles:
        component.test(
            "every cycle's matching re-performed", passed=True, detail="no cycle in the pack"
        )
    return component
