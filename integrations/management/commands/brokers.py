"""``manage.py brokers add|list``: register and list data brokers."""

from __future__ import annotations

from typing import Any

from integrations.management.base import DropportalCommand
from integrations.models import Broker, BrokerMode
from integrations.services.brokers import broker_create


class Command(DropportalCommand):
    help = "Register and list data brokers."

    def add_subcommands(self, subparsers: Any) -> None:
        add = subparsers.add_parser("add", help="register a broker")
        add.add_argument("--broker-id", required=True, help="DROP registration number, 4 digits")
        add.add_argument("--name", required=True)
        add.add_argument("--mode", required=True, choices=BrokerMode.values)
        add.add_argument("--drop-api-key", default="", help="DROP API key (stored encrypted)")
        add.add_argument("--drop-base-url", default="", help="override of DROP's base URL")
        add.add_argument("--json", action="store_true", help="print the broker as JSON")
        listing = subparsers.add_parser("list", help="list brokers")
        listing.add_argument("--json", action="store_true")

    def handle_add(self, **options: Any) -> None:
        broker = broker_create(
            broker_id=options["broker_id"],
            name=options["name"],
            mode=options["mode"],
            drop_api_key=options["drop_api_key"],
            drop_base_url=options["drop_base_url"],
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
            self.stdout.write(f"{b['broker_id']}  {b['mode']:<10}  {b['name']}")


def _broker_json(broker: Broker) -> dict[str, Any]:
    return {
        "broker_id": broker.broker_id,
        "name": broker.name,
        "mode": broker.mode,
        "drop_api_key_set": bool(broker.drop_api_key),
        "drop_base_url": broker.drop_base_url,
    }
