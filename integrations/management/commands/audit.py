"""``manage.py audit rematch``: re-perform a cycle's matching, as an auditor tests it::

    manage.py audit rematch --broker 4821 --cycle 12 [--json]

Matches the cycle's DROP hashes again against the consumers registered now and compares
with the matches the service recorded; every difference is printed with the ledger event
that explains it (a late match, a consumer forgotten since...). Exit 1 when any difference
is unexplained (each is named), as for an unknown broker or cycle (one line on stderr).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from integrations.management.base import DropportalCommand, broker_or_error, cycle_or_error
from integrations.selectors.rematch import EXPLAINED, UNEXPLAINED, RematchSummary
from integrations.services.evidence.rematch import cycle_rematch


class Command(DropportalCommand):
    help = "Test the deletion system as an auditor does."

    def add_subcommands(self, subparsers: Any) -> None:
        rematch = subparsers.add_parser(
            "rematch",
            help="match a cycle's DROP hashes again against the consumers registered now and "
            "explain every difference with what was recorded; exit 1 on an unexplained one",
        )
        rematch.add_argument("--broker", required=True, help="the broker's DROP id, 4 digits")
        rematch.add_argument("--cycle", required=True, help="the cycle (its drop_session_id)")
        rematch.add_argument(
            "--json",
            action="store_true",
            help="one JSON object: the differences, streamed, then the summary",
        )

    def handle_rematch(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        cycle = cycle_or_error(broker, options["cycle"])
        out = self.stdout
        with cycle_rematch(broker=broker, cycle=cycle) as rematch:
            if options["json"]:
                out.write(
                    f'{{"broker_id": {json.dumps(broker.broker_id)}, '
                    f'"cycle": {json.dumps(cycle.drop_session_id)}, "differences": [',
                    ending="",
                )
                for index, difference in enumerate(rematch.differences()):
                    out.write(
                        ("," if index else "") + "\n  " + json.dumps(difference.as_json()),
                        ending="",
                    )
                out.write(f'\n], "summary": {json.dumps(rematch.summary.as_json())}}}\n', ending="")
            else:
                out.write(
                    f"Rematching cycle {cycle.drop_session_id} of broker {broker.broker_id} "
                    f"({cycle.work_items} work items) against the consumers registered now."
                )
                for difference in rematch.differences():
                    mark = "explained" if difference.explained else "UNEXPLAINED"
                    out.write(f"  {mark} {difference.reason}: {difference.describe()}")
                for line in _summary_lines(rematch.summary):
                    out.write(line)
            summary = rematch.summary
        if not summary.passed:
            sys.exit(1)


def _summary_lines(summary: RematchSummary) -> list[str]:
    explained = sum(summary.explained.values())
    unexplained = sum(summary.unexplained.values())
    lines = [
        f"Matched at the import: {summary.matched_at_import} work items "
        f"({summary.matched_recorded_at_import} with deletion requests); with late matches: "
        f"{summary.matched_recorded}; matching now: "
        f"{summary.matched_now} ({summary.pairs_now} consumer matches, "
        f"{summary.pairs_recorded} recorded).",
    ]
    lines += [
        f"  {count} {reason}: {EXPLAINED[reason]}"
        for reason, count in sorted(summary.explained.items())
    ]
    lines += [
        f"  {count} {reason} (UNEXPLAINED): {UNEXPLAINED[reason]}"
        for reason, count in sorted(summary.unexplained.items())
    ]
    if unexplained:
        lines.append(
            f"FAIL: {unexplained} difference(s) no ledger event explains, {explained} explained."
        )
    elif explained:
        lines.append(f"PASS: every difference ({explained}) is explained by its ledger event.")
    else:
        lines.append("PASS: the same matches as recorded, no difference.")
    return lines
