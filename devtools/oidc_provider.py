"""A loopback OpenID Connect provider (a company's Okta or Entra ID), for tests and the demo.

Built with Authlib's server parts (its authorization server, the authorization code grant
with PKCE required, OpenID Connect's ID token and RP-initiated logout): it serves discovery,
a JWKS, the authorization, token and end-session endpoints on 127.0.0.1 (a free port), and
signs real RS256 ID tokens::

    with OidcProvider(client_id="dropportal", client_secret=secret,
                      redirect_uri=f"{public_url}/admin/oidc/callback/",
                      post_logout_redirect_uri=f"{public_url}/admin/login/") as idp:
        idp.add_person("ada", groups=["privacy-ops"], amr=["pwd", "mfa"])
        idp.signed_in = "ada"      # who the next authorization request is granted for
        ... DROPPORTAL_OIDC_ISSUER=idp.issuer ...
        idp.next_id_token = IdTokenTweak(audience="someone-else")  # one misbehaving answer
        idp.next_token_error = (401, {"error": "invalid_client"})  # the token endpoint's, once
        idp.ended_sessions          # the ID token claims of each end-session request
        idp.person("ada").authenticated_at = time.time() - 7200  # its own session, 2 h old

A person whose ``authenticated_at`` is set is signed in at the provider already (single
sign-on): an authorization request is granted without asking anything, its ``auth_time``
that older time, unless it asks for credentials again (``prompt=login`` or ``max_age=0``).
``idp.omits_auth_time = True``: its ID tokens never carry ``auth_time`` (OpenID Connect makes
it optional unless ``max_age`` is asked; a provider may leave it out all the same).

Without ``signed_in`` the authorization endpoint shows a small sign-in form listing the
people (the browser test and ``make demo --sso`` use it). Standard library, Authlib and
joserfc only; nothing is kept once the provider stops but its signing keys, made once a
process.
"""

from __future__ import annotations

import functools
import html
import json
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from authlib.oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import OAuth2Request
from authlib.oauth2.rfc6749.errors import OAuth2Error
from authlib.oauth2.rfc6749.grants import AuthorizationCodeGrant
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core.grants import OpenIDCode
from authlib.oidc.rpinitiated import EndSessionEndpoint
from joserfc.jwk import KeySet, RSAKey

from devtools.loopback import LoopbackServer, serve_in_thread

SCOPES = "openid email profile groups"


@dataclass
class Person:
    """Someone the provider signs in: their claims as an IdP would send them."""

    username: str
    subject: str
    email: str
    groups: list[str]
    amr: list[str]
    # When the provider last asked for their credentials, if it keeps a session of theirs
    # (None: it asks at every authorization request).
    authenticated_at: float | None = None


@dataclass(frozen=True)
class IdTokenTweak:
    """How the next ID token goes wrong: another audience, an expiry in the past (seconds
    since it was issued), a key the JWKS does not hold, or the previous sign-in's token
    again (its nonce belongs to another sign-in)."""

    audience: str | None = None
    expired_seconds_ago: int | None = None
    foreign_key: bool = False
    replay_previous: bool = False


@dataclass
class _Client:
    client_id: str
    client_secret: str
    redirect_uris: list[str]
    client_metadata: dict[str, Any]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return self.redirect_uris[0]

    def get_allowed_scope(self, scope: str) -> str:
        return " ".join(s for s in (scope or "").split() if s in SCOPES.split())

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret.encode(), self.client_secret.encode())

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "authorization_code"


@dataclass
class _AuthorizationCode:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    person: Person
    nonce: str | None
    code_challenge: str | None
    code_challenge_method: str | None
    auth_time: int | None = field(default_factory=lambda: int(time.time()))

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> str | None:
        return self.nonce

    def get_auth_time(self) -> int | None:
        return self.auth_time

    def get_acr(self) -> None:
        return None

    def get_amr(self) -> list[str]:
        return list(self.person.amr)


@dataclass
class _HttpRequest:
    method: str
    url: str
    headers: Any
    query: dict[str, str]
    form: dict[str, str]


class _HttpOAuth2Request(OAuth2Request):
    def __init__(self, request: _HttpRequest) -> None:
        super().__init__(method=request.method, uri=request.url, headers=request.headers)
        self._request = request
        self.payload = BasicOAuth2Payload({**request.query, **request.form})

    @property
    def args(self) -> dict[str, str]:
        return self._request.query

    @property
    def form(self) -> dict[str, str]:
        return self._request.form


class _Server(AuthorizationServer):
    def __init__(self, provider: OidcProvider) -> None:
        super().__init__(scopes_supported=SCOPES.split())
        self.provider = provider
        self.register_token_generator("default", self._bearer_token)

    @staticmethod
    def _bearer_token(
        grant_type: str, client: Any, user: Any = None, scope: str = "", **kwargs: Any
    ) -> dict[str, Any]:
        return {
            "token_type": "Bearer",
            "access_token": secrets.token_urlsafe(32),
            "expires_in": 3600,
            "scope": scope,
        }

    def query_client(self, client_id: str) -> _Client | None:
        client = self.provider._client
        return client if client.client_id == client_id else None

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        pass  # the ID token is what dropportal reads; access tokens open nothing here

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    def create_oauth2_request(self, request: _HttpRequest) -> _HttpOAuth2Request:
        return _HttpOAuth2Request(request)

    def create_json_request(self, request: Any) -> Any:
        raise NotImplementedError("no JSON endpoint here")

    def handle_response(self, status: int, body: Any, headers: Any) -> tuple[int, bytes, Any]:
        if isinstance(body, dict):
            body = json.dumps(body)
        return status, (body or "").encode(), list(headers or [])


class _CodeGrant(AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]

    def save_authorization_code(self, code: str, request: OAuth2Request) -> None:
        data = request.payload.data
        provider: OidcProvider = self.server.provider
        provider._codes[code] = _AuthorizationCode(
            code=code,
            client_id=request.client.get_client_id(),
            redirect_uri=data.get("redirect_uri") or "",
            scope=request.scope or "",
            person=request.user,
            nonce=data.get("nonce"),
            code_challenge=data.get("code_challenge"),
            code_challenge_method=data.get("code_challenge_method"),
            auth_time=_auth_time(provider, request.user, data),
        )

    def query_authorization_code(self, code: str, client: _Client) -> _AuthorizationCode | None:
        found = self.server.provider._codes.get(code)
        return found if found and found.client_id == client.client_id else None

    def delete_authorization_code(self, authorization_code: _AuthorizationCode) -> None:
        self.server.provider._codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code: _AuthorizationCode) -> Person:
        return authorization_code.person


def _auth_time(provider: OidcProvider, person: Person, asked: Mapping[str, Any]) -> int | None:
    """The code's ``auth_time``: the person's session at the provider stands, unless the
    request asks for their credentials again (OIDC Core 3.1.2.1), which renews it. None: its
    ID token says nothing of it (``omits_auth_time``)."""
    again = "login" in str(asked.get("prompt") or "").split() or asked.get("max_age") == "0"
    at = person.authenticated_at
    if at is None or again:
        at = time.time()
        if person.authenticated_at is not None:
            person.authenticated_at = at
    if provider.omits_auth_time:
        return None
    return int(at)


class _OpenIdCode(OpenIDCode):
    def __init__(self, provider: OidcProvider) -> None:
        super().__init__(require_nonce=True)
        self.provider = provider

    def exists_nonce(self, nonce: str, request: OAuth2Request) -> bool:
        return any(code.nonce == nonce for code in self.provider._codes.values())

    def resolve_client_private_key(self, client: _Client) -> Any:
        tweak = self.provider._tweak
        return self.provider._foreign_key if tweak.foreign_key else self.provider._key

    def get_encode_header(self, client: _Client) -> dict[str, str]:
        return {"alg": "RS256", "kid": self.provider._key.kid or ""}

    def get_compatible_claims(self, request: OAuth2Request) -> dict[str, Any]:
        claims: dict[str, Any] = super().get_compatible_claims(request)
        code = request.authorization_code
        if code is not None and code.get_auth_time() is None:  # Authlib would put "now"
            claims.pop("auth_time", None)
        return claims

    def get_client_claims(self, client: _Client) -> dict[str, Any]:
        tweak = self.provider._tweak
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.provider.issued_as or self.provider.issuer,
            "aud": tweak.audience or client.get_client_id(),
        }
        if tweak.audience:  # for another client, yet saying it was issued to this one
            claims["azp"] = client.get_client_id()
        if tweak.expired_seconds_ago is not None:
            claims["iat"] = now - tweak.expired_seconds_ago - 300
            claims["exp"] = now - tweak.expired_seconds_ago
        return claims

    def generate_user_info(self, user: Person, scope: str) -> dict[str, Any]:
        return {
            "sub": user.subject,
            "preferred_username": user.username,
            "email": user.email,
            "groups": list(user.groups),
        }

    def process_token(self, grant: Any, response: Any) -> Any:
        provider = self.provider
        with provider._lock:  # the tweak is read by the hooks above while this token is signed
            try:
                token = super().process_token(grant, response)
                previous = provider._last_id_token
                if "id_token" in token:
                    provider._last_id_token = token["id_token"]
                    if provider._tweak.replay_previous and previous:
                        token["id_token"] = previous
            finally:
                provider._tweak = IdTokenTweak()
        return token


class _EndSession(EndSessionEndpoint):
    def get_server_jwks(self) -> dict[str, Any]:
        return self.server.provider.jwks()

    def end_session(self, end_session_request: Any) -> None:
        self.server.provider.ended_sessions.append(dict(end_session_request.id_token_claims or {}))


class _HttpServer(LoopbackServer):
    provider: OidcProvider


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        parts = urlsplit(self.path)
        request = _HttpRequest(
            method=self.command,
            url=f"{self.server.provider.issuer}{parts.path}"
            + (f"?{parts.query}" if parts.query else ""),
            headers=self.headers,
            query=dict(parse_qsl(parts.query)),
            form=dict(parse_qsl(body)) if self.command == "POST" else {},
        )
        status, payload, headers = self.server.provider._answer(parts.path, request)
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(payload)


@functools.cache
def _signing_keys() -> tuple[RSAKey, RSAKey]:
    """The providers' signing key, and another with the same key id (a token it signs names
    our key but fails its check). Made once a process: two 2048-bit RSA keys were most of a
    provider's start, and nothing needs them new (each provider is an issuer of its own)."""
    key = RSAKey.generate_key(2048, parameters={"use": "sig"}, auto_kid=True)
    return key, RSAKey.generate_key(2048, parameters={"kid": key.kid or ""})


class OidcProvider:
    """A running provider for one client (see the module docstring)."""

    def __init__(
        self,
        *,
        client_id: str,
        client_secret: str,
        redirect_uri: str,
        post_logout_redirect_uri: str,
        port: int = 0,
    ) -> None:
        self._client = _Client(
            client_id=client_id,
            client_secret=client_secret,
            redirect_uris=[redirect_uri],
            client_metadata={"post_logout_redirect_uris": [post_logout_redirect_uri]},
        )
        self._key, self._foreign_key = _signing_keys()
        self._people: dict[str, Person] = {}
        self._codes: dict[str, _AuthorizationCode] = {}
        self._tweak = IdTokenTweak()
        self._last_id_token: str | None = None
        self._lock = threading.RLock()
        self.signed_in: str | None = None
        self.ended_sessions: list[dict[str, Any]] = []
        self._server = _Server(self)
        self._server.register_grant(_CodeGrant, [CodeChallenge(required=True), _OpenIdCode(self)])
        self._server.register_endpoint(_EndSession)
        self._http = _HttpServer(("127.0.0.1", port), _Handler)
        self._http.provider = self
        self.issuer = f"http://127.0.0.1:{self._http.server_address[1]}"
        # How it names itself in discovery and ID tokens when not ``issuer`` exactly (some
        # providers' issuers end with "/"); its endpoints stay under ``issuer``.
        self.issued_as: str | None = None
        self.omits_auth_time = False
        # The token endpoint's next answer, an error (status, JSON body), instead of a token.
        self.next_token_error: tuple[int, dict[str, Any]] | None = None
        self._thread: threading.Thread | None = None

    # -- set-up -------------------------------------------------------------------------

    def add_person(
        self,
        username: str,
        *,
        groups: Iterable[str] = (),
        amr: Iterable[str] = ("pwd",),
        email: str | None = None,
        subject: str | None = None,
    ) -> Person:
        person = Person(
            username=username,
            subject=subject or f"00u{secrets.token_hex(8)}",
            email=email or f"{username}@example.com",
            groups=list(groups),
            amr=list(amr),
        )
        self._people[username] = person
        return person

    def person(self, username: str) -> Person:
        return self._people[username]

    @property
    def next_id_token(self) -> IdTokenTweak:
        return self._tweak

    @next_id_token.setter
    def next_id_token(self, tweak: IdTokenTweak) -> None:
        self._tweak = tweak

    def jwks(self) -> dict[str, Any]:
        return dict(KeySet([self._key]).as_dict(private=False))

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issued_as or self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "end_session_endpoint": f"{self.issuer}/end_session",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": SCOPES.split(),
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "code_challenge_methods_supported": ["S256"],
            "claims_supported": ["sub", "email", "preferred_username", "groups", "amr"],
        }

    # -- serving ------------------------------------------------------------------------

    def __enter__(self) -> OidcProvider:
        self._thread = serve_in_thread(self._http, name="oidc-provider")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def _answer(self, path: str, request: _HttpRequest) -> tuple[int, bytes, list[Any]]:
        if path == "/.well-known/openid-configuration":
            return _json(self.metadata())
        if path == "/jwks":
            return _json(self.jwks())
        if path == "/token" and request.method == "POST":
            with self._lock:
                if self.next_token_error is not None:
                    (status, body), self.next_token_error = self.next_token_error, None
                    return status, json.dumps(body).encode(), [("Content-Type", "application/json")]
                return self._server.create_token_response(request)  # type: ignore[no-any-return]
        if path == "/authorize":
            return self._authorize(request)
        if path == "/end_session":
            try:
                answer = self._server.create_endpoint_response("end_session", request)
            except OAuth2Error as error:
                return 400, html.escape(error.description or error.error).encode(), []
            return answer or (200, b"Signed out of the identity provider.", [])
        return 404, b"not found", []

    def _authorize(self, request: _HttpRequest) -> tuple[int, bytes, list[Any]]:
        chosen = request.form.get("username") or self.signed_in
        person = self._people.get(chosen or "")
        if person is None:
            return _sign_in_form(request.query, self._people)
        try:
            with self._lock:
                grant = self._server.get_consent_grant(request)
                return self._server.create_authorization_response(  # type: ignore[no-any-return]
                    request, grant_user=person, grant=grant
                )
        except OAuth2Error as error:
            return 400, html.escape(error.description or error.error).encode(), []


def _json(value: Any) -> tuple[int, bytes, list[Any]]:
    return 200, json.dumps(value).encode(), [("Content-Type", "application/json")]


def _sign_in_form(query: Mapping[str, str], people: Mapping[str, Person]) -> tuple[int, bytes, Any]:
    options = "".join(
        f'<option value="{html.escape(name)}">{html.escape(name)} '
        f"({html.escape(', '.join(p.groups) or 'no groups')})</option>"
        for name, p in people.items()
    )
    page = (
        "<!doctype html><html><head><title>Loopback identity provider</title></head><body>"
        "<h1>Loopback identity provider</h1>"
        f'<form method="post" action="/authorize?{html.escape(urlencode(query))}">'
        f'<label for="username">Sign in as</label> <select id="username" name="username">'
        f'{options}</select> <button type="submit">Sign in</button></form></body></html>'
    )
    return 200, page.encode(), [("Content-Type", "text/html; charset=utf-8")]
