"""The bearer token of a call to an ISI integration's own REST API: its static token, or an
OAuth 2.0 access token cached (encrypted) in its row and shared by this process's threads::

    token = isi_bearer_token(integration)      # a call made on this thread
    token = isi_delivery_token(integration)    # a delivery, sent on a sender thread
    isi.send("POST", url, body=body, token=token, ...)

A 401 gets one new token; a token endpoint that failed is not asked again by this process
for ``TOKEN_FAILURE_HOLD`` seconds. The calls themselves are in ``dispatch.isi``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import threading
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from integrations.dispatch import isi
from integrations.models import Integration, IsiAuth

# A cached OAuth token is not used in its last minute: a call must not start with a token
# that expires on its way. A token endpoint that states no lifetime gets this many seconds.
TOKEN_EXPIRY_MARGIN = 60
TOKEN_LIFETIME_UNSTATED = 300
# A longer lifetime is taken as this one: the token endpoint's number may be any size (one
# past year 9999 overflowed the expiry), and a day-old token is asked for again anyway.
TOKEN_LIFETIME_MAX = 24 * 3600
# A token endpoint that failed is not asked again by this process for this many seconds.
TOKEN_FAILURE_HOLD = 30


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
        return isi.BearerToken(
            get=lambda refresh: integration.token,
            refreshable=False,
            secrets=_credentials(integration),
        )
    return isi.BearerToken(
        get=lambda refresh: isi_access_token(
            integration=integration, refresh=refresh, retry_failed=True
        ),
        refreshable=True,
        secrets=_credentials(integration),
    )


def isi_delivery_token(integration: Integration) -> isi.BearerToken:
    """The same for a delivery: the token is had now, on the thread that holds the batch's
    transaction; the call is made on a sender thread, where a 401 renews it without touching
    the database (the next delivery stores the renewed token). A token that cannot be had
    makes the call fail with that error, so the attempt records why. A token fetched is
    stored once the batch commits: the row is not held while its calls are in flight."""
    if integration.auth == IsiAuth.TOKEN:
        return isi_bearer_token(integration)
    try:
        value = isi_access_token(integration=integration, after_commit=True)
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
        secrets=_credentials(integration),
    )


def _credentials(integration: Integration) -> tuple[str, ...]:
    """Every credential the row holds, whichever way it authenticates, the client secret in
    each form it is sent: an answer echoing any of them has it redacted (the tokens actually
    sent are redacted anyway)."""
    return (
        integration.token,
        integration.access_token,
        *isi.oauth_client_secret_forms(integration.client_id, integration.client_secret),
    )


def isi_access_token(
    *,
    integration: Integration,
    refresh: bool = False,
    retry_failed: bool = False,
    after_commit: bool = False,
    now: dt.datetime | None = None,
) -> str:
    """The OAuth access token: the cached one until shortly before it expires, else (or with
    ``refresh``, after a 401) a new one, cached encrypted in the row (once the caller's
    transaction commits, with ``after_commit``). Raises ``IsiError``, also for
    ``TOKEN_FAILURE_HOLD`` seconds after the token endpoint failed, unless
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
                    _access_token_store(integration, held, after_commit=after_commit)
                return held.value
        cached, expires_at = integration.access_token, integration.access_token_expires_at
        if cached and expires_at and now < expires_at:
            _hold(integration.pk, _HeldToken(cached, expires_at, credentials, stored=True))
            return cached
    held_token = _access_token_fetch(integration, now)
    _access_token_store(integration, held_token, after_commit=after_commit)
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
    lifetime = min(fetched.expires_in or TOKEN_LIFETIME_UNSTATED, TOKEN_LIFETIME_MAX)
    expires_at = now + dt.timedelta(seconds=max(lifetime - TOKEN_EXPIRY_MARGIN, lifetime / 2))
    held = _HeldToken(fetched.value, expires_at, credentials, stored=False)
    _hold(integration.pk, held)
    return held


def _access_token_store(
    integration: Integration, held: _HeldToken, *, after_commit: bool = False
) -> None:
    """Cache ``held`` in the row: a cache, not a change of state, so no ledger event.

    ``after_commit`` (a delivery batch): written once the caller's transaction commits. Its
    lock on the row would be held until every call of the batch is answered, minutes for a
    slow broker, and staff (an edit, a connection refresh) and the cycle's refresh before
    matching (holding the broker's matching lock) lock that row.
    """
    integration.access_token, integration.access_token_expires_at = held.value, held.expires_at
    _hold_stored(integration.pk, held)  # one write per token, however many rows ask
    pk = integration.pk

    def write() -> None:  # named: a robust hook that fails is logged by its __qualname__
        _access_token_write(pk, held)

    if after_commit:
        transaction.on_commit(write, robust=True)
    else:
        write()


def _access_token_write(pk: int, held: _HeldToken) -> None:
    # A row another transaction holds is skipped (storing a token too, or staff editing it);
    # a row whose credentials changed since the token was fetched (staff dropped the cached
    # token with them) is left alone: that token is not for its credentials.
    with transaction.atomic():
        row = (
            Integration.objects.select_for_update(skip_locked=True, of=("self",))
            .only("token_url", "client_id", "client_secret")
            .filter(pk=pk)
            .first()
        )
        if row is not None and _credentials_fingerprint(row) == held.credentials:
            Integration.objects.filter(pk=pk).update(
                access_token=held.value, access_token_expires_at=held.expires_at
            )


def _hold_stored(pk: int, held: _HeldToken) -> None:
    """Mark ``held`` stored, unless a newer token took its place meanwhile."""
    with _held_lock:
        current = _held.get(pk)
        if current is None or (isinstance(current, _HeldToken) and current.value == held.value):
            _held[pk] = dataclasses.replace(held, stored=True)
