"""API keys: create (the clear key is returned once and never stored), revoke, authenticate.

::

    created = api_key_create(broker=broker, scopes=["ingest"], actor="staff:ann")
    api_keys_revoke(api_keys=[key, other], actor="staff:ann")  # all of them, or none
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from integrations.encryption import decrypt_credential
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    ApiKey,
    ApiKeyScope,
    Broker,
    DeletionRequest,
    Integration,
    IntegrationKind,
    ServiceProvider,
)
from integrations.selectors.rows import model_from_row
from integrations.services.ledger import ledger_event_append
from integrations.validators import column_fits, name_characters_validate

KEY_MARKER = "dpk_"
PREFIX_LENGTH = len(KEY_MARKER) + 8
# last_used_at is a hint for staff, not an audit record: refresh it at most once a minute
# so the callback hot path does not pay an UPDATE per request.
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class CreatedApiKey:
    api_key: ApiKey
    key: str  # the clear key: show it once, it cannot be recovered


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def api_key_create(
    *,
    broker: Broker | None,
    scopes: list[str],
    name: str = "",
    actor: str,
    provider: ServiceProvider | None = None,
) -> CreatedApiKey:
    """A new key of ``broker`` with ``scopes``. ``broker=None``: a ``metrics`` key (that
    scope alone) that sees every broker's series, for the operator's own Prometheus; who
    may create one is the caller's check (superusers in the admin). A ``directive_ack`` key
    (that scope alone) is a service provider's own: ``provider``, one of the broker's."""
    unknown = sorted(set(scopes) - set(ApiKeyScope.values))
    if unknown or not scopes:
        raise ValidationError(
            f"unknown scope {', '.join(unknown)}; choose from {', '.join(ApiKeyScope.values)}"
            if unknown
            else f"a key needs at least one scope: {', '.join(ApiKeyScope.values)}"
        )
    if broker is None and set(scopes) != {ApiKeyScope.METRICS}:
        raise ValidationError(
            "a key without a broker may only have the metrics scope; give a broker"
        )
    if (provider is not None or ApiKeyScope.DIRECTIVE_ACK in scopes) and (
        provider is None
        or broker is None
        or provider.broker_id != broker.pk
        or set(scopes) != {ApiKeyScope.DIRECTIVE_ACK}
    ):
        raise ValidationError(
            "a directive_ack key is a service provider's own: give the provider (one of "
            "the broker's) and that scope alone"
        )
    column_fits(name, ApiKey, "name")
    name_characters_validate(name)
    key = KEY_MARKER + secrets.token_urlsafe(32)  # 256 bits of entropy
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            broker=broker,
            provider=provider,
            name=name,
            prefix=key[:PREFIX_LENGTH],
            digest=key_digest(key),
            scopes=sorted(set(scopes)),
        )
        ledger_event_append(
            kind=LedgerKind.API_KEY_CREATED,
            broker_id=broker.broker_id if broker else "",
            subject=api_key.prefix,
            actor=actor,
            data={
                "name": name,
                "scopes": api_key.scopes,
                "every_broker": broker is None,
                **({"provider_id": provider.pk} if provider is not None else {}),
            },
        )
    return CreatedApiKey(api_key=api_key, key=key)


def api_key_revoke(*, api_key: ApiKey, actor: str) -> ApiKey:
    with transaction.atomic():
        locked = (
            ApiKey.objects.select_for_update(of=("self",))
            .select_related("broker")
            .get(pk=api_key.pk)
        )
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        ledger_event_append(
            kind=LedgerKind.API_KEY_REVOKED,
            broker_id=locked.broker.broker_id if locked.broker else "",
            subject=locked.prefix,
            actor=actor,
        )
    return locked


def api_keys_revoke(*, api_keys: list[ApiKey], actor: str) -> int:
    """Revoke every key of ``api_keys`` in one transaction (each its ledger event): a
    failure revokes none. Returns how many were still active."""
    with transaction.atomic():
        active = list(
            ApiKey.objects.select_for_update()
            .filter(pk__in=[api_key.pk for api_key in api_keys], revoked_at__isnull=True)
            .order_by("pk")
        )
        for api_key in active:
            api_key_revoke(api_key=api_key, actor=actor)
    return len(active)


# Every API call starts here (the callbacks' hot path among them): one SQL function, which
# a callback also asks for the deletion request it answers (docs/benchmarks.md, callbacks).
_LOOKUP = (  # sql/api_key_lookup.sql
    "SELECT * FROM dropportal_api_key_lookup("
    "p_digest => %(digest)s, p_kind => %(kind)s, p_correlation => %(correlation)s)"
)
_KEY_COLUMNS = ("id", "name", "prefix", "scopes", "created_at", "last_used_at")
# What the API reads of the broker; its other fields (the encrypted DROP API key among
# them) load when first read.
_BROKER_COLUMNS = ("id", "broker_id", "name", "mode")
# What a callback reads of the request it answers; the rest loads when first read.
_REQUEST_COLUMNS = (
    "id",
    "request_uuid",
    "broker_id_code",
    "work_item_id",
    "state",
    "drop_outcome",
    "round",
)


def api_key_authenticate(key: str) -> ApiKey | None:
    """The active key matching ``key``, with its broker, or None. Refreshes
    ``last_used_at`` (coarsely)."""
    found = api_key_lookup(key)
    return None if found is None else found[0]


def api_key_lookup(
    key: str, *, kind: IntegrationKind | None = None, correlation: str | None = None
) -> tuple[ApiKey, DeletionRequest | None] | None:
    """``api_key_authenticate``, and in the same query the key's broker's deletion request
    that a callback answers, whatever kind of integration dispatched it: the ``kind`` of
    callback says how ``correlation`` names it: by ``results_token`` (ISI, a request sent
    to an ISI connection) or by ``request_uuid`` (webhook; a valid UUID, any other). It comes
    with its state, outcome and round and its integration's secrets (clear); its other
    fields load when first read. None: no such active key; ``(key, None)``: no such request."""
    digest = key_digest(key)
    with connection.cursor() as cursor:
        cursor.execute(
            _LOOKUP, {"digest": digest, "kind": kind and kind.value, "correlation": correlation}
        )
        row = cursor.fetchone()
    if row is None:
        return None
    # The function's columns, in its order: the key's, the broker's, the request's, then
    # the integration's id and secrets.
    columns = iter(row)
    key_row, broker_row, request_row = (
        [next(columns) for _ in names]
        for names in (_KEY_COLUMNS, _BROKER_COLUMNS, _REQUEST_COLUMNS)
    )
    integration_id, secret, previous_secret, previous_expires_at = columns
    # No broker: a metrics key of every broker (it has no other scope, so no request either).
    broker = (
        None
        if broker_row[0] is None
        else model_from_row(Broker, dict(zip(_BROKER_COLUMNS, broker_row, strict=True)))
    )
    api_key = model_from_row(
        ApiKey,
        {
            **dict(zip(_KEY_COLUMNS, key_row, strict=True)),
            "digest": digest,
            "broker_id": broker.pk if broker else None,
            "revoked_at": None,
        },
    )
    api_key.broker = broker
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    if request_row[0] is None:
        return api_key, None
    assert broker is not None  # a request is only ever found for the key's own broker
    integration = model_from_row(
        Integration,
        {
            "id": integration_id,
            "webhook_secret": decrypt_credential(secret),
            "previous_webhook_secret": decrypt_credential(previous_secret),
            "previous_secret_expires_at": previous_expires_at,
        },
    )
    deletion_request = model_from_row(
        DeletionRequest,
        {
            **dict(zip(_REQUEST_COLUMNS, request_row, strict=True)),
            "broker_id": broker.pk,
            "integration_id": integration.pk,
        },
    )
    deletion_request.integration = integration
    return api_key, deletion_request
