"""The broker's own REST API, ISI (docs/contracts.md §2.6, §3.2, §4.4): its endpoints, the bodies
we send, the answers we accept, and the OAuth 2.0 client credentials exchange.

No database access: the caller passes the rows it loaded and a ``BearerToken`` (how to get
the access token; ``services.cycle.isi_tokens`` caches OAuth tokens in the integration's row)::

    url = endpoint(integration.base_url, DELETE_PATH, connection.uuid)
    result = send("POST", url, body=delete_body(request), token=token, allow_private=False)
    result.error     # None: acknowledged (any 2xx in time); else why it failed

Every call goes through ``outbound_http.deliver``: SSRF checks, TLS 1.2 or later with verified
certificates, no redirects, bounded time. Only the DROP endpoints below (and the connection
list) are ever called: the broker's standard privacy (DSR) endpoints never are, so DROP work
does not enter its DSR pipeline (§3.2).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus, urlencode, urlsplit

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers

from integrations.ascii_integers import ascii_integer
from integrations.dispatch import masking
from integrations.dispatch.saas import categories_or_default
from integrations.dispatch.transport import (
    Message,
    Verdict,
    answer_kept,
    answer_redacted,
    each,
    http_verdict,
)
from integrations.models import DeletionRequest, ResolutionRequest
from integrations.outbound_http import (
    USER_AGENT,
    DeliveryResult,
    deliver,
)

# The shape of resolved identifiers is the webhook resolution callback's: one definition.
from integrations.redaction import oauth_error_code, text_redacted
from integrations.storable_text import unstorable_reason
from integrations.url_extras import without_url_extras
from integrations.validators import bearer_token_sendable
from integrations.wire_fields import ResolvedIdentifiersField, uuid_from_text

CONNECTIONS_PATH = "/api/v1/connections/list"
DELETE_PATH = "/api/v1/privacy/drop/delete/{connection_uuid}"
IDENTIFIERS_PATH = "/api/v2/privacy/drop/identifiers/{connection_uuid}"
CALLBACK_PATH = "/api/v1/drop/callbacks/isi"  # ours, given to the broker as callback_path
# Answers read whole (connection lists, identifiers, tokens); what an attempt keeps is 4 KiB.
ANSWER_LIMIT = 256 * 1024
CAPABILITY_MAX = 100  # IsiConnection.capabilities holds strings of at most this length
# In place of a token endpoint's error that is not an OAuth error code (RFC 6749 section 5.2).
ERROR_TEXT_NOT_SHOWN = "its error text, not an OAuth error code, is not shown"


class IsiError(Exception):
    """The broker's API did not give what it must; the message is for staff, one line.

    ``status`` and ``answer`` (its first 4 KiB) are the broker's, when it answered.
    """

    def __init__(self, message: str, *, status: int | None = None, answer: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.answer = answer


@dataclass(frozen=True)
class BearerToken:
    """How to authenticate to the broker: ``get(refresh)`` returns the access token (raising
    ``IsiError`` when none can be had); ``refreshable``: a 401 is worth one new token;
    ``secrets``: the integration's other credentials, redacted from its answers as the
    tokens sent are (``transport.answer_redacted``)."""

    get: Callable[[bool], str]
    refreshable: bool
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class AccessToken:
    value: str
    expires_in: int | None  # seconds, as the token endpoint said; None when it did not


@dataclass(frozen=True)
class ListedConnection:
    """One entry of the connection list's ``results``."""

    uuid: uuid.UUID
    capabilities: list[str]


AnswerCheck = Callable[[DeliveryResult], "str | None"]


# -- where and what -------------------------------------------------------------------------


def endpoint(base_url: str, path: str, connection_uuid: uuid.UUID | str | None = None) -> str:
    """``base_url`` (which may carry a path prefix) joined with one of the paths above."""
    if connection_uuid is not None:
        path = path.format(connection_uuid=connection_uuid)
    return base_url.rstrip("/") + path


def callback_path() -> str:
    """``callback_path``: our ISI callback's path on the public URL (a prefix kept, if any)."""
    return urlsplit(settings.DROPPORTAL_PUBLIC_URL).path.rstrip("/") + CALLBACK_PATH


def request_headers() -> dict[str, str]:
    """The headers of every call but ``Authorization``, which ``send`` adds per try."""
    return {"Content-Type": "application/json", "Accept": "application/json"}


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def delete_payload(request: DeletionRequest) -> dict[str, Any]:
    """The ISI DROP delete request body (§2.6), field for field."""
    return {
        "request_uuid": str(request.request_uuid),
        "results_token": request.results_token,
        "callback_path": callback_path(),
        "drop_context": {
            "broker_id": request.broker_id_code,
            "drop_session_id": request.drop_session_id,
            "hash_type": request.hash_type,
            "match_date": request.match_date.isoformat(),
        },
        "remote_identifier": request.remote_identifier,
        "remote_identifier_kind": request.remote_identifier_kind,
    }


def delete_body(request: DeletionRequest) -> bytes:
    return _encode(delete_payload(request))


def identifiers_payload(request: ResolutionRequest, categories: Iterable[str]) -> dict[str, Any]:
    """The ISI identifier retrieval request body (§2.6); ``categories`` default to email."""
    return {
        "request_uuid": str(request.request_uuid),
        "remote_identifier": request.remote_identifier,
        "remote_identifier_kind": request.remote_identifier_kind,
        "identifier_categories": categories_or_default(categories),
    }


def identifiers_body(request: ResolutionRequest, categories: Iterable[str]) -> bytes:
    return _encode(identifiers_payload(request, categories))


# -- the answers ----------------------------------------------------------------------------


# JSON leaves a key named twice to the parser and Python keeps the last: a broker's first
# identifiers (or connections) would be dropped without a word. The key is not named back:
# a broker may key identifiers by the identifier itself.
_KEY_TWICE = "names the same key twice, so which value is meant cannot be told"


class _KeyTwice(ValueError):
    pass


def _keys_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _KeyTwice
    return found


def _json_answer(content: bytes, what: str) -> Any:
    if len(content) > ANSWER_LIMIT:
        raise IsiError(f"{what} is over {ANSWER_LIMIT // 1024} KiB")
    try:
        answer = json.loads(content, object_pairs_hook=_keys_once)
    except _KeyTwice:
        raise IsiError(f"{what} {_KEY_TWICE}") from None
    except ValueError:
        raise IsiError(f"{what} is not JSON") from None
    except RecursionError:  # deeper than Python's parser follows: out of the batch otherwise
        raise IsiError(f"{what} is nested too deeply") from None
    # What is read here is stored (identifiers, capabilities, a token), so a string that
    # cannot be (a NUL, a lone "\ud800" escape, in a key too) is refused as any wrong shape
    # is, before it can fail the transaction that stores it.
    reason = unstorable_reason(answer)
    if reason:
        raise IsiError(f"{what} cannot be stored: {reason}")
    return answer


def identifiers_answer(result: DeliveryResult) -> dict[str, Any]:
    """The resolved ``identifiers`` of a 200 answer, validated as the webhook resolution
    callback's (categories of arrays of objects of strings), values verbatim."""
    if result.status != 200:
        raise IsiError(f"expected 200 with {{identifiers}}, got HTTP {result.status}")
    return identifiers_of(result.content)


def identifiers_of(content: bytes) -> dict[str, Any]:
    """The resolved ``identifiers`` of an answer's body (``identifiers_answer`` without the
    status, for a verdict of an answer already checked)."""
    answer = _json_answer(content, "the identifiers answer")
    if not isinstance(answer, dict) or "identifiers" not in answer:
        raise IsiError("the identifiers answer is not a JSON object with 'identifiers'")
    try:
        identifiers: dict[str, Any] = ResolvedIdentifiersField().run_validation(
            answer["identifiers"]
        )
    except serializers.ValidationError as exc:
        raise IsiError(f"identifiers have the wrong shape: {_first_error(exc.detail)}") from None
    return identifiers


def identifiers_answer_error(result: DeliveryResult) -> str | None:
    try:
        identifiers_answer(result)
    except IsiError as exc:
        return str(exc)
    return None


def connections_answer(result: DeliveryResult) -> list[ListedConnection]:
    """The ``results`` of a connection list answer; the whole answer is refused if any entry
    is wrong, so a broken answer never drops connections that are still there."""
    answer = _json_answer(result.content, "the connection list")
    if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
        raise IsiError("the connection list is not a JSON object with a 'results' array")
    listed: dict[uuid.UUID, ListedConnection] = {}
    for index, entry in enumerate(answer["results"]):
        where = f"results[{index}]"
        if not isinstance(entry, dict):
            raise IsiError(f"{where} is not an object")
        # Its 36 characters as written (any case): the delete path names it so.
        connection_uuid = uuid_from_text(entry.get("uuid"))
        if connection_uuid is None:
            raise IsiError(f"{where}.uuid is not a UUID (8-4-4-4-12 hexadecimal digits)")
        capabilities = entry.get("capabilities", [])
        if not isinstance(capabilities, list) or not all(
            isinstance(c, str) and 0 < len(c) <= CAPABILITY_MAX for c in capabilities
        ):
            raise IsiError(f"{where}.capabilities is not an array of capability names")
        if connection_uuid in listed:
            raise IsiError(f"{where}: connection {connection_uuid} is listed twice")
        listed[connection_uuid] = ListedConnection(
            connection_uuid, list(dict.fromkeys(capabilities))
        )
    return list(listed.values())


def _first_error(detail: Any, path: str = "") -> str:
    """``email[0].email: Not a valid string.``: the first message of a nested DRF error; a
    key the broker chose that is not a name of ours is shown by its length (it may be an
    identifier: ``{"ann@x.com": ...}``)."""
    if isinstance(detail, dict):
        key, value = next(iter(detail.items()))
        if not isinstance(key, int):
            key = masking.masked_key(key, masking.PROTOCOL_NAMES | masking.IDENTIFIER_TYPES)
        step = f"[{key}]" if isinstance(key, int) else (f".{key}" if path else str(key))
        return _first_error(value, path + step)
    if isinstance(detail, list) and detail:
        return _first_error(detail[0], path)
    return f"{path}: {detail}" if path else str(detail)


# -- calling --------------------------------------------------------------------------------


def send(
    method: str,
    url: str,
    *,
    body: bytes,
    token: BearerToken,
    allow_private: bool,
    check: AnswerCheck | None = None,
) -> DeliveryResult:
    """One call with the bearer token and, after a 401 with a refreshable (OAuth) token, one
    more with a fresh token: a second 401 is the answer. Never raises.

    A token that cannot be had is the result's ``error`` (status None: nothing reached the
    broker). ``check`` turns a 2xx whose body is not the expected answer into a failed call.
    """
    started = time.monotonic()
    headers = request_headers() if body else {"Accept": "application/json"}
    sent: list[str] = []

    def call(access_token: str) -> DeliveryResult:
        sent.append(access_token)
        result = deliver(
            method,
            url,
            body=body,
            headers={**headers, "Authorization": f"Bearer {access_token}"},
            allow_private=allow_private,
            read_limit=ANSWER_LIMIT,
        )
        return answer_redacted(result, [*sent, *token.secrets])

    try:
        result = call(token.get(False))
        if result.status == 401 and token.refreshable:
            result = call(token.get(True))
            if result.status == 401:
                result = dataclasses.replace(
                    result, error=result.error or "refused a freshly issued access token too"
                )
        elif result.status == 401:
            result = dataclasses.replace(
                result, error=result.error or "the broker refused the bearer token"
            )
    except IsiError as exc:
        elapsed = round((time.monotonic() - started) * 1000)
        return DeliveryResult(url=url, status=None, duration_ms=elapsed, error=str(exc))
    succeeded = result.status is not None and 200 <= result.status < 300 and not result.error
    if succeeded and check is not None and (problem := check(result)):
        result = dataclasses.replace(result, error=problem)
    return result


class IsiTransport:
    """A POST to the broker's own API with its bearer token (``Message.credential``: a
    ``BearerToken``, renewed once after a 401), the answer checked by ``Message.check``
    before it is masked (``answer_kept``). Its requests' messages are built by
    ``services.dispatch.deliveries``: they need the stored token and record the answer."""

    kind = "isi"
    resolves = True  # the connections with privacy/drop/identifiers

    def send(self, batch: Sequence[Message], pool: Executor | None) -> list[Verdict]:
        return each(pool, self._post, batch)

    def _post(self, message: Message) -> Verdict:
        started = timezone.now()
        result = send(
            "POST",
            message.address,
            body=message.body,
            token=message.credential,
            check=message.check,
            allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
        )
        return http_verdict(
            message, answer_kept(message, result), headers=message.headers, started=started
        )


def oauth_client_secret_forms(client_id: str, client_secret: str) -> tuple[str, ...]:
    """The client secret in each form ``oauth_token_fetch`` sends it: as it is, form-encoded
    (``quote_plus``) and inside the Basic header's Base64 of ``id:secret``. An answer may
    echo any of them, so each is redacted wherever an answer is kept; none without a secret."""
    if not client_secret:
        return ()
    return (client_secret, quote_plus(client_secret), _basic_credentials(client_id, client_secret))


def _basic_credentials(client_id: str, client_secret: str) -> str:
    # RFC 6749 section 2.3.1: each form-encoded before they are joined.
    credentials = f"{quote_plus(client_id)}:{quote_plus(client_secret)}".encode()
    return base64.b64encode(credentials).decode("ascii")


def oauth_token_fetch(
    *,
    token_url: str,
    client_id: str,
    client_secret: str,
    allow_private: bool,
) -> AccessToken:
    """A new access token by the client credentials grant (RFC 6749 section 4.4), the client
    authenticated by HTTP Basic (section 2.3.1). Raises ``IsiError`` saying what went wrong."""
    sent = oauth_client_secret_forms(client_id, client_secret)
    result = deliver(
        "POST",
        token_url,
        body=urlencode({"grant_type": "client_credentials"}).encode("ascii"),
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
            "Authorization": "Basic " + _basic_credentials(client_id, client_secret),
            "User-Agent": USER_AGENT,
        },
        allow_private=allow_private,
        read_limit=ANSWER_LIMIT,
    )
    # The error reaches the request, the ledger and staff: no URL's query goes there.
    where = f"OAuth token endpoint {without_url_extras(token_url, value=True)}"
    if result.status is None or result.error:
        got = result.error if result.status is None else f"HTTP {result.status}: {result.error}"
        raise IsiError(f"{where}: {got}")
    if not 200 <= result.status < 300:
        try:  # RFC 6749 section 5.2: {"error": "invalid_client", ...}
            reason = json.loads(result.content).get("error")
        except (ValueError, AttributeError, RecursionError):
            reason = None
        # Kept with every attempt of the batch it fails, in the ledger and the log, shown to
        # staff: only an error code, as the endpoint's own text may quote the secret sent.
        code = oauth_error_code(reason)
        said = (
            f" ({text_redacted(code, sent)})"
            if code
            else f" ({ERROR_TEXT_NOT_SHOWN})"
            if isinstance(reason, str) and reason
            else ""
        )
        raise IsiError(f"{where}: HTTP {result.status}{said}")
    try:
        answer = _json_answer(result.content, "its answer")
    except IsiError as exc:
        raise IsiError(f"{where} answered HTTP {result.status}, but {exc}") from None
    value = answer.get("access_token") if isinstance(answer, dict) else None
    if not isinstance(value, str) or not value:
        raise IsiError(f"{where} answered without an access_token")
    if not bearer_token_sendable(value):
        # It goes into every call's Authorization header: a character HTTP cannot carry
        # would fail each call (the whole batch, before the sending caught it), forever.
        raise IsiError(
            f"{where} issued an access_token that is not visible ASCII (RFC 6749 appendix A.12)"
        )
    token_type = answer.get("token_type", "Bearer")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        # Named only when spelt as registered names are ("mac", "DPoP") and no form of the
        # secret sent: any other text is the endpoint's, kept and shown as the error is.
        named = (
            isinstance(token_type, str)
            and oauth_error_code(token_type.lower()) is not None
            and text_redacted(token_type, sent) == token_type
        )
        shown = f"a {token_type!r}" if named else "another kind of"
        raise IsiError(f"{where} issued {shown} token; a Bearer token is needed")
    expires_in = answer.get("expires_in")
    if isinstance(expires_in, str):  # some servers send a string ("²" is none: not a number)
        expires_in = ascii_integer(expires_in)
    if not isinstance(expires_in, int) or isinstance(expires_in, bool) or expires_in <= 0:
        expires_in = None
    return AccessToken(value=value, expires_in=expires_in)
