"""``manage.py saas add|retire|list``: third-party SaaS deletion connections (generic HTTP).

Each one receives ``POST <url>`` with ``Authorization: Bearer <token>`` and the resolved
identifiers of its categories (docs/contracts.md §7). ``retire UUID --reason TEXT`` ends one for
good: its deletions not final are cancelled, and it is never enabled again (its id, as
earlier versions showed it, is still taken).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import CommandError

from integrations.ascii_integers import ascii_integer
from integrations.management.base import (
    DropportalCommand,
    add_secret_argument,
    broker_or_error,
    broker_or_every,
    secret_value,
    terminal_text,
)
from integrations.models import SaasConnection
from integrations.services.staff.saas import saas_connection_create, saas_connection_retire
from integrations.url_extras import without_url_extras


class Command(DropportalCommand):
    help = "Add and list third-party SaaS deletion connections."

    def add_subcommands(self, subparsers: Any) -> None:
        add = subparsers.add_parser("add", help="add a generic HTTP SaaS deletion connection")
        add.add_argument("--broker", required=True, help="broker id, 4 digits")
        add.add_argument("--name", required=True)
        add.add_argument("--url", required=True, help="where deletions are POSTed (https)")
        add_secret_argument(add, "token", "token, sent as 'Authorization: Bearer <token>'")
        add.add_argument(
            "--categories",
            default="email",
            help="comma-separated identifier categories it deletes by (default: email)",
        )
        add.add_argument("--json", action="store_true")
        retire = subparsers.add_parser(
            "retire",
            help="end a SaaS connection for good: cancel its open deletions, never enable it again",
        )
        retire.add_argument(
            "uuid", help="the connection's UUID, as 'saas list' shows it (or its numeric id)"
        )
        retire.add_argument(
            "--reason", required=True, help="why (the cancelled deletions and the ledger keep it)"
        )
        retire.add_argument("--json", action="store_true")
        listing = subparsers.add_parser("list", help="list SaaS connections")
        listing.add_argument("--broker", help="only this broker's")
        listing.add_argument("--json", action="store_true")

    def handle_add(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        connection = saas_connection_create(
            broker=broker,
            name=options["name"],
            url=options["url"],
            token=secret_value(options, "token"),
            categories=options["categories"].split(","),
            actor=self.actor(),
        )
        row = _row(connection)
        if options["json"]:
            self.print_json(row)
            return
        self.stdout.write(
            f"SaaS connection {connection.uuid} ({connection.name}) added for broker "
            f"{broker.broker_id}: {connection.url}, categories "
            f"{', '.join(connection.identifier_categories)}"
        )

    def handle_retire(self, **options: Any) -> None:
        value = options["uuid"]
        connection = _connection(value)
        if connection is None:
            raise CommandError(f"no SaaS connection {value!r} (see: manage.py saas list)")
        retired = saas_connection_retire(
            connection=connection, reason=options["reason"], actor=self.actor()
        )
        if options["json"]:
            self.print_json(
                {
                    **_row(retired.connection),
                    "deletions_cancelled": retired.deletions_cancelled,
                    "work_items": retired.work_items,
                }
            )
            return
        self.stdout.write(
            f"SaaS connection {connection.uuid} ({connection.name}) retired for good: "
            f"{retired.deletions_cancelled} deletion(s) cancelled; {retired.work_items} work "
            "item(s) settled on their other requests."
        )

    def handle_list(self, **options: Any) -> None:
        connections = SaasConnection.objects.select_related("broker").order_by(
            "broker__broker_id", "name"
        )
        broker = broker_or_every(options["broker"])
        if broker is not None:
            connections = connections.filter(broker=broker)
        rows = [_row(c) for c in connections]
        if options["json"]:
            self.print_json({"items": rows})
            return
        for r in rows:
            # A name stored before control characters were refused, a reason (free text):
            # shown escaped, not obeyed.
            state = (
                "enabled" if r["enabled"] else f"DISABLED ({terminal_text(r['disabled_reason'])})"
            )
            if r["retired_at"]:
                state = f"RETIRED ({terminal_text(r['retired_reason'])})"
            self.stdout.write(
                f"{r['uuid']}  {r['broker_id']}  {terminal_text(r['name'])}  {r['url']}  "
                f"{','.join(r['categories'])}  {state}"
            )


def _connection(value: str) -> SaasConnection | None:
    """The connection named by its UUID, or by its id (as ``saas list`` showed it before it
    showed UUIDs)."""
    connections = SaasConnection.objects.select_related("broker")
    try:
        return connections.filter(uuid=uuid.UUID(value)).first()
    except ValueError:  # not a UUID (one of only digits is: 32 of them)
        pk = ascii_integer(value)
        return None if pk is None else connections.filter(pk=pk).first()


def _row(connection: SaasConnection) -> dict[str, Any]:
    return {
        "uuid": str(connection.uuid),
        "id": connection.pk,
        "broker_id": connection.broker.broker_id,
        "name": connection.name,
        "url": without_url_extras(connection.url),  # its query may carry a token
        "categories": connection.identifier_categories,
        "token_set": bool(connection.token),
        "enabled": connection.enabled,
        "disabled_reason": connection.disabled_reason,
        "retired_at": connection.retired_at.isoformat() if connection.retired_at else None,
        "retired_reason": connection.retired_reason,
    }
