"""Write paths of ISI integrations, where the service calls the broker's own REST API: create
and edit them (their OAuth access token: ``services.cycle.isi_tokens``; their connections:
``services.cycle.isi_connections``).

::

    created = isi_integration_create(broker=broker, name="Acme API",
                                     base_url="https://api.acme.example",
                                     token_url="https://auth.acme.example/token",
                                     client_id="dropportal", client_secret="…", actor="cli:ann")
    created.webhook_secret                      # shown once: the broker signs callbacks with it
    created.connections, created.connections_error      # listed at once
    isi_integration_update(integration=integration, actor="staff:ann", name="Acme API 2")

The calls themselves are in ``dispatch.isi``; deliveries go through the shared loop
(``services.dispatch.deliveries``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from integrations.dispatch import isi, signing
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    Integration,
    IntegrationKind,
    IsiAuth,
    IsiConnection,
)
from integrations.services.cycle.isi_connections import isi_connections_refresh
from integrations.services.ledger import ledger_event_append
from integrations.services.row_updates import row_locked, row_update
from integrations.services.staff.integrations import integration_updated
from integrations.validators import (
    base_url_validate,
    bearer_token_validate,
    integration_name_validate,
    target_url_validate,
)

CLIENT_ID_MAX = 200

_OAUTH_FIELDS = ("token_url", "client_id", "client_secret")


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
        token = bearer_token_validate(token)
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
    base_url = base_url_validate(base_url, field="base_url").rstrip("/")
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
    changes: dict[str, Any] = {}
    if name is not None:
        changes["name"] = integration_name_validate(name)
    if base_url is not None:
        changes["base_url"] = base_url_validate(base_url, field="base_url").rstrip("/")

    with transaction.atomic():
        current = row_locked(integration)
        # A credential follows its destination: a stored token or client secret is kept only
        # while the base URL and the token URL stay; a change must come with it again.
        moved = changes.get("base_url", current.base_url) != current.base_url
        quiet: dict[str, Any] = {}
        entries: dict[str, dict[str, Any]] = {}
        if auth is None and moved:
            secret_field = "token" if current.auth == IsiAuth.TOKEN else "client_secret"
            raise ValidationError(
                {secret_field: "the base URL changed: enter the credential again with it"}
            )
        if auth is not None:
            if auth == IsiAuth.OAUTH and (token_url or "").strip() != current.token_url:
                moved = True
            credentials = _isi_credentials_update(
                current,
                auth=auth,
                moved=moved,
                token=token,
                token_url=token_url,
                client_id=client_id,
                client_secret=client_secret,
            )
            shown, quiet, entries = _isi_credentials_split(current, credentials, moved=moved)
            changes.update(shown)
        if any(
            getattr(current, name) != value
            for name, value in {**changes, **quiet}.items()
            if name in ("auth", "token", *_OAUTH_FIELDS, "base_url")
        ):
            # A new credential or destination drops the cached access token.
            quiet.update(access_token="", access_token_expires_at=None)
        return row_update(
            integration,
            changes=changes,
            quiet=quiet,
            entries=entries,
            audit=integration_updated(integration, actor),
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


def _isi_credentials_split(
    current: Integration, credentials: dict[str, Any], *, moved: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """``credentials`` as ``row_update`` takes them: the fields shown in the ledger (from, to),
    and the secrets that change something, written quietly (with the date they changed) with
    an entry saying only that they changed or were cleared."""
    shown = {n: v for n, v in credentials.items() if n not in ("token", "client_secret")}
    quiet: dict[str, Any] = {}
    entries: dict[str, dict[str, Any]] = {}
    for name in ("token", "client_secret"):
        if name not in credentials or getattr(current, name) == credentials[name]:
            continue
        quiet[name] = credentials[name]
        entries[name] = {"changed": True} if credentials[name] else {"cleared": True}
        if moved and credentials[name]:
            entries[name]["reason"] = "the URL it is sent to changed: entered again"
    if quiet:
        quiet["credentials_changed_at"] = timezone.now()
    return shown, quiet, entries
