"""``manage.py brokers add|list|drop-webhook-secret|lists-selected``: register and list data
brokers; store the signing secret of DROP's notification webhook; record which lists the
broker selected in DROP's portal, and why::

    manage.py brokers drop-webhook-secret 4821 --secret-file /run/secrets/drop-webhook
    pass show drop/webhook | manage.py brokers drop-webhook-secret 4821 -
    manage.py brokers lists-selected 4821 --lists email,phone,ndz --reason "what we hold"
"""

from __future__ import annotations

from typing import Any

from integrations.drop.notifications import notifications_url
from integrations.list_types import DATA_TYPE_OF, HASH_TYPES
from integrations.management.base import (
    DropportalCommand,
    add_secret_argument,
    broker_or_error,
    date_bound,
    secret_value,
    terminal_text,
)
from integrations.models import Broker, BrokerMode, ListSelection
from integrations.selectors.list_selection import lists_selected_at
from integrations.services.staff.brokers import (
    broker_create,
    broker_drop_webhook_secret_set,
    broker_lists_select,
)


class Command(DropportalCommand):
    help = "Register and list data brokers."

    def add_subcommands(self, subparsers: Any) -> None:
        add = subparsers.add_parser("add", help="register a broker")
        add.add_argument("--broker-id", required=True, help="DROP registration number, 4 digits")
        add.add_argument("--name", required=True)
        add.add_argument("--mode", required=True, choices=BrokerMode.values)
        add_secret_argument(add, "drop-api-key", "DROP API key (stored encrypted)")
        add.add_argument("--drop-base-url", default="", help="override of DROP's base URL")
        add.add_argument(
            "--approve-uploads",
            action="store_true",
            help="every response file waits for a second person's approval before its upload",
        )
        add.add_argument("--json", action="store_true", help="print the broker as JSON")
        listing = subparsers.add_parser("list", help="list brokers")
        listing.add_argument("--json", action="store_true")
        webhook = subparsers.add_parser(
            "drop-webhook-secret",
            help="store the signing secret of DROP's notification webhook (write-only) and "
            "print the URL to enter in DROP's portal",
        )
        webhook.add_argument("broker", help="the broker's DROP id, 4 digits")
        # Never as a value on the command line: the process list and shell history keep it.
        source = webhook.add_mutually_exclusive_group(required=True)
        source.add_argument(
            "--secret-file", metavar="FILE", help="read the secret from FILE ('-': standard input)"
        )
        source.add_argument(
            "from_stdin", nargs="?", choices=["-"], help="'-': read the secret from standard input"
        )
        webhook.add_argument("--json", action="store_true")
        selected = subparsers.add_parser(
            "lists-selected",
            help="record which lists the broker selected in DROP's portal, and why (the "
            "evidence pack compares each cycle's lists with it)",
        )
        selected.add_argument("broker", help="the broker's DROP id, 4 digits")
        selected.add_argument(
            "--lists",
            required=True,
            help=f"the lists selected, comma-separated: {','.join(HASH_TYPES)}",
        )
        selected.add_argument("--reason", required=True, help="why these lists")
        selected.add_argument(
            "--since",
            help="in force from this date or ISO time, when it was selected in DROP's portal "
            "before it is recorded here (default: now); dates are DROP's calendar",
        )
        selected.add_argument("--json", action="store_true")

    def handle_add(self, **options: Any) -> None:
        broker = broker_create(
            broker_id=options["broker_id"],
            name=options["name"],
            mode=options["mode"],
            drop_api_key=secret_value(options, "drop-api-key"),
            drop_base_url=options["drop_base_url"],
            approve_uploads=options["approve_uploads"],
            actor=self.actor(),
        )
        if options["json"]:
            self.print_json(_broker_json(broker))
        else:
            self.stdout.write(
                f"Registered broker {broker.broker_id} ({broker.name}, {broker.mode})."
            )

    def handle_list(self, **options: Any) -> None:
        brokers = [_broker_json(b) for b in Broker.objects.all()]
        if options["json"]:
            self.print_json({"items": brokers})
            return
        for b in brokers:
            # A name stored before control characters were refused is shown, not obeyed.
            self.stdout.write(f"{b['broker_id']}  {b['mode']:<10}  {terminal_text(b['name'])}")

    def handle_drop_webhook_secret(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        secret = secret_value(
            {"secret_file": options["secret_file"] or "-", "stdin": options.get("stdin")},
            "secret",
        )
        broker_drop_webhook_secret_set(broker=broker, secret=secret, actor=self.actor())
        url = notifications_url(broker.broker_id)
        if options["json"]:
            self.print_json(
                {"broker_id": broker.broker_id, "drop_webhook_secret_set": True, "url": url}
            )
            return
        self.stdout.write(
            f"Stored the DROP webhook secret of broker {broker.broker_id}. In DROP's portal "
            f"(Notification settings), enter this webhook URL:\n{url}"
        )

    def handle_lists_selected(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        selection = broker_lists_select(
            broker=broker,
            lists=options["lists"].split(","),
            reason=options["reason"],
            actor=self.actor(),
            effective_from=date_bound(options["since"]) if options["since"] else None,
        )
        if options["json"]:
            self.print_json({"broker_id": broker.broker_id, **_selection_fields(selection)})
            return
        self.stdout.write(
            f"Recorded the lists broker {broker.broker_id} selected in DROP's portal: "
            f"{', '.join(DATA_TYPE_OF[t] for t in selection.lists)}, in force from "
            f"{selection.effective_from.isoformat()}."
        )


def _selection_json(selection: ListSelection | None) -> dict[str, Any] | None:
    return None if selection is None else _selection_fields(selection)


def _selection_fields(selection: ListSelection) -> dict[str, Any]:
    return {
        "lists": selection.lists,
        "reason": selection.reason,
        "actor": selection.actor,
        "effective_from": selection.effective_from.isoformat(),
    }


def _broker_json(broker: Broker) -> dict[str, Any]:
    return {
        "broker_id": broker.broker_id,
        "name": broker.name,
        "mode": broker.mode,
        "drop_api_key_set": bool(broker.drop_api_key),
        "drop_webhook_secret_set": bool(broker.drop_webhook_secret),
        "drop_base_url": broker.drop_base_url,
        "approve_uploads": broker.approve_uploads,
        "lists_selected": _selection_json(lists_selected_at(broker)),
    }
