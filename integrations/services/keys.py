"""API keys: create (the clear key is returned once and never stored), revoke, authenticate."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from integrations.models import ApiKey, ApiKeyScope, Broker
from integrations.services.ledger import ledger_event_append

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
    *, broker: Broker, scopes: list[str], name: str = "", actor: str
) -> CreatedApiKey:
    unknown = sorted(set(scopes) - set(ApiKeyScope.values))
    if unknown or not scopes:
        raise ValidationError(
            f"unknown scope {', '.join(unknown)}; choose from {', '.join(ApiKeyScope.values)}"
            if unknown
            else f"a key needs at least one scope: {', '.join(ApiKeyScope.values)}"
        )
    key = KEY_MARKER + secrets.token_urlsafe(32)  # 256 bits of entropy
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            broker=broker,
            name=name,
            prefix=key[:PREFIX_LENGTH],
            digest=key_digest(key),
            scopes=sorted(set(scopes)),
        )
        ledger_event_append(
            kind="api_key.created",
            broker_id=broker.broker_id,
            subject=api_key.prefix,
            actor=actor,
            data={"name": name, "scopes": api_key.scopes},
        )
    return CreatedApiKey(api_key=api_key, key=key)


def api_key_revoke(*, api_key: ApiKey, actor: str) -> ApiKey:
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().select_related("broker").get(pk=api_key.pk)
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        ledger_event_append(
            kind="api_key.revoked",
            broker_id=locked.broker.broker_id,
            subject=locked.prefix,
            actor=actor,
        )
    return locked


def api_key_authenticate(key: str) -> ApiKey | None:
    """The active key matching ``key``, or None. Refreshes ``last_used_at`` (coarsely)."""
    api_key = (
        ApiKey.objects.active().select_related("broker").filter(digest=key_digest(key)).first()
    )
    if api_key is None:
        return None
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    return api_key
