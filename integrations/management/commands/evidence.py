"""``manage.py evidence export|verify|public-key``: signed evidence packs for auditors.

    manage.py evidence export --broker 4821 --cycle 12 --out pack.zip
    manage.py evidence export --broker 4821 --since 2027-01-01 --until 2027-12-31 --out pack.zip
    manage.py evidence export --broker 4821 --cycle 12 --sample 20 --seed audit-2028 --out pack.zip
    manage.py evidence verify pack.zip --public-key dropportal-evidence.pem
    manage.py evidence public-key > dropportal-evidence.pem

``verify`` needs no database and no settings: ``manage.py`` hands it to
``integrations.evidence.verify`` before Django starts (this command delegates to it too).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import CommandError

from integrations.evidence import verify
from integrations.management.base import (
    DropportalCommand,
    add_period_arguments,
    broker_or_error,
    cycle_or_error,
    date_bound,
    out_path_checked,
    partial_output,
)
from integrations.services.evidence.evidence import evidence_pack_export, evidence_public_key_pem
from integrations.services.evidence.evidence_sample import SAMPLE_MAX


class Command(DropportalCommand):
    help = "Export, verify and sign evidence packs for auditors."

    def add_subcommands(self, subparsers: Any) -> None:
        export = subparsers.add_parser("export", help="write a signed evidence pack (ZIP)")
        export.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        export.add_argument("--cycle", help="one cycle (its drop_session_id)")
        add_period_arguments(export)
        export.add_argument("--out", required=True, help="the ZIP to write")
        export.add_argument(
            "--sample",
            type=int,
            help=f"add this many work items of the period (1 to {SAMPLE_MAX:,}), each with its "
            "story as a page",
        )
        export.add_argument(
            "--seed",
            help="the text the sample is drawn by (recorded; the same seed draws the same items)",
        )
        export.add_argument("--json", action="store_true", help="print the manifest as JSON")
        check = subparsers.add_parser("verify", help="check a pack (no database needed)")
        check.add_argument("pack", help="the evidence pack (ZIP)")
        check.add_argument("--public-key", help="the PEM public key it must be signed with")
        check.add_argument("--json", action="store_true")
        verify.add_tsa_cert_argument(check)
        verify.add_allow_older_pack_arguments(check)
        subparsers.add_parser("public-key", help="print the public key (PEM) that verifies packs")

    def handle_export(self, **options: Any) -> None:
        out = out_path_checked(options["out"])
        broker = broker_or_error(options["broker"])
        cycle = None
        if options["cycle"]:
            if options["since"] or options["until"]:
                raise CommandError("give --cycle or --since and --until, not both")
            cycle = cycle_or_error(broker, options["cycle"])
        elif not (options["since"] and options["until"]):
            raise CommandError("give --cycle, or both --since and --until")
        if (options["sample"] is None) != (options["seed"] is None):
            raise CommandError("give --sample and --seed together")
        since = date_bound(options["since"]) if options["since"] else None
        until = date_bound(options["until"], end=True) if options["until"] else None
        try:
            with partial_output(out, "w+b") as output:
                result = evidence_pack_export(
                    broker=broker,
                    cycle=cycle,
                    since=since,
                    until=until,
                    sample=options["sample"],
                    seed=options["seed"],
                    out=output.file,
                    actor=self.actor(),
                    via="command",
                    # The event and the pack in place: both or neither.
                    in_place=output.put_in_place,
                )
        except OSError as exc:  # the disk filled up, say: the partial file is gone already
            raise CommandError(f"cannot write {out}: {exc.strerror}") from None
        if options["json"]:
            self.print_json({**result.manifest, "manifest_sha256": result.manifest_sha256})
            return
        span = result.manifest["ledger_range"]
        self.stdout.write(
            f"Wrote {out}: {result.files} files, ledger events {span['first_event_id']} to "
            f"{span['last_event_id']}, manifest SHA-256 {result.manifest_sha256}."
        )
        results = result.manifest["components"]["results"]
        failed = [key for key, outcome in results.items() if outcome != "pass"]
        self.stdout.write(
            f"Components: {len(results) - len(failed)} of {len(results)} passed their tests"
            + (f"; failed: {', '.join(failed)}." if failed else ".")
        )
        if "sample" in result.manifest:
            sample = result.manifest["sample"]
            self.stdout.write(
                f"Sample: {sample['drawn']} of {sample['population']} work items, "
                f"seed {sample['seed']!r}."
            )

    def handle_verify(self, **options: Any) -> None:
        code = verify.run(
            options["pack"],
            public_key=options["public_key"],
            as_json=options["json"],
            tsa_cert=options["tsa_cert"],
            allow_pre_components=options["allow_pre_components"],
            allow_pre_population=options["allow_pre_population"],
        )
        if code:
            sys.exit(code)

    def handle_public_key(self, **options: Any) -> None:
        self.stdout.write(evidence_public_key_pem(), ending="")
