"""The short-lived store of secrets waiting to be shown once (``admin/shown_once.py``).

A secret waits encrypted in its own table, bound to the session that created it, for at most
``SHOWN_ONCE_TTL`` (10 minutes); taking it deletes it, so it is gone once shown, and expired
ones are deleted whenever another is stored, and every few minutes (``tasks.purge_shown_once``)::

    token = shown_once_put(session_key=request.session.session_key, payload={...})
    shown_once_take(session_key=request.session.session_key, token=token)  # the payload, once
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
from typing import Any

from django.db import transaction
from django.utils import timezone

from integrations.models import SHOWN_ONCE_TTL, ShownOnceSecret


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def shown_once_put(*, session_key: str, payload: dict[str, Any]) -> str:
    """Keep ``payload`` for the session; returns the token of the page that shows it."""
    token = secrets.token_urlsafe(24)
    now = timezone.now()
    with transaction.atomic():
        shown_once_purge_expired(now=now)
        ShownOnceSecret.objects.create(
            token_digest=_digest(token),
            session_digest=_digest(session_key),
            payload=json.dumps(payload),
            expires_at=now + SHOWN_ONCE_TTL,
        )
    return token


def shown_once_take(*, session_key: str, token: str) -> dict[str, Any] | None:
    """The payload, deleted as it is read; None when shown already, expired or not this
    session's."""
    with transaction.atomic():
        stored = (
            ShownOnceSecret.objects.select_for_update()
            .filter(token_digest=_digest(token), session_digest=_digest(session_key))
            .first()
        )
        if stored is None:
            return None
        stored.delete()
    if stored.expires_at <= timezone.now():
        return None
    loaded: dict[str, Any] = json.loads(stored.payload)
    return loaded


def shown_once_purge_expired(*, now: dt.datetime | None = None) -> int:
    """Delete the secrets nobody came to see in time; returns how many."""
    deleted, _ = ShownOnceSecret.objects.filter(expires_at__lte=now or timezone.now()).delete()
    return deleted
