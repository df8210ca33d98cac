"""``manage.py drop directives|directive``: the directives sent to service providers.

    manage.py drop directives --broker 4821 [--json]    # each, with its acknowledgement
    manage.py drop directive 17 --out directive-17.csv  # the CSV, and directive-17.csv.sig

The ``drop`` command mixes this in (``class Command(DirectiveSubcommands, ...)``). The
``.sig`` is the Ed25519 signature (Base64, one line) of the CSV's exact bytes by the
evidence key (``evidence public-key`` prints the key that verifies it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from integrations.drop.calendar import drop_date
from integrations.management.base import (
    DropportalCommand,
    broker_or_error,
    files_written_whole,
    out_path_checked,
    terminal_text,
)
from integrations.models import Directive
from integrations.selectors.directives import (
    directive_ack_due,
    directive_ack_due_date,
    directive_as_json,
    directives_of,
)
from integrations.services.providers.directives import directive_download_record


class DirectiveSubcommands(DropportalCommand):
    def add_directive_subcommands(self, subparsers: Any) -> None:
        listing = subparsers.add_parser(
            "directives", help="the directives sent to service providers, acknowledged or not"
        )
        listing.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        listing.add_argument("--json", action="store_true", help="print the result as JSON")
        one = subparsers.add_parser("directive", help="write a directive's CSV and its .sig")
        one.add_argument("id", type=int, help="the directive's id (drop directives)")
        one.add_argument("--out", required=True, help="the CSV's path; FILE.sig beside it")

    def handle_directives(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        directives = list(directives_of(broker))
        if options["json"]:
            self.print_json({"items": [directive_as_json(d) for d in directives]})
            return
        if not directives:
            self.stdout.write(f"No directive for broker {broker.broker_id} yet.")
            return
        now = timezone.now()
        for directive in directives:
            # Days of DROP's calendar, as staff count them everywhere else.
            due, due_date = directive_ack_due(directive), directive_ack_due_date(directive)
            if directive.acknowledged_at:
                state = (
                    f"acknowledged {drop_date(directive.acknowledged_at)} by "
                    f"{directive.acknowledged_by} "
                    f"({terminal_text(directive.acknowledgement_reference)})"
                )
            elif due < now:
                state = f"NOT acknowledged, due {due_date}"
            else:
                state = f"awaiting acknowledgement, due {due_date}"
            where = terminal_text(directive.s3_uri or directive.delivery_error or "download")
            self.stdout.write(
                f"{directive.pk:>6}  {drop_date(directive.created_at)}  "
                f"{directive.provider.name}  {directive.reason}  {directive.rows} hashes  "
                f"{where}  {state}"
            )

    def handle_directive(self, **options: Any) -> None:
        out = out_path_checked(options["out"])
        directive = Directive.objects.select_related("broker").filter(pk=options["id"]).first()
        if directive is None:
            raise CommandError(f"no directive {options['id']}")
        signature = Path(f"{out}.sig")
        try:
            # Both or neither: either one that cannot be written leaves both paths as they
            # were, never a signature beside another file, or beside none.
            with files_written_whole(out, signature) as (written, signed):
                written.write(bytes(directive.content))
                signed.write(f"{directive.signature}\n".encode("ascii"))
        except OSError as exc:
            raise CommandError(f"cannot write {exc.filename}: {exc.strerror}") from None
        directive_download_record(directive=directive, actor=self.actor(), via="command")
        self.stdout.write(
            f"Wrote {out} ({directive.rows} hashes, SHA-256 {directive.sha256}) and {signature}."
        )
