"""``manage.py ledger export|verify|seal|anchor``: read, check and anchor the tamper-evident
ledger (``anchor``: an RFC 3161 authority timestamps the chain head, ``DROPPORTAL_TSA_URL``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.core.management.base import CommandError

from integrations import exports
from integrations.evidence.timestamps import load_certificates
from integrations.management.base import (
    DropportalCommand,
    add_period_arguments,
    broker_or_every,
    open_output,
    out_path_checked,
    period_bounds,
)
from integrations.selectors.ledger import LEDGER_COLUMNS, ledger_events
from integrations.services.evidence.audit import ledger_export_record
from integrations.services.ledger import ledger_seal, ledger_verify
from integrations.services.ledger_anchors import (
    AnchorFailed,
    AnchorNotConfigured,
    ledger_anchor,
    ledger_anchors_verify,
)

if TYPE_CHECKING:
    from cryptography import x509


class Command(DropportalCommand):
    help = "Export, seal and verify the ledger."

    def add_subcommands(self, subparsers: Any) -> None:
        export = subparsers.add_parser("export", help="stream ledger events as CSV or JSONL")
        export.add_argument(
            "--format",
            choices=exports.FORMATS,
            default="csv",
            help="csv (default; a cell a spreadsheet would run as a formula gets a leading "
            "') or jsonl (every value as stored: recompute the event hashes from this one)",
        )
        export.add_argument("--broker", help="only this broker's events")
        add_period_arguments(export)
        export.add_argument("--out", help="write to this file instead of stdout")
        verify = subparsers.add_parser("verify", help="check every hash and the chain")
        verify.add_argument("--json", action="store_true")
        verify.add_argument(
            "--tsa-cert",
            metavar="FILE",
            help="the time-stamping authority's CA certificate (PEM): every token's signature "
            "must chain to it",
        )
        subparsers.add_parser("seal", help="chain the events written since the last seal")
        subparsers.add_parser(
            "anchor", help="have the time-stamping authority (DROPPORTAL_TSA_URL) sign the head"
        )

    def handle_export(self, **options: Any) -> None:
        if options["out"] is not None:
            out_path_checked(options["out"])
        broker_or_every(options["broker"])  # a typo is an error, not an empty export
        since, until = period_bounds(options)
        with open_output(options["out"], self.stdout._out) as stream:
            # Who took the ledger, as the admin's export and ``outcomes export`` record it:
            # once the output could be opened, before the rows are read, so the export
            # holds its own event; to a file, in the file's transaction, committed only
            # once the file is in place.
            ledger_export_record(
                actor=self.actor(),
                via="command",
                fmt=options["format"],
                filters={
                    "broker": options["broker"],
                    "since": options["since"],
                    "until": options["until"],
                    "out": options["out"],
                },
            )
            rows = ledger_events(broker_id=options["broker"], since=since, until=until)
            count = exports.write_rows(
                stream, fmt=options["format"], columns=LEDGER_COLUMNS, rows=rows
            )
        if options["out"]:
            self.stderr.write(f"Wrote {count} events to {options['out']}.")

    def handle_verify(self, **options: Any) -> None:
        authorities = _authorities(options["tsa_cert"])
        ledger_seal()
        result = ledger_verify()
        anchors, anchor_problems = ledger_anchors_verify(authorities=authorities)
        if options["json"]:
            self.print_json(
                {
                    "ok": result.ok and not anchor_problems,
                    "events_checked": result.events_checked,
                    "chain_length": result.chain_length,
                    "anchors_checked": anchors,
                    "anchors_signature_checked": authorities is not None,
                    "anchor_problems": [str(problem) for problem in anchor_problems],
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
        if anchor_problems:
            for problem in anchor_problems:
                self.stderr.write(f"Ledger anchor does not hold: {problem}.")
            sys.exit(1)
        if not options["json"]:
            self.stdout.write(
                f"Ledger intact: {result.events_checked} events checked, "
                f"{result.chain_length} in the chain."
            )
            if anchors:
                signed = (
                    "signatures chain to the given certificate"
                    if authorities is not None
                    else "signatures not checked against an authority (pass --tsa-cert FILE)"
                )
                self.stdout.write(
                    f"Anchors: {anchors} time-stamp tokens cover the chain hashes at their "
                    f"positions; {signed}."
                )

    def handle_seal(self, **options: Any) -> None:
        self.stdout.write(f"Sealed {ledger_seal()} events.")

    def handle_anchor(self, **options: Any) -> None:
        try:
            anchor = ledger_anchor(actor=self.actor())
        except (AnchorNotConfigured, AnchorFailed) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Anchored position {anchor.position} (chain hash {anchor.chain_hash}) with "
            f"{anchor.tsa_url}: token SHA-256 {anchor.token_sha256}, timestamped "
            f"{anchor.gen_time.isoformat()}."
        )


def _authorities(path: str | None) -> list[x509.Certificate] | None:
    if not path:
        return None
    try:
        return load_certificates(Path(path).read_bytes())
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CommandError(f"{path}: {exc}") from None
