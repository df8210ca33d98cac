"""A loopback stand-in for a broker's own REST API (ISI), for tests and the demo.

It listens on 127.0.0.1 (a free port), records every request (so a test can assert which
paths were called), and serves what docs/contracts.md §3.2 describes::

    with IsiSimulator(connections=[connection(uuid_a), connection(uuid_b, ["privacy/access"])],
                      identifiers={"C-1": {"email": [{"email": "Ann@Example.com"}]}}) as api:
        isi_integration_create(..., base_url=api.base_url, token_url=api.token_url,
                               client_id=api.client_id, client_secret=api.client_secret)
        ...deliver...
        (delete,) = api.on("delete")
        api.complete(delete, "deleted", public_url=live_server.url, api_key=key, secret=secret)

- ``POST /oauth/token``: OAuth 2.0 client credentials (HTTP Basic); issues a new token each
  time, valid until ``revoke_tokens()`` (a stale token is answered 401).
- ``POST /api/v1/connections/list``: ``{"results": connections}``; with ``list_method="GET"``
  only GET is served and POST is answered 405.
- ``POST /api/v1/privacy/drop/delete/{uuid}``: 200 ``{"status": "processing"}``.
- ``POST /api/v2/privacy/drop/identifiers/{uuid}``: 200 ``{"identifiers": ...}`` for the
  ``remote_identifier`` asked about (``{}`` for an unknown one).
- Anything else (the standard DSR endpoints among them): 404. API paths need the bearer
  token (the static ``token``, or one issued): 401 otherwise.

``answer_next(route, *replies)`` scripts the next answers of one route (``"token"``,
``"connections"``, ``"delete"``, ``"identifiers"``) ahead of all of that.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import secrets
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlsplit

import requests

from devtools.broker_simulator import BrokerSimulator, ReceivedRequest, Reply, sign_callback

DROP_CAPABILITIES = ["privacy/drop/identifiers", "privacy/drop/delete"]
STANDARD_CAPABILITIES = ["privacy/access", "privacy/delete"]
TOKEN_PATH = "/oauth/token"  # noqa: S105 (a path, not a secret)
_ROUTES = (
    ("token", re.compile(r"/oauth/token")),
    ("connections", re.compile(r"/api/v1/connections/list")),
    ("delete", re.compile(r"/api/v1/privacy/drop/delete/[0-9a-fA-F-]{36}")),
    ("identifiers", re.compile(r"/api/v2/privacy/drop/identifiers/[0-9a-fA-F-]{36}")),
)


def connection(uuid: str, capabilities: Iterable[str] | None = None) -> dict[str, Any]:
    """A connection list entry; with both DROP capabilities (and the standard ones) unless
    told otherwise."""
    caps = list(capabilities) if capabilities is not None else STANDARD_CAPABILITIES
    if capabilities is None:
        caps += DROP_CAPABILITIES
    return {"uuid": uuid, "capabilities": caps}


def _json(status: int, value: Any, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(
        status=status,
        body=json.dumps(value).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def completion_callback(
    secret: str, delete: Mapping[str, Any], outcome: str, **fields: Any
) -> tuple[bytes, dict[str, str]]:
    """The broker's signed ISI callback for a delete it received (its parsed body)."""
    body: dict[str, Any] = {
        "status": "completed",
        "results_token": delete["results_token"],
        "drop_outcome": outcome,
        # When the broker finished: now, by its clock.
        "completed_at": dt.datetime.now(dt.UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
    }
    body.update(fields)
    return sign_callback(secret, {k: v for k, v in body.items() if v is not None})


class IsiSimulator(BrokerSimulator):
    """A threaded HTTP server on 127.0.0.1 acting as a broker's ISI API."""

    def __init__(
        self,
        *,
        connections: Iterable[Mapping[str, Any]] = (),
        identifiers: Mapping[str, Any] | None = None,
        token: str | None = None,
        client_id: str = "dropportal",
        client_secret: str = "client-s3cret",  # noqa: S107 (a loopback stand-in)
        list_method: str = "POST",
        expires_in: int | None = 3600,
    ) -> None:
        super().__init__(path="")
        self.connections = [dict(c) for c in connections]
        self.identifiers = dict(identifiers or {})
        self.token = token  # a static bearer token it accepts, if any
        self.client_id, self.client_secret = client_id, client_secret
        self.list_method = list_method
        self.expires_in = expires_in
        self.tokens_issued = 0
        self._valid_tokens: set[str] = set()
        self._scripted: dict[str, deque[Reply]] = defaultdict(deque)

    def __enter__(self) -> IsiSimulator:
        self.start()
        return self

    @property
    def token_url(self) -> str:
        return self.base_url + TOKEN_PATH

    # -- scripting and inspection -------------------------------------------------------------

    def answer_next(self, route: str, *replies: int | Reply) -> None:
        """Answer the next calls of ``route`` with ``replies``, in order."""
        with self._lock:
            self._scripted[route].extend(
                r if isinstance(r, Reply) else Reply(status=r) for r in replies
            )

    def revoke_tokens(self) -> None:
        """Every issued token becomes stale: the next call with one is answered 401."""
        with self._lock:
            self._valid_tokens.clear()

    def on(self, route: str) -> list[ReceivedRequest]:
        """The requests received on ``route``, in order."""
        return [r for r in self.received if _route(r.path) == route]

    @property
    def paths(self) -> list[str]:
        return [urlsplit(r.path).path for r in self.received]

    def complete(
        self,
        delete: ReceivedRequest,
        outcome: str,
        *,
        public_url: str,
        api_key: str,
        secret: str,
        method: str = "PUT",
        **fields: Any,
    ) -> requests.Response:
        """Send the signed completion callback of ``delete`` to its ``callback_path``."""
        body, headers = completion_callback(secret, delete.json, outcome, **fields)
        headers["Authorization"] = f"Bearer {api_key}"
        origin = urlsplit(public_url)
        url = f"{origin.scheme}://{origin.netloc}{delete.json['callback_path']}"
        return requests.request(method, url, data=body, headers=headers, timeout=10)

    # -- called from the handler threads ------------------------------------------------------

    def _record(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        *,
        timestamp: str | None,
        signature: str | None,
    ) -> Reply:
        super()._record(method, path, headers, body, timestamp=timestamp, signature=signature)
        route = _route(path)
        if route is None:
            return _json(404, {"error": "not_found"})
        with self._lock:
            scripted = self._scripted[route]
            if scripted:
                return scripted.popleft()
        if route == "token":
            return self._issue_token(method, headers, body)
        if not self._authorized(headers):
            return _json(401, {"error": "invalid_token"}, {"WWW-Authenticate": "Bearer"})
        if route == "connections":
            if method != self.list_method:
                return _json(405, {"error": "method_not_allowed"}, {"Allow": self.list_method})
            return _json(200, {"results": self.connections})
        if method != "POST":
            return _json(405, {"error": "method_not_allowed"}, {"Allow": "POST"})
        if route == "delete":
            return _json(200, {"status": "processing"})
        asked = json.loads(body) if body else {}
        remote_identifier = str(asked.get("remote_identifier", ""))
        return _json(200, {"identifiers": self.identifiers.get(remote_identifier, {})})

    def _issue_token(self, method: str, headers: dict[str, str], body: bytes) -> Reply:
        form = parse_qs(body.decode("ascii", errors="replace"))
        if method != "POST" or form.get("grant_type") != ["client_credentials"]:
            return _json(400, {"error": "unsupported_grant_type"})
        if _basic_credentials(headers) != (self.client_id, self.client_secret):
            return _json(401, {"error": "invalid_client"})
        issued = "tok-" + secrets.token_urlsafe(16)
        with self._lock:
            self._valid_tokens.add(issued)
            self.tokens_issued += 1
        answer: dict[str, Any] = {"access_token": issued, "token_type": "Bearer"}
        if self.expires_in is not None:
            answer["expires_in"] = self.expires_in
        return _json(200, answer)

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, presented = _header(headers, "Authorization").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return False
        with self._lock:
            return presented == self.token or presented in self._valid_tokens


def _route(path: str) -> str | None:
    bare = urlsplit(path).path
    return next((name for name, pattern in _ROUTES if pattern.fullmatch(bare)), None)


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")


def _basic_credentials(headers: Mapping[str, str]) -> tuple[str, str] | None:
    scheme, _, encoded = _header(headers, "Authorization").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        client_id, _, client_secret = base64.b64decode(encoded).decode().partition(":")
    except ValueError:
        return None
    return unquote_plus(client_id), unquote_plus(client_secret)
