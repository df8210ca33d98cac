"""``manage.py ledger export|verify|seal``: read and check the tamper-evident ledger."""

from __future__ import annotations

import sys
from typing import Any

from integrations import exports
from integrations.management.base import (
    DropportalCommand,
    add_period_arguments,
    date_bound,
    open_output,
)
from integrations.selectors.ledger import LEDGER_COLUMNS, ledger_events
from integrations.services.ledger import ledger_seal, ledger_verify


class Command(DropportalCommand):
    help = "Export, seal and verify the ledger."

    def add_subcommands(self, subparsers: Any) -> None:
        export = subparsers.add_parser("export", help="stream ledger events as CSV or JSONL")
        export.add_argument("--format", choices=exports.FORMATS, default="csv")
        export.add_argument("--broker", help="only this broker's events")
        add_period_arguments(export)
        export.add_argument("--out", help="write to this file instead of stdout")
        verify = subparsers.add_parser("verify", help="check every hash and the chain")
        verify.add_argument("--json", action="store_true")
        subparsers.add_parser("seal", help="chain the events written since the last seal")

    def handle_export(self, **options: Any) -> None:
        rows = ledger_events(
            broker_id=options["broker"],
            since=date_bound(options["since"]) if options["since"] else None,
            until=date_bound(options["until"], end=True) if options["until"] else None,
        )
        with open_output(options["out"], self.stdout._out) as stream:
            count = exports.write_rows(
                stream, fmt=options["format"], columns=LEDGER_COLUMNS, rows=rows
            )
        if options["out"]:
            self.stderr.write(f"Wrote {count} events to {options['out']}.")

    def handle_verify(self, **options: Any) -> None:
        ledger_seal()
        result = ledger_verify()
        if options["json"]:
            self.print_json(
                {
                    "ok": result.ok,
                    "events_checked": result.events_checked,
                    "chain_length": result.chain_length,
                    "first_break": (
                        {
                            "event_id": result.first_break.event_id,
                            "reason": result.first_break.reason,
                        }
                        if result.first_break
                        else None
                    ),
                }
            )
        if result.first_break:
            self.stderr.write(f"Ledger broken at {result.first_break}.")
            sys.exit(1)
        if not options["json"]:
            self.stdout.write(
                f"Ledger intact: {result.events_checked} events checked, "
                f"{result.chain_length} in the chain."
            )

    def handle_seal(self, **options: Any) -> None:
        self.stdout.write(f"Sealed {ledger_seal()} events.")
