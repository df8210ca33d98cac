"""Write paths of ISI integrations, where the service calls the broker's own REST API: create
and edit them, cache their OAuth access token, and read their connections.

::

    created = isi_integration_create(broker=broker, name="Acme API",
                                     base_url="https://api.acme.example",
                                     token_url="https://auth.acme.example/token",
                                     client_id="dropportal", client_secret="…", actor="cli:ann")
    created.webhook_secret                      # shown once: the broker signs callbacks with it
    created.connections, created.connections_error      # listed at once
    isi_connections_refresh(integration=integration, actor="staff:ann")    # on demand
    isi_connections_refresh_for_broker(broker=broker, actor="system")      # before matching

Only connections with both DROP capabilities take part (``IsiConnection.takes_part_in_drop``);
matching gives each of them one deletion request per matched consumer. The calls themselves
are in ``dispatch.isi``; deliveries go through the shared loop (``services.deliveries``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from integrations.dispatch import isi, signing
from integrations.dispatch.saas import categories_or_default
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    Integration,
    IntegrationKind,
    IsiAuth,
    IsiConnection,
    SaasConnection,
)
from integrations.outbound_http import DeliveryResult
from integrations.services.ledger import ledger_event_append
from integrations.services.requests import pending_requests_target
from integrations.services.row_updates import Audited, row_update
from integrations.validators import integration_name_validate, target_url_validate

log = logging.getLogger(__name__)

# A cached OAuth token is not used in its last minute: a call must not start with a token
# that expires on its way. A token endpoint that states no lifetime gets this many seconds.
TOKEN_EXPIRY_MARGIN = 60
TOKEN_LIFETIME_UNSTATED = 300
# A token endpoint that failed is not asked again by this process for this many seconds.
TOKEN_FAILURE_HOLD = 30
CLIENT_ID_MAX = 200

_OAUTH_FIELDS = ("token_url", "client_id", "client_secret")


@dataclass(frozen=True)
class ConnectionsRefreshed:
    """What the broker listed, as stored."""

    integration: Integration
    connections: list[IsiConnection]  # every connection known, those listed first
    method: str  # "POST", or "GET" when POST was answered 405
    status: int
    answer: str  # the broker's answer as received (first 4 KiB)
    pending_requests_queued: int = 0

    @property
    def taking_part(self) -> list[IsiConnection]:
        return [c for c in self.connections if c.takes_part_in_drop]


@dataclass(frozen=True)
class CreatedIsiIntegration:
    integration: Integration
    webhook_secret: str  # show it once; it is stored encrypted and never shown again
    connections: list[IsiConnection] = field(default_factory=list)
    connections_error: str = ""  # listing failed: the integration exists, fix and check it


# -- integrations ---------------------------------------------------------------------------


def isi_credentials_validate(
    *, token: str, token_url: str, client_id: str, client_secret: str
) -> dict[str, str]:
    """Exactly one way to authenticate: a static bearer token, or all three OAuth 2.0 client
    credentials fields. Returns the model fields to set (the other way's emptied)."""
    token, token_url = (token or "").strip(), (token_url or "").strip()
    client_id, client_secret = (client_id or "").strip(), (client_secret or "").strip()
    oauth_given = [
        name
        for name, value in zip(_OAUTH_FIELDS, (token_url, client_id, client_secret), strict=True)
        if value
    ]
    if token and oauth_given:
        raise ValidationError(
            {"auth": "give either a static token or OAuth client credentials, not both"}
        )
    if token:
        return {"auth": IsiAuth.TOKEN, "token": token, **dict.fromkeys(_OAUTH_FIELDS, "")}
    if not oauth_given:
        raise ValidationError(
            {
                "auth": "a static token, or OAuth client credentials (token URL, client id, "
                "client secret), is required"
            }
        )
    missing = [name for name in _OAUTH_FIELDS if name not in oauth_given]
    if missing:
        raise ValidationError({name: "required for OAuth client credentials" for name in missing})
    if len(client_id) > CLIENT_ID_MAX:
        raise ValidationError({"client_id": f"at most {CLIENT_ID_MAX} characters"})
    return {
        "auth": IsiAuth.OAUTH,
        "token": "",
        "token_url": target_url_validate(token_url, field="token_url"),
        "client_id": client_id,
        "client_secret": client_secret,
    }


def _auth_description(values: dict[str, Any]) -> dict[str, str]:
    """What the ledger may say about authentication: never a token or secret."""
    if values["auth"] == IsiAuth.TOKEN:
        return {"auth": IsiAuth.TOKEN}
    return {
        "auth": IsiAuth.OAUTH,
        "token_url": values["token_url"],
        "client_id": values["client_id"],
    }


def isi_integration_create(
    *,
    broker: Broker,
    name: str,
    base_url: str,
    token: str = "",
    token_url: str = "",
    client_id: str = "",
    client_secret: str = "",
    actor: str,
) -> CreatedIsiIntegration:
    """An ISI integration with a new Webhook Secret, then its connections listed.

    Raises ValidationError (nothing written) for a bad name, base URL (https unless private
    targets are allowed) or authentication. A failed listing does not undo the creation
    (the secret must be shown): it comes back as ``connections_error``.
    """
    name = integration_name_validate(name)
    base_url = target_url_validate(base_url, field="base_url").rstrip("/")
    credentials = isi_credentials_validate(
        token=token, token_url=token_url, client_id=client_id, client_secret=client_secret
    )
    secret = signing.generate_webhook_secret()
    with transaction.atomic():
        integration = Integration.objects.create(
            broker=broker,
            kind=IntegrationKind.ISI,
            name=name,
            base_url=base_url,
            webhook_secret=secret,
            credentials_changed_at=timezone.now(),
            **credentials,
        )
        ledger_event_append(
            kind=LedgerKind.INTEGRATION_CREATED,
            broker_id=broker.broker_id,
            subject=str(integration.uuid),
            actor=actor,
            data={
                "kind": IntegrationKind.ISI,
                "name": name,
                "base_url": base_url,
                **_auth_description(credentials),
            },
        )
    try:
        refreshed = isi_connections_refresh(integration=integration, actor=actor)
    except isi.IsiError as exc:
        return CreatedIsiIntegration(integration, secret, connections_error=str(exc))
    return CreatedIsiIntegration(integration, secret, connections=refreshed.connections)


def isi_integration_update(
    *,
    integration: Integration,
    actor: str,
    name: str | None = None,
    base_url: str | None = None,
    auth: str | None = None,
    token: str = "",
    token_url: str = "",
    client_id: str = "",
    client_secret: str = "",
) -> Integration:
    """Rename it, point it at another base URL, or change how it authenticates: one
    ``integration.updated`` event through ``row_update``.

    ``auth`` (``token`` or ``oauth``) with its fields; a secret left empty (``token``,
    ``client_secret``) keeps the current one when the way to authenticate stays the same.
    A credential change drops the cached access token. The ledger names what changed, never
    a secret's value.
    """
    changes: dict[str, str] = {}
    if name is not None:
        changes["name"] = integration_name_validate(name)
    if base_url is not None:
        changes["base_url"] = target_url_validate(base_url, field="base_url").rstrip("/")

    def credentials_follow_destination(
        before: Integration, after: Integration, changed: dict[str, Any]
    ) -> list[str]:
        # A credential follows its destination: a stored token or client secret is kept only
        # while the base URL and the token URL stay; a change must come with it again.
        moved = "base_url" in changed
        if auth is None:
            if moved:
                secret_field = "token" if before.auth == IsiAuth.TOKEN else "client_secret"
                raise ValidationError(
                    {secret_field: "the base URL changed: enter the credential again with it"}
                )
            return []
        if auth == IsiAuth.OAUTH and (token_url or "").strip() != before.token_url:
            moved = True
        credentials = _isi_credentials_update(
            before,
            auth=auth,
            moved=moved,
            token=token,
            token_url=token_url,
            client_id=client_id,
            client_secret=client_secret,
        )
        return _isi_credentials_apply(after, credentials, changed, moved=moved)

    return row_update(
        integration,
        changes=changes,
        audit=Audited(
            LedgerKind.INTEGRATION_UPDATED,
            broker_id=integration.broker.broker_id,
            subject=str(integration.uuid),
            actor=actor,
        ),
        adjust=credentials_follow_destination,
    )


def _isi_credentials_update(
    locked: Integration,
    *,
    auth: str,
    moved: bool,
    token: str,
    token_url: str,
    client_id: str,
    client_secret: str,
) -> dict[str, Any]:
    """The validated fields of the way to authenticate ``auth``. An empty secret keeps the
    stored one while the way and the URLs stay (not ``moved``); else it must be given."""
    same = auth == locked.auth and not moved
    if moved and auth == IsiAuth.TOKEN and not token:
        raise ValidationError(
            {"token": "the base URL changed: enter the static token again with it"}
        )
    if moved and auth == IsiAuth.OAUTH and not client_secret and locked.client_secret:
        raise ValidationError(
            {"client_secret": "the URL changed: enter the client secret again with it"}
        )
    if auth == IsiAuth.TOKEN:
        token = token or (locked.token if same else "")
        return isi_credentials_validate(token=token, token_url="", client_id="", client_secret="")
    if auth == IsiAuth.OAUTH:
        client_secret = client_secret or (locked.client_secret if same else "")
        return isi_credentials_validate(
            token="",
            token_url=token_url,
            client_id=client_id,
            client_secret=client_secret,
        )
    raise ValidationError({"auth": f"not a way to authenticate: {auth!r}"})


def _isi_credentials_apply(
    after: Integration, credentials: dict[str, Any], changed: dict[str, Any], *, moved: bool
) -> list[str]:
    """Set the ``credentials`` that change something on ``after`` and name them in
    ``changed`` (a secret only as changed); the columns to save. A new credential or
    destination drops the cached access token."""
    fields = [name for name, value in credentials.items() if getattr(after, name) != value]
    for name in fields:
        if name in ("token", "client_secret"):
            changed[name] = {"changed": True} if credentials[name] else {"cleared": True}
            if moved and credentials[name]:
                changed[name]["reason"] = "the URL it is sent to changed: entered again"
        else:
            changed[name] = {"from": getattr(after, name), "to": credentials[name]}
        setattr(after, name, credentials[name])
    if set(fields) & {"token", "client_secret"}:
        after.credentials_changed_at = timezone.now()
        fields.append("credentials_changed_at")
    if set(changed) & {"auth", "token", *_OAUTH_FIELDS, "base_url"}:
        after.access_token, after.access_token_expires_at = "", None
        fields += ["access_token", "access_token_expires_at"]
    return fields


# -- authentication -------------------------------------------------------------------------


@dataclass(frozen=True)
class _HeldToken:
    value: str
    expires_at: dt.datetime
    credentials: str  # which client credentials got it (a change makes it unusable)
    stored: bool  # already in the integration's row


@dataclass(frozen=True)
class _TokenFailure:
    error: isi.IsiError
    credentials: str
    until: dt.datetime


# OAuth tokens this process holds, by integration pk: a batch of deliveries loads one
# Integration instance per row, and all of them must share one token (and one failure: a
# token endpoint that is down is asked once per TOKEN_FAILURE_HOLD, not once per row).
_held: dict[int, _HeldToken | _TokenFailure] = {}
_held_lock = threading.Lock()
_renewing: dict[int, threading.Lock] = {}  # one renewal at a time per integration


def isi_bearer_token(integration: Integration) -> isi.BearerToken:
    """How a call to ``integration``'s API authenticates (``dispatch.isi.send``), for calls
    made on this thread: a 401 gets one new token, stored in the row. Asked for on demand,
    so a token endpoint that failed a moment ago is asked again."""
    if integration.auth == IsiAuth.TOKEN:
        return isi.BearerToken(get=lambda refresh: integration.token, refreshable=False)
    return isi.BearerToken(
        get=lambda refresh: isi_access_token(
            integration=integration, refresh=refresh, retry_failed=True
        ),
        refreshable=True,
    )


def isi_delivery_token(integration: Integration) -> isi.BearerToken:
    """The same for a delivery: the token is had now, on the thread that holds the batch's
    transaction; the call is made on a sender thread, where a 401 renews it without touching
    the database (the next delivery stores the renewed token). A token that cannot be had
    makes the call fail with that error, so the attempt records why."""
    if integration.auth == IsiAuth.TOKEN:
        return isi_bearer_token(integration)
    try:
        value = isi_access_token(integration=integration)
    except isi.IsiError as exc:
        failure = exc

        def refuse(refresh: bool) -> str:
            raise failure

        return isi.BearerToken(get=refuse, refreshable=False)
    return isi.BearerToken(
        get=lambda refresh: (
            isi_access_token_renew(integration=integration, refused=value) if refresh else value
        ),
        refreshable=True,
    )


def isi_access_token(
    *,
    integration: Integration,
    refresh: bool = False,
    retry_failed: bool = False,
    now: dt.datetime | None = None,
) -> str:
    """The OAuth access token: the cached one until shortly before it expires, else (or with
    ``refresh``, after a 401) a new one, cached encrypted in the row. Raises ``IsiError``,
    also for ``TOKEN_FAILURE_HOLD`` seconds after the token endpoint failed, unless
    ``retry_failed``."""
    now = now or timezone.now()
    credentials = _credentials_fingerprint(integration)
    if not refresh:
        with _held_lock:
            held = _held.get(integration.pk)
        if held is not None and held.credentials == credentials:
            if isinstance(held, _TokenFailure) and now < held.until and not retry_failed:
                raise held.error
            if isinstance(held, _HeldToken) and now < held.expires_at:
                if not held.stored:  # renewed on a sender thread
                    _access_token_store(integration, held)
                return held.value
        cached, expires_at = integration.access_token, integration.access_token_expires_at
        if cached and expires_at and now < expires_at:
            _hold(integration.pk, _HeldToken(cached, expires_at, credentials, stored=True))
            return cached
    held_token = _access_token_fetch(integration, now)
    _access_token_store(integration, held_token)
    return held_token.value


def isi_access_token_renew(*, integration: Integration, refused: str) -> str:
    """A new access token, after the broker refused the one held: HTTP only, no database
    (so a sender thread may call it). Calls refused together share one new token: the first
    fetches it, the others take it. Raises ``IsiError``."""
    with _held_lock:
        renewing = _renewing.setdefault(integration.pk, threading.Lock())
    with renewing:
        now = timezone.now()
        with _held_lock:
            held = _held.get(integration.pk)
        if held is not None and held.credentials == _credentials_fingerprint(integration):
            if isinstance(held, _TokenFailure) and now < held.until:
                raise held.error
            if isinstance(held, _HeldToken) and held.value != refused and now < held.expires_at:
                return held.value
        return _access_token_fetch(integration, now).value


def _credentials_fingerprint(integration: Integration) -> str:
    material = "\0".join([integration.token_url, integration.client_id, integration.client_secret])
    return hashlib.sha256(material.encode()).hexdigest()


def _hold(pk: int, held: _HeldToken | _TokenFailure) -> None:
    with _held_lock:
        _held[pk] = held


def _access_token_fetch(integration: Integration, now: dt.datetime) -> _HeldToken:
    credentials = _credentials_fingerprint(integration)
    try:
        fetched = isi.oauth_token_fetch(
            token_url=integration.token_url,
            client_id=integration.client_id,
            client_secret=integration.client_secret,
            allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
        )
    except isi.IsiError as exc:
        until = now + dt.timedelta(seconds=TOKEN_FAILURE_HOLD)
        _hold(integration.pk, _TokenFailure(exc, credentials, until))
        raise
    lifetime = fetched.expires_in or TOKEN_LIFETIME_UNSTATED
    expires_at = now + dt.timedelta(seconds=max(lifetime - TOKEN_EXPIRY_MARGIN, lifetime / 2))
    held = _HeldToken(fetched.value, expires_at, credentials, stored=False)
    _hold(integration.pk, held)
    return held


def _access_token_store(integration: Integration, held: _HeldToken) -> None:
    # A cache, not a change of state: no ledger event. Often called inside a delivery
    # batch's transaction, where the row's lock would be held until every call of the batch
    # is answered: a row another transaction holds is skipped (it is storing a token too).
    integration.access_token, integration.access_token_expires_at = held.value, held.expires_at
    with transaction.atomic():
        free = Integration.objects.select_for_update(skip_locked=True, of=("self",)).filter(
            pk=integration.pk
        )
        if list(free.values_list("pk", flat=True)):
            Integration.objects.filter(pk=integration.pk).update(
                access_token=held.value, access_token_expires_at=held.expires_at
            )
    _hold(integration.pk, dataclasses.replace(held, stored=True))


# -- connections ----------------------------------------------------------------------------


def isi_connections_refresh(
    *, integration: Integration, actor: str, now: dt.datetime | None = None
) -> ConnectionsRefreshed:
    """List the broker's connections (POST, or GET when POST is answered 405) and store them.

    Listed ones are created or updated; ones no longer listed are kept, marked unlisted (their
    requests refer to them). Requests matched while the broker had no deletion target get this
    integration's connections that take part. Raises ``IsiError`` after a ledger event when
    the broker's answer is not a connection list: the stored list is then left as it was.
    """
    url = isi.endpoint(integration.base_url, isi.CONNECTIONS_PATH)
    method, result = _connections_request(url, isi_bearer_token(integration))
    try:
        if result.status is None or result.error or not 200 <= result.status < 300:
            got = f"HTTP {result.status}" if result.status is not None else "no answer"
            raise isi.IsiError(got + (f" ({result.error})" if result.error else ""))
        listed = isi.connections_answer(result)
    except isi.IsiError as exc:
        message = f"{method} {url}: {exc}"
        ledger_event_append(
            kind=LedgerKind.ISI_CONNECTIONS_REFRESH_FAILED,
            broker_id=integration.broker.broker_id,
            subject=str(integration.uuid),
            actor=actor,
            data={"url": url, "method": method, "status": result.status, "error": str(exc)},
        )
        raise isi.IsiError(message, status=result.status, answer=result.response_body) from None
    assert result.status is not None

    now = now or timezone.now()
    with transaction.atomic():
        # Serializes refreshes of one integration, so the listed/unlisted marks agree.
        locked = (
            Integration.objects.select_for_update(of=("self",))
            .select_related("broker")
            .get(pk=integration.pk)
        )
        gone = _connections_store(locked, listed, now=now)
        locked.connections_refreshed_at = now
        locked.save(update_fields=["connections_refreshed_at"])
        integration.connections_refreshed_at = now
        connections = list(
            IsiConnection.objects.filter(integration=locked).order_by("-listed", "uuid")
        )
        queued = (
            pending_requests_target(broker=locked.broker, actor=actor).deletion_requests_queued
            if locked.retired_at is None  # a disabled one is still a target: its requests wait
            else 0
        )
        ledger_event_append(
            kind=LedgerKind.ISI_CONNECTIONS_REFRESHED,
            broker_id=locked.broker.broker_id,
            subject=str(locked.uuid),
            actor=actor,
            data={
                "method": method,
                "listed": len(listed),
                "taking_part": [str(c.uuid) for c in connections if c.takes_part_in_drop],
                "not_taking_part": {
                    str(c.uuid): c.drop_exclusion
                    for c in connections
                    if c.listed and not c.takes_part_in_drop
                },
                "no_longer_listed": [str(u) for u in gone],
                "pending_requests_queued": queued,
            },
        )
    return ConnectionsRefreshed(
        integration=locked,
        connections=connections,
        method=method,
        status=result.status,
        answer=result.response_body,
        pending_requests_queued=queued,
    )


def _connections_request(url: str, token: isi.BearerToken) -> tuple[str, DeliveryResult]:
    """Ask for the connection list: the method used, and the answer."""
    allow_private = settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS
    method = "POST"
    result = isi.send(method, url, body=b"{}", token=token, allow_private=allow_private)
    if result.status == 405:  # docs/contracts.md §3.2: POST, else GET
        method = "GET"
        result = isi.send(method, url, body=b"", token=token, allow_private=allow_private)
    return method, result


def _connections_store(
    locked: Integration, listed: list[isi.ListedConnection], *, now: dt.datetime
) -> list[uuid.UUID]:
    """Create or update the ``listed`` connections, mark the others no longer listed; the
    uuids of those that were listed until now."""
    IsiConnection.objects.bulk_create(
        [
            IsiConnection(
                integration=locked,
                uuid=entry.uuid,
                capabilities=entry.capabilities,
                listed=True,
                refreshed_at=now,
            )
            for entry in listed
        ],
        update_conflicts=True,
        unique_fields=["integration", "uuid"],
        update_fields=["capabilities", "listed", "refreshed_at"],
    )
    gone = list(
        IsiConnection.objects.filter(integration=locked, listed=True)
        .exclude(uuid__in=[entry.uuid for entry in listed])
        .values_list("uuid", flat=True)
    )
    IsiConnection.objects.filter(integration=locked, uuid__in=gone).update(
        listed=False, refreshed_at=now
    )
    return gone


def isi_connections_refresh_for_broker(
    *, broker: Broker, actor: str
) -> list[ConnectionsRefreshed | isi.IsiError]:
    """Refresh every enabled ISI integration of ``broker``: what a cycle does before matching.

    Never raises: a broker whose API does not answer keeps its last known connections (the
    failure is in the ledger and the log), so its DROP cycle is not held up by it.
    """
    outcomes: list[ConnectionsRefreshed | isi.IsiError] = []
    integrations = Integration.objects.select_related("broker").filter(
        broker=broker, kind=IntegrationKind.ISI, enabled=True
    )
    for integration in integrations:
        try:
            outcomes.append(isi_connections_refresh(integration=integration, actor=actor))
        except isi.IsiError as exc:
            log.warning(
                "ISI integration %s of broker %s: connections not refreshed, the last known "
                "ones are used: %s",
                integration.uuid,
                broker.broker_id,
                exc,
            )
            outcomes.append(exc)
    return outcomes


# -- reads the deliveries need ----------------------------------------------------------------


def saas_identifier_categories(*, broker_id: int) -> list[str]:
    """``identifier_categories`` of an ISI identifier retrieval: the union of the broker's
    SaaS connections' categories (each defaulting to email), a disabled one's included: its
    deletions wait for it with the identifiers they need."""
    categories: dict[str, None] = {}
    for own in SaasConnection.objects.filter(
        broker_id=broker_id, retired_at__isnull=True
    ).values_list("identifier_categories", flat=True):
        categories.update(dict.fromkeys(categories_or_default(own)))
    return sorted(categories) or list(categories_or_default([]))
