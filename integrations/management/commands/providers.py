"""``manage.py providers add|list|acknowledge``: a broker's service providers and contractors.

    manage.py providers add --broker 4821 --name Mailhouse [--contact ops@mail.example] \
        [--s3 s3://mailhouse-drop/directives/]
    manage.py providers list [--broker 4821] [--json]
    manage.py providers acknowledge 17 --reference "Mailhouse ticket 4410"

Each provider gets a signed directive after every match (``drop directives``); a SaaS
connection is not registered here: it deletes by itself.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from integrations.drop.calendar import drop_date
from integrations.management.base import (
    DropportalCommand,
    broker_or_error,
    broker_or_every,
    terminal_text,
)
from integrations.models import Directive, ServiceProvider
from integrations.services.providers.directives import directive_acknowledge
from integrations.services.providers.providers import service_provider_add


class Command(DropportalCommand):
    help = "Register and list service providers and contractors; record acknowledgements."

    def add_subcommands(self, subparsers: Any) -> None:
        add = subparsers.add_parser("add", help="register a service provider or contractor")
        add.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        add.add_argument("--name", required=True)
        add.add_argument("--contact", default="", help="an email address")
        add.add_argument(
            "--s3",
            default="",
            metavar="s3://bucket/prefix/",
            help="where each directive is written (else: downloaded from the admin)",
        )
        add.add_argument("--json", action="store_true", help="print the result as JSON")
        listing = subparsers.add_parser("list", help="list service providers")
        listing.add_argument("--broker", help="only this broker (its 4-digit DROP id)")
        listing.add_argument("--json", action="store_true", help="print the result as JSON")
        ack = subparsers.add_parser(
            "acknowledge", help="record that a provider acknowledged a directive"
        )
        ack.add_argument("id", type=int, help="the directive's id (drop directives)")
        ack.add_argument("--reference", required=True, help="theirs: a ticket, a letter...")

    def handle_add(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        provider = service_provider_add(
            broker=broker,
            name=options["name"],
            contact=options["contact"],
            s3_prefix=options["s3"],
            actor=self.actor(),
        )
        if options["json"]:
            self.print_json(_as_json(provider))
            return
        where = provider.s3_prefix or "downloaded from the admin"
        self.stdout.write(
            f"Service provider {provider.pk} {provider.name!r} added for broker "
            f"{broker.broker_id}; its directives: {where}."
        )

    def handle_list(self, **options: Any) -> None:
        providers = ServiceProvider.objects.select_related("broker")
        broker = broker_or_every(options["broker"])
        if broker is not None:
            providers = providers.filter(broker=broker)
        rows = [_as_json(p) for p in providers]
        if options["json"]:
            self.print_json({"items": rows})
            return
        if not rows:
            self.stdout.write("No service provider registered.")
        for row in rows:
            self.stdout.write(
                f"{row['id']:>5}  {row['broker_id']}  {terminal_text(row['name'])}  "
                f"{row['contact'] or '-'}"
                f"  {row['s3_prefix'] or 'download'}"
            )

    def handle_acknowledge(self, **options: Any) -> None:
        directive = Directive.objects.filter(pk=options["id"]).first()
        if directive is None:
            raise CommandError(f"no directive {options['id']}")
        if directive.acknowledged_at is not None:
            raise CommandError(
                f"directive {directive.pk} was already acknowledged on "
                f"{drop_date(directive.acknowledged_at)} by {directive.acknowledged_by} "
                f"({terminal_text(directive.acknowledgement_reference)})"
            )
        done = directive_acknowledge(
            directive=directive, reference=options["reference"], actor=self.actor()
        )
        self.stdout.write(
            f"Directive {done.pk} to {done.provider.name} acknowledged: "
            f"{terminal_text(done.acknowledgement_reference)}."
        )


def _as_json(provider: ServiceProvider) -> dict[str, Any]:
    return {
        "id": provider.pk,
        "broker_id": provider.broker.broker_id,
        "name": provider.name,
        "contact": provider.contact,
        "s3_prefix": provider.s3_prefix,
        "created_at": provider.created_at.isoformat() if provider.created_at else None,
    }
