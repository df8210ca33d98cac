"""Write paths for third-party SaaS deletion connections (the generic HTTP connector).

A broker with at least one connection (not retired) gets identifier retrieval requests for
its matches; each resolved answer becomes one ``SaasDeletion`` per connection not retired. A
disabled connection is paused: its deletions wait until it is enabled. A retired one is gone::

    saas_connection_create(broker=broker, name="Mailer", url="https://api.mailer.example/erase",
                           token="tok", categories=["email"], actor="cli:ann")
    saas_connection_retire(connection=connection, reason="contract ended", actor="cli:ann")
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models.functions import Now
from django.utils import timezone

from integrations import enqueue
from integrations.dispatch.saas import categories_or_default
from integrations.drop.calendar import drop_time_text
from integrations.drop.download_zip import escaped
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, RequestState, SaasConnection, SaasDeletion
from integrations.services.dispatch.resolutions import FINAL_SAAS_STATES, resolution_settle
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import matching_lock
from integrations.services.row_updates import Audited, row_locked, row_update
from integrations.validators import (
    bearer_token_validate,
    column_fits,
    disabled_reason_validate,
    name_characters_validate,
    target_url_validate,
)

_CATEGORY_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
# How much of a refused value the message repeats: enough to find it, never a whole file.
_SHOWN_MAX = 40


def categories_validate(categories: Iterable[str] | None) -> list[str]:
    """Identifier categories as the broker names them (``email``, ``phone``, ...); None
    (not given) is the default, ``email``. Given, they must name one: an empty value or
    only commas is a mistake, not a request for the default."""
    if categories is None:
        return categories_or_default([])
    cleaned = [c.strip() for c in categories if c.strip()]
    bad = [c for c in cleaned if not _CATEGORY_RE.fullmatch(c)]
    if bad:
        listed = ", ".join(bad)
        # Its start only, escaped (a control character is shown, not obeyed); 10: the
        # longest escape, so none of those characters is left out.
        shown = escaped(listed[:_SHOWN_MAX], 10 * _SHOWN_MAX)
        shown += "..." if len(listed) > _SHOWN_MAX else ""
        raise ValidationError(
            {"categories": f"not a category name: {shown} (lower-case, like email)"}
        )
    if not cleaned:
        raise ValidationError(
            {"categories": "name at least one identifier category (lower-case, like email)"}
        )
    return list(dict.fromkeys(cleaned))


def saas_connection_create(
    *,
    broker: Broker,
    name: str,
    url: str,
    token: str = "",
    categories: Iterable[str] | None = None,
    actor: str,
) -> SaasConnection:
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise ValidationError({"name": "a name of 1 to 200 characters is required"})
    name_characters_validate(name)
    url = target_url_validate(url)
    connection = SaasConnection(
        broker=broker,
        name=name,
        url=url,
        token=bearer_token_validate((token or "").strip()),
        identifier_categories=categories_validate(categories),
    )
    connection.token_changed_at = timezone.now() if connection.token else None
    with transaction.atomic():
        connection.save()
        ledger_event_append(
            kind=LedgerKind.SAAS_CONNECTION_CREATED,
            broker_id=broker.broker_id,
            subject=str(connection.pk),
            actor=actor,
            data={
                "name": name,
                "url": url,
                "categories": connection.identifier_categories,
                "token_set": bool(connection.token),
            },
        )
    return connection


def saas_connection_update(
    *,
    connection: SaasConnection,
    actor: str,
    name: str | None = None,
    url: str | None = None,
    token: str | None = None,
    categories: Iterable[str] | None = None,
) -> SaasConnection:
    """Change what is given; ``token`` None keeps the current token. The token is never logged.

    A credential follows its destination: a new URL without a new token clears the stored
    token (it was entered for the old address), and the ledger event says so.
    """
    changes: dict[str, object] = {}
    if name is not None:
        name = name.strip()
        if not name or len(name) > 200:
            raise ValidationError({"name": "a name of 1 to 200 characters is required"})
        changes["name"] = name_characters_validate(name)
    if url is not None:
        changes["url"] = target_url_validate(url)
    if categories is not None:
        changes["identifier_categories"] = categories_validate(categories)
    if token is not None:
        token = bearer_token_validate(token.strip())

    with transaction.atomic():
        quiet, entries = _token_follows_url(row_locked(connection), changes, token)
        return row_update(
            connection,
            changes=changes,
            quiet=quiet,
            entries=entries,
            audit=Audited(
                LedgerKind.SAAS_CONNECTION_UPDATED,
                broker_id=connection.broker.broker_id,
                subject=str(connection.pk),
                actor=actor,
            ),
        )


def _token_follows_url(
    current: SaasConnection, changes: dict[str, object], token: str | None
) -> tuple[dict[str, object], dict[str, dict[str, object]]]:
    """The token columns to write and their ledger entry: a new token, or a cleared one when
    the URL changes without one (it was entered for the old address); none otherwise."""
    entry: dict[str, object]
    if token is not None and token != current.token:
        value, entry = token, {"changed": True}
    elif changes.get("url", current.url) != current.url and current.token:
        value = ""
        entry = {"cleared": True, "reason": "the URL it is sent to changed; enter the token again"}
    else:
        return {}, {}
    return {"token": value, "token_changed_at": timezone.now()}, {"token": entry}


def saas_connection_disable(
    *, connection: SaasConnection, reason: str, actor: str
) -> SaasConnection:
    """Pause it: its deletions (those of answers received meanwhile included) wait until it is
    enabled again, and their work items owe a status until then (or until it is retired)."""
    reason = disabled_reason_validate(reason, SaasConnection)
    with transaction.atomic():
        locked = (
            SaasConnection.objects.select_for_update(of=("self",))
            .select_related("broker")
            .get(pk=connection.pk)
        )
        if not locked.enabled:
            return locked
        locked.enabled = False
        locked.disabled_reason = reason
        locked.save(update_fields=["enabled", "disabled_reason"])
        ledger_event_append(
            kind=LedgerKind.SAAS_CONNECTION_DISABLED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.pk),
            actor=actor,
            data={"name": locked.name, "reason": reason},
        )
    return locked


def saas_connection_enable(*, connection: SaasConnection, actor: str) -> int:
    """Enable it and queue the deletions that waited; returns how many were queued."""
    # Already enabled: no lock (see ``integration_enable``).
    if SaasConnection.objects.filter(pk=connection.pk, enabled=True).exists():
        return 0
    with transaction.atomic():
        # The deletions before the connection, as retiring takes them (``_deletions_locked``).
        waiting = _deletions_locked(
            models.Q(saas_connection=connection.pk, state=RequestState.QUEUED)
            & (models.Q(next_attempt_at__isnull=True) | models.Q(next_attempt_at__lte=Now()))
        )
        locked = (
            SaasConnection.objects.select_for_update(of=("self",))
            .select_related("broker")
            .get(pk=connection.pk)
        )
        if locked.enabled:
            # Enabled meanwhile: its job may have skipped the rows held here (see
            # ``integration_enable``); queue them again.
            if waiting:
                enqueue.saas_deletions_enqueue(waiting)
            return 0
        if locked.retired_at is not None:
            raise ValidationError(
                f"SaaS connection {locked.uuid} ({locked.name}) was retired on "
                f"{drop_time_text(locked.retired_at)} ({locked.retired_reason}): retired is final; "
                "add a new connection instead"
            )
        reason = locked.disabled_reason
        locked.enabled, locked.disabled_reason = True, ""
        locked.save(update_fields=["enabled", "disabled_reason"])
        # The database's time, as the delivery loop's due check reads it (``redelivery``).
        SaasDeletion.objects.filter(pk__in=waiting).update(next_attempt_at=Now())
        if waiting:
            enqueue.saas_deletions_enqueue(waiting)
        ledger_event_append(
            kind=LedgerKind.SAAS_CONNECTION_ENABLED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.pk),
            actor=actor,
            data={"name": locked.name, "was_disabled_because": reason, "queued": len(waiting)},
        )
    return len(waiting)


@dataclass(frozen=True)
class SaasConnectionRetired:
    connection: SaasConnection
    deletions_cancelled: int
    work_items: int  # the work items of their resolutions, settled again


def saas_connection_retire(
    *, connection: SaasConnection, reason: str, actor: str
) -> SaasConnectionRetired:
    """End the connection for good: no SaaS deletion is made for it any more, and it can never
    be enabled again (add a new one instead). One transaction, one ledger event.

    Its deletions not final are cancelled with ``reason``; each resolution they belonged to
    is settled again (its identifiers purged once nothing needs them, its work item settled on
    its other requests). Raises ValidationError (nothing written) without a reason or when
    already retired.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": "say why the SaaS connection is retired (--reason)"})
    column_fits(reason, SaasConnection, "retired_reason", key="reason")
    with transaction.atomic():
        # Settling items of several cycles at once: under the broker's matching lock, as
        # every such writer is (sql/outstanding_cycles.sql: two could wait on each other's
        # new marks of a cleared cycle). Taken first, then its open deletions, then it
        # (``matching_lock``).
        matching_lock(broker=connection.broker)
        _deletions_locked(
            models.Q(saas_connection=connection.pk) & ~models.Q(state__in=FINAL_SAAS_STATES)
        )
        locked = (
            SaasConnection.objects.select_for_update(of=("self",))
            .select_related("broker")
            .get(pk=connection.pk)
        )
        if locked.retired_at is not None:
            raise ValidationError(
                f"SaaS connection {locked.uuid} ({locked.name}) was already retired on "
                f"{drop_time_text(locked.retired_at)}: {locked.retired_reason}"
            )
        now = timezone.now()
        was_enabled = locked.enabled
        locked.enabled = False
        locked.retired_at = now
        locked.retired_reason = reason
        locked.save(update_fields=["enabled", "retired_at", "retired_reason"])
        open_deletions = SaasDeletion.objects.filter(saas_connection=locked).exclude(
            state__in=FINAL_SAAS_STATES
        )
        # Settled in their work items' order, as every path settling several (``matching_lock``).
        settled = sorted(
            set(open_deletions.values_list("resolution__work_item_id", "resolution_id"))
        )
        work_items = len({item for item, _ in settled})
        cancelled = open_deletions.update(
            state=RequestState.CANCELLED,
            next_attempt_at=None,
            completed_at=now,
            last_error=f"target retired: {reason}",
        )
        ledger_event_append(
            kind=LedgerKind.SAAS_CONNECTION_RETIRED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.pk),
            actor=actor,
            data={
                "name": locked.name,
                "reason": reason,
                "was_enabled": was_enabled,
                "deletions_cancelled": cancelled,
                "work_items": work_items,
            },
        )
        for _, resolution_id in settled:
            resolution_settle(resolution_id=resolution_id, actor=actor)
    return SaasConnectionRetired(locked, cancelled, work_items)


def _deletions_locked(which: models.Q) -> list[int]:
    """The ids of the SaaS deletions ``which`` selects, locked.

    Taken before their connection's row, in the order a delivery batch takes them: it holds
    its deletions and then, answered 410 Gone, disables their connection. A service holding
    the connection while it waited for a batch's deletions would deadlock with it.
    """
    return list(
        SaasDeletion.objects.select_for_update()
        .filter(which)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
