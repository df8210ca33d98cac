"""``manage.py integrations add webhook|isi, rotate-secret, check-connection, disable, enable,
retire, list``: where the broker's systems are reached, and their Webhook Secrets.

``disable`` pauses an integration (it stays a deletion target, its requests wait);
``retire`` ends it for good (its open requests are cancelled, it is never enabled again).

``add`` takes the integration kind as its own subcommand (``add webhook ...``); each kind is
an ``add_<kind>`` method with its arguments declared in ``add_<kind>_arguments``, so a new
kind (ISI) is two methods and one line in ``ADD_KINDS``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import CommandError

from integrations.dispatch.isi import IsiError
from integrations.management.base import (
    DropportalCommand,
    add_secret_argument,
    broker_or_error,
    broker_or_every,
    secret_value,
    terminal_text,
)
from integrations.models import Integration, IntegrationKind, IsiConnection
from integrations.selectors.targets import broker_targets
from integrations.services.cycle.isi_connections import isi_connections_refresh
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    integration_retire,
    integration_secret_rotate,
    webhook_integration_create,
)
from integrations.services.staff.isi import isi_integration_create
from integrations.url_extras import without_url_extras

ADD_KINDS = {
    "webhook": "a webhook integration: signed POSTs to a URL of the broker",
    "isi": "an ISI integration: calls to the broker's own REST API",
}


def connections_json(connections: list[IsiConnection]) -> list[dict[str, Any]]:
    return [
        {
            "uuid": str(c.uuid),
            "capabilities": c.capabilities,
            "listed": c.listed,
            "takes_part_in_drop": c.takes_part_in_drop,
            "not_taking_part_because": c.drop_exclusion,
        }
        for c in connections
    ]


def integration_or_error(value: str) -> Integration:
    try:
        key = uuid.UUID(value)
    except ValueError:
        raise CommandError(f"not an integration UUID: {value!r}") from None
    try:
        return Integration.objects.select_related("broker").get(uuid=key)
    except Integration.DoesNotExist:
        raise CommandError(f"no integration with UUID {value}") from None


class Command(DropportalCommand):
    help = "Add integrations, rotate their Webhook Secret, list them."

    def add_subcommands(self, subparsers: Any) -> None:
        add = subparsers.add_parser("add", help="add an integration")
        kinds = add.add_subparsers(dest="kind", required=True, metavar="KIND")
        for kind, description in ADD_KINDS.items():
            parser = kinds.add_parser(kind, help=description)
            parser.add_argument("--broker", required=True, help="broker id, 4 digits")
            parser.add_argument("--name", required=True, help="integration_name")
            parser.add_argument("--json", action="store_true")
            getattr(self, f"add_{kind}_arguments")(parser)
        rotate = subparsers.add_parser(
            "rotate-secret", help="new Webhook Secret; the old one stays valid 24 h"
        )
        rotate.add_argument("uuid")
        rotate.add_argument("--json", action="store_true")
        check = subparsers.add_parser(
            "check-connection", help="list an ISI integration's connections from its API now"
        )
        check.add_argument("uuid")
        check.add_argument("--json", action="store_true")
        disable = subparsers.add_parser(
            "disable", help="stop delivering to an integration; what is queued waits"
        )
        disable.add_argument("uuid")
        disable.add_argument("--reason", default="", help="why (shown to staff, in the ledger)")
        disable.add_argument("--json", action="store_true")
        enable = subparsers.add_parser(
            "enable",
            help="deliver to an integration again: queue what waited, target pending requests",
        )
        enable.add_argument("uuid")
        enable.add_argument("--json", action="store_true")
        retire = subparsers.add_parser(
            "retire",
            help="end an integration for good: cancel its open requests, never enable it again",
        )
        retire.add_argument("uuid")
        retire.add_argument(
            "--reason", required=True, help="why (the cancelled requests and the ledger keep it)"
        )
        retire.add_argument("--json", action="store_true")
        listing = subparsers.add_parser("list", help="list integrations")
        listing.add_argument("--broker", help="only this broker's")
        listing.add_argument("--json", action="store_true")

    # -- add -------------------------------------------------------------------------------

    def handle_add(self, **options: Any) -> None:
        getattr(self, f"add_{options.pop('kind')}")(**options)

    def add_webhook_arguments(self, parser: Any) -> None:
        parser.add_argument("--url", required=True, help="where dispatches are POSTed (https)")

    def add_webhook(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        created = webhook_integration_create(
            broker=broker, name=options["name"], url=options["url"], actor=self.actor()
        )
        integration = created.integration
        if options["json"]:
            self.print_json(
                {
                    "uuid": str(integration.uuid),
                    "webhook_secret": created.webhook_secret,
                    "kind": integration.kind,
                    "name": integration.name,
                    "url": integration.url,
                    "broker_id": broker.broker_id,
                }
            )
            return
        self.stdout.write(f"Integration {integration.uuid} ({integration.name}) added.")
        self.stdout.write(
            f"Webhook Secret (shown once, give it to the broker now): {created.webhook_secret}"
        )

    def add_isi_arguments(self, parser: Any) -> None:
        parser.add_argument("--base-url", required=True, help="the broker's API (https)")
        add_secret_argument(parser, "token", "static bearer token")
        parser.add_argument("--token-url", default="", help="OAuth 2.0 token endpoint (https)")
        parser.add_argument("--client-id", default="", help="OAuth 2.0 client id")
        add_secret_argument(parser, "client-secret", "OAuth 2.0 client secret")

    def add_isi(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        created = isi_integration_create(
            broker=broker,
            name=options["name"],
            base_url=options["base_url"],
            token=secret_value(options, "token"),
            token_url=options["token_url"],
            client_id=options["client_id"],
            client_secret=secret_value(options, "client-secret"),
            actor=self.actor(),
        )
        integration = created.integration
        if created.connections_error:
            # Created all the same: its secret is shown only now, and the broker's API may
            # simply not be reachable yet.
            self.stderr.write(
                f"Connections could not be listed: {created.connections_error}. Once fixed, "
                f"run: manage.py integrations check-connection {integration.uuid}"
            )
        if options["json"]:
            self.print_json(
                {
                    "uuid": str(integration.uuid),
                    "webhook_secret": created.webhook_secret,
                    "connections": connections_json(created.connections),
                    "connections_error": created.connections_error,
                    "kind": integration.kind,
                    "name": integration.name,
                    "base_url": integration.base_url,
                    "auth": integration.auth,
                    "broker_id": broker.broker_id,
                }
            )
            return
        self.stdout.write(f"Integration {integration.uuid} ({integration.name}) added.")
        self.stdout.write(
            f"Webhook Secret (shown once, give it to the broker now): {created.webhook_secret}"
        )
        if not created.connections_error:
            self._write_connections(created.connections)

    def _write_connections(self, connections: list[IsiConnection]) -> None:
        taking_part = sum(1 for c in connections if c.takes_part_in_drop)
        self.stdout.write(f"Connections: {taking_part} of {len(connections)} take part in DROP.")
        for c in connections:
            verdict = "takes part" if c.takes_part_in_drop else f"not: {c.drop_exclusion}"
            self.stdout.write(f"  {c.uuid}  {verdict}")

    # -- check-connection --------------------------------------------------------------------

    def handle_check_connection(self, **options: Any) -> None:
        integration = integration_or_error(options["uuid"])
        if integration.kind != IntegrationKind.ISI:
            raise CommandError(
                f"{integration.uuid} is a {integration.kind} integration: only ISI integrations "
                "have connections"
            )
        try:
            refreshed = isi_connections_refresh(integration=integration, actor=self.actor())
        except IsiError as exc:
            raise CommandError(f"connections not listed: {exc}") from None
        if options["json"]:
            self.print_json(
                {
                    "uuid": str(integration.uuid),
                    "method": refreshed.method,
                    "status": refreshed.status,
                    "connections": connections_json(refreshed.connections),
                    "pending_requests_queued": refreshed.pending_requests_queued,
                }
            )
            return
        self.stdout.write(f"{refreshed.method} {integration.base_url}: HTTP {refreshed.status}.")
        self._write_connections(refreshed.connections)
        if refreshed.pending_requests_queued:
            self.stdout.write(
                f"{refreshed.pending_requests_queued} request(s) waiting for a target queued."
            )

    # -- rotate-secret -----------------------------------------------------------------------

    def handle_rotate_secret(self, **options: Any) -> None:
        integration = integration_or_error(options["uuid"])
        secret = integration_secret_rotate(integration=integration, actor=self.actor())
        valid_until = integration.previous_secret_expires_at
        assert valid_until is not None
        if options["json"]:
            self.print_json(
                {
                    "uuid": str(integration.uuid),
                    "webhook_secret": secret,
                    "previous_secret_valid_until": valid_until.isoformat(),
                }
            )
            return
        self.stdout.write(f"New Webhook Secret (shown once): {secret}")
        self.stdout.write(f"The previous secret stays valid until {valid_until.isoformat()}.")

    # -- disable / enable --------------------------------------------------------------------

    def handle_disable(self, **options: Any) -> None:
        integration = integration_or_error(options["uuid"])
        was_enabled = integration.enabled
        disabled = integration_disable(
            integration=integration, reason=options["reason"], actor=self.actor()
        )
        if options["json"]:
            self.print_json(
                {
                    "uuid": str(disabled.uuid),
                    "enabled": disabled.enabled,
                    "disabled_reason": disabled.disabled_reason,
                    "changed": was_enabled,
                }
            )
            return
        if not was_enabled:
            self.stdout.write(
                f"Integration {disabled.uuid} ({disabled.name}) was already disabled"
                f" ({disabled.disabled_reason or 'by staff'})."
            )
            return
        self.stdout.write(
            f"Integration {disabled.uuid} ({disabled.name}) disabled: {disabled.disabled_reason}."
            f" Queued deliveries wait; enable it with: manage.py integrations enable"
            f" {disabled.uuid}"
        )

    def handle_enable(self, **options: Any) -> None:
        integration = integration_or_error(options["uuid"])
        was_enabled = integration.enabled
        queued = integration_enable(integration=integration, actor=self.actor())
        if options["json"]:
            self.print_json(
                {
                    "uuid": str(integration.uuid),
                    "enabled": True,
                    "changed": not was_enabled,
                    "requests_queued": queued,
                }
            )
            return
        if was_enabled:
            self.stdout.write(f"Integration {integration.uuid} ({integration.name}) was enabled.")
            return
        self.stdout.write(
            f"Integration {integration.uuid} ({integration.name}) enabled;"
            f" {queued} request(s) queued for delivery."
        )

    def handle_retire(self, **options: Any) -> None:
        integration = integration_or_error(options["uuid"])
        retired = integration_retire(
            integration=integration, reason=options["reason"], actor=self.actor()
        )
        retired_at = retired.integration.retired_at
        if options["json"]:
            self.print_json(
                {
                    "uuid": str(integration.uuid),
                    "retired_at": retired_at.isoformat() if retired_at else None,
                    "retired_reason": retired.integration.retired_reason,
                    "deletion_requests_cancelled": retired.deletion_requests_cancelled,
                    "resolution_requests_cancelled": retired.resolution_requests_cancelled,
                    "work_items": retired.work_items,
                    "waiting_for_a_target": retired.waiting_for_a_target,
                    "pending_requests_queued": retired.pending_requests_queued,
                }
            )
            return
        self.stdout.write(
            f"Integration {integration.uuid} ({integration.name}) retired for good: "
            f"{retired.deletion_requests_cancelled} deletion and "
            f"{retired.resolution_requests_cancelled} resolution request(s) cancelled; "
            f"{retired.work_items} work item(s) settled on their other requests."
        )
        if retired.waiting_for_a_target:
            self.stdout.write(
                f"{retired.waiting_for_a_target} match(es) had no other request: they wait for "
                f"a target ({retired.pending_requests_queued} queued to another one at once)."
            )

    # -- list --------------------------------------------------------------------------------

    def handle_list(self, **options: Any) -> None:
        broker = broker_or_every(options["broker"])
        integrations = broker_targets(broker)
        rows = [
            {
                "uuid": str(i.uuid),
                "broker_id": i.broker.broker_id,
                "kind": i.kind,
                "name": i.name,
                # A URL's query may carry a token: never printed.
                "url": without_url_extras(i.url or i.base_url),
                "enabled": i.enabled,
                "disabled_reason": i.disabled_reason,
                "retired_at": i.retired_at.isoformat() if i.retired_at else None,
            }
            for i in integrations
        ]
        if options["json"]:
            self.print_json({"items": rows})
            return
        for r in rows:
            # A name stored before control characters were refused, a reason (free text):
            # shown escaped, not obeyed.
            reason = terminal_text(str(r["disabled_reason"]))
            state = "enabled" if r["enabled"] else f"DISABLED ({reason})"
            if r["retired_at"]:
                state = "RETIRED"
            self.stdout.write(
                f"{r['uuid']}  {r['broker_id']}  {r['kind']:<7} {terminal_text(str(r['name']))}  "
                f"{r['url']}  {state}"
            )
