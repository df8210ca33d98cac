"""``manage.py apikeys create|revoke|list``: the broker-facing API's keys."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from integrations.drop.calendar import drop_time_text
from integrations.management.base import DropportalCommand, broker_or_error, terminal_text
from integrations.models import ApiKey, ApiKeyScope, ServiceProvider
from integrations.services.staff.keys import api_key_create, api_key_revoke


class Command(DropportalCommand):
    help = "Create, revoke and list API keys."

    def add_subcommands(self, subparsers: Any) -> None:
        create = subparsers.add_parser("create", help="create a key (shown once)")
        owner = create.add_mutually_exclusive_group(required=True)
        owner.add_argument("--broker", help="broker id, 4 digits")
        owner.add_argument(
            "--all-brokers",
            action="store_true",
            help="a metrics key that sees every broker's series (your own Prometheus)",
        )
        create.add_argument(
            "--scope", action="append", required=True, choices=ApiKeyScope.values, dest="scopes"
        )
        create.add_argument("--name", default="")
        create.add_argument(
            "--provider",
            type=int,
            default=None,
            help="a service provider's id (providers list): its own directive_ack key",
        )
        create.add_argument("--json", action="store_true")
        revoke = subparsers.add_parser("revoke", help="revoke a key by its prefix")
        revoke.add_argument("prefix")
        listing = subparsers.add_parser("list", help="list keys")
        listing.add_argument("--json", action="store_true")

    def handle_create(self, **options: Any) -> None:
        broker = None if options["all_brokers"] else broker_or_error(options["broker"])
        provider = None
        if options["provider"] is not None:
            provider = ServiceProvider.objects.filter(pk=options["provider"], broker=broker).first()
            if provider is None:
                raise CommandError(f"the broker has no service provider {options['provider']}")
        created = api_key_create(
            broker=broker,
            scopes=options["scopes"],
            name=options["name"],
            actor=self.actor(),
            provider=provider,
        )
        if options["json"]:
            self.print_json(
                {
                    "key": created.key,
                    "prefix": created.api_key.prefix,
                    "scopes": created.api_key.scopes,
                    "broker_id": broker.broker_id if broker else None,
                    "name": created.api_key.name,
                    "provider_id": provider.pk if provider else None,
                }
            )
            return
        self.stdout.write(f"API key (shown once, store it now): {created.key}")
        self.stdout.write(
            f"prefix: {created.api_key.prefix}  scopes: {', '.join(created.api_key.scopes)}"
        )

    def handle_revoke(self, **options: Any) -> None:
        try:
            api_key = ApiKey.objects.get(prefix=options["prefix"])
        except ApiKey.DoesNotExist:
            raise CommandError(f"no API key with prefix {options['prefix']!r}") from None
        was_revoked = api_key.is_revoked
        api_key_revoke(api_key=api_key, actor=self.actor())
        self.stdout.write(
            f"Key {api_key.prefix} {'was already' if was_revoked else 'is now'} revoked."
        )

    def handle_list(self, **options: Any) -> None:
        keys = list(ApiKey.objects.select_related("broker"))
        if options["json"]:
            rows = [
                {
                    "prefix": k.prefix,
                    "name": k.name,
                    "broker_id": k.broker.broker_id if k.broker else None,  # None: every broker
                    "scopes": k.scopes,
                    "provider_id": k.provider_id,  # a directive_ack key's service provider
                    "created_at": k.created_at.isoformat(),
                    "last_used_at": k.last_used_at.isoformat() if k.last_used_at else None,
                    "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
                }
                for k in keys
            ]
            self.print_json({"items": rows})
            return
        for k in keys:
            state = f"revoked {drop_time_text(k.revoked_at)}" if k.revoked_at else "active"
            last_used = drop_time_text(k.last_used_at) if k.last_used_at else "never"
            self.stdout.write(
                f"{k.prefix}  {k.broker.broker_id if k.broker else 'all '}  "
                f"{','.join(k.scopes):<30} created {drop_time_text(k.created_at)}  {state}"
                f"  last used {last_used}  {terminal_text(k.name)}"
            )
