"""Write paths for brokers: each one transaction with its ledger event."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from integrations.drop.client import drop_api_key_problem, drop_base_url_problem
from integrations.ledger_kinds import LedgerKind
from integrations.list_types import DATA_TYPE_OF, HASH_TYPES
from integrations.models import Broker, BrokerMode, ListSelection
from integrations.selectors.list_selection import lists_selected_at
from integrations.services.cycle.drop import broker_drop_url
from integrations.services.ledger import ledger_event_append
from integrations.services.reporting.report_approval import report_files_hold_for_approval
from integrations.services.row_updates import Audited, row_locked, row_update
from integrations.validators import name_characters_validate, url_credentials_validate

# The broker settings staff change (``broker_update``), each recorded in its ledger event.
BROKER_SETTINGS = (
    "name",
    "mode",
    "drop_base_url",
    "auto_pull",
    "pull_interval_days",
    "approve_uploads",
)


def drop_base_url_check(url: str) -> None:
    """ValidationError keyed ``drop_base_url`` if ``url`` carries a user name or password,
    or is one the DROP client refuses (plain http, a query): refused when stored, not at
    every pull and upload."""
    # The DROP API key goes in a header; a user:password part would go along as Basic auth.
    url_credentials_validate(url, field="drop_base_url")
    problem = url and drop_base_url_problem(
        url, allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS
    )
    if problem:
        raise ValidationError({"drop_base_url": problem})


def drop_api_key_check(key: str) -> None:
    """ValidationError keyed ``drop_api_key`` if ``key`` is one the DROP client refuses
    (a space pasted with it, say); an empty key is none."""
    problem = key and drop_api_key_problem(key)
    if problem:
        raise ValidationError({"drop_api_key": problem})


def broker_create(
    *,
    broker_id: str,
    name: str,
    mode: str = BrokerMode.TEST,
    drop_api_key: str = "",
    drop_base_url: str = "",
    auto_pull: bool = False,
    pull_interval_days: int = 30,
    approve_uploads: bool = False,
    actor: str,
) -> Broker:
    """Register a broker. Raises ValidationError (nothing written) on bad or duplicate input."""
    broker = Broker(
        broker_id=broker_id,
        name=name,
        mode=mode,
        drop_api_key=drop_api_key,
        drop_base_url=drop_base_url,
        auto_pull=auto_pull,
        pull_interval_days=pull_interval_days,
        approve_uploads=approve_uploads,
        drop_api_key_changed_at=timezone.now() if drop_api_key else None,
    )
    name_characters_validate(name)
    drop_base_url_check(drop_base_url)
    drop_api_key_check(drop_api_key)
    broker.full_clean()  # also reports a broker id that is already registered
    try:
        with transaction.atomic():
            broker.save()
            ledger_event_append(
                kind=LedgerKind.BROKER_CREATED,
                broker_id=broker.broker_id,
                subject=broker.broker_id,
                actor=actor,
                data={
                    **{field: getattr(broker, field) for field in BROKER_SETTINGS},
                    "drop_api_key_set": bool(drop_api_key),
                },
            )
    except IntegrityError:
        # Registered since full_clean looked (two submits at once): refused as it would be.
        raise ValidationError({"broker_id": f"broker {broker_id} is already registered"}) from None
    return broker


def broker_update(*, broker: Broker, actor: str, **changes: Any) -> Broker:
    """Apply ``changes`` to ``broker``; the ledger records which fields changed (never the key).

    A credential follows its destination: when the DROP URL the key is sent to changes
    (base URL or mode) and no new key comes with the change, the stored key is cleared, so
    it is never sent to an address it was not entered for. Turning ``approve_uploads`` on
    holds the files not sent yet for approval (``report_files_hold_for_approval``).
    """
    unknown = set(changes) - {*BROKER_SETTINGS, "drop_api_key"}
    if unknown:
        raise ValidationError(f"cannot change {', '.join(sorted(unknown))}")
    if "name" in changes:
        name_characters_validate(changes["name"])
    if "drop_base_url" in changes:
        drop_base_url_check(changes["drop_base_url"])
    if "drop_api_key" in changes:
        drop_api_key_check(changes["drop_api_key"])
    shown = {name: value for name, value in changes.items() if name != "drop_api_key"}
    with transaction.atomic():
        current = row_locked(broker)
        approval_turned_on = bool(changes.get("approve_uploads")) and not current.approve_uploads
        quiet, entries = _key_follows_destination(current, changes)
        updated = row_update(
            broker,
            changes=shown,
            quiet=quiet,
            entries=entries,
            audit=Audited(
                LedgerKind.BROKER_UPDATED,
                broker_id=broker.broker_id,
                subject=broker.broker_id,
                actor=actor,
            ),
            record_unchanged=True,
        )
        if approval_turned_on:
            # Every file sent from now needs a second person: those written before wait too.
            report_files_hold_for_approval(broker=updated, actor=actor)
    # Callers keep using the object they passed: it shows what was saved.
    for field in [*BROKER_SETTINGS, "drop_api_key", "drop_api_key_changed_at", "updated_at"]:
        setattr(broker, field, getattr(updated, field))
    return broker


def _key_follows_destination(
    current: Broker, changes: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The columns to write besides ``changes`` (the key and its date, ``updated_at``) and
    the key's ledger entry: a new key, or a cleared one when the DROP URL it is sent to
    changes without one. Raises ``ValidationError`` if the changed broker is not valid."""
    after = copy.copy(current)
    for name, value in changes.items():
        setattr(after, name, value)
    after.full_clean()
    now = timezone.now()
    quiet: dict[str, Any] = {"updated_at": now}
    if "drop_api_key" in changes:
        quiet["drop_api_key"] = changes["drop_api_key"]
        entry: dict[str, Any] = {"changed": True}
    elif current.drop_api_key and broker_drop_url(after) != broker_drop_url(current):
        quiet["drop_api_key"] = ""
        entry = {
            "cleared": True,
            "reason": "the DROP URL it is sent to changed; enter the key again",
        }
    else:
        return quiet, {}
    quiet["drop_api_key_changed_at"] = now
    return quiet, {"drop_api_key": entry}


# DROP's portal shows the secret as one token; anything longer is not one.
DROP_WEBHOOK_SECRET_MAX = 500


def drop_webhook_secret_check(secret: str) -> None:
    """ValidationError unless ``secret`` can be the signing secret DROP's portal shows."""
    # isprintable: neither a control character nor a byte order mark an editor put first
    # (which str.strip keeps), stored as part of the secret and failing every signature.
    if (
        not secret
        or secret != secret.strip()
        or not secret.isprintable()
        or len(secret) > DROP_WEBHOOK_SECRET_MAX
    ):
        raise ValidationError(
            "the signing secret DROP's portal shows is one token of "
            f"1 to {DROP_WEBHOOK_SECRET_MAX} printable characters, without spaces around it"
        )


def broker_drop_webhook_secret_set(*, broker: Broker, secret: str, actor: str) -> Broker:
    """Store the signing secret of DROP's notification webhook (encrypted; the ledger says
    only that it changed). Raises ValidationError, nothing written, on an unusable secret."""
    drop_webhook_secret_check(secret)
    now = timezone.now()
    locked = row_update(
        broker,
        changes={},
        # Written quietly, not as a change: a change's entry would show the value.
        quiet={
            "drop_webhook_secret": secret,
            "drop_webhook_secret_changed_at": now,
            "updated_at": now,
        },
        entries={"drop_webhook_secret": {"changed": True}},
        audit=Audited(
            LedgerKind.BROKER_UPDATED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
        ),
    )
    broker.drop_webhook_secret = locked.drop_webhook_secret
    broker.drop_webhook_secret_changed_at = locked.drop_webhook_secret_changed_at
    return broker


# A list named as dropportal spells it (``name_vin``) or as DROP does (``NameVIN``), in any case.
_LIST_NAMES = {
    **{hash_type: hash_type for hash_type in HASH_TYPES},
    **{data_type.lower(): hash_type for hash_type, data_type in DATA_TYPE_OF.items()},
}


def list_names_parse(names: Iterable[str]) -> list[str]:
    """The hash_types ``names`` name, in the order of ``list_types``; ValidationError on an
    unknown name or none at all."""
    wanted = [name.strip() for name in names if name.strip()]
    unknown = [name for name in wanted if name.lower() not in _LIST_NAMES]
    if unknown:
        raise ValidationError(
            f"not a DROP list: {', '.join(repr(name) for name in unknown)} (the lists are "
            f"{', '.join(HASH_TYPES)})"
        )
    chosen = {_LIST_NAMES[name.lower()] for name in wanted}
    if not chosen:
        raise ValidationError(f"name at least one DROP list ({', '.join(HASH_TYPES)})")
    return [hash_type for hash_type in HASH_TYPES if hash_type in chosen]


def broker_lists_select(
    *,
    broker: Broker,
    lists: Iterable[str],
    reason: str,
    actor: str,
    effective_from: dt.datetime | None = None,
) -> ListSelection:
    """Record the lists the broker selected in DROP's portal and why, in force from
    ``effective_from`` (now when not given; an earlier time records a selection made
    before it was entered here, and the ledger shows both times). Raises ValidationError,
    nothing written, on an unknown list, none, no reason, or a time in the future."""
    chosen = list_names_parse(lists)
    reason = reason.strip()
    if not reason:
        raise ValidationError("give the reason for this selection")
    now = timezone.now()
    if effective_from is not None and effective_from > now:
        # Made in DROP's portal already: a later time is a typing error, and would leave
        # the cycles until then tested against the selection before it.
        raise ValidationError(
            f"in force from {effective_from.isoformat()} is in the future: give when the "
            "broker made this selection in DROP's portal"
        )
    with transaction.atomic():
        previous = lists_selected_at(broker, effective_from or now)
        selection = ListSelection.objects.create(
            broker=broker,
            lists=chosen,
            reason=reason,
            actor=actor[:200],
            effective_from=effective_from or now,
        )
        ledger_event_append(
            kind=LedgerKind.BROKER_LISTS_SELECTED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={
                "lists": [DATA_TYPE_OF[hash_type] for hash_type in chosen],
                "reason": reason,
                "effective_from": selection.effective_from.isoformat(),
                "previous_lists": (
                    [DATA_TYPE_OF[hash_type] for hash_type in previous.lists] if previous else None
                ),
            },
        )
    return selection
