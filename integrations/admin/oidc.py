"""Staff sign-in through the company's identity provider (OpenID Connect, Authlib's client).

Authlib does the protocol: discovery from ``DROPPORTAL_OIDC_ISSUER``'s
``/.well-known/openid-configuration``, the authorization code flow with PKCE (S256), a state
and a nonce kept in this session and spent once, and the ID token's checks (its RS256
signature against the provider's JWKS, issuer, audience, expiry, nonce). These views only
start it, hand the verified claims to ``staff_oidc_sign_in`` and render::

    /admin/oidc/sign-in/   -> the provider's authorization endpoint
    /admin/oidc/callback/  <- the provider sends the person back here (the redirect URI)

A refused sign-in (no mapped role, a deactivated or superuser account, an answer that fails
verification) is a page saying why, and a ledger event; nothing of the tokens is recorded or
logged. A callback that answers no sign-in this session started (no pending state of its
own: made up, or replayed) is the same page and no event: anyone can send one. Signing out
of an OIDC session goes on to the provider's end-session endpoint (RP-initiated logout, with
the ID token as ``id_token_hint``): ``oidc_logout_response``.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from typing import TYPE_CHECKING, Any

import requests
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.cache import never_cache
from rest_framework.request import Request

from integrations.admin.sign_in import sign_in_record_when_complete
from integrations.redaction import oauth_error_code
from integrations.services.staff.staff_sign_in import (
    OIDC,
    staff_oidc_sign_in,
    staff_sign_in_refuse,
)
from integrations.storable_text import storable
from integrations.web.throttling import OidcSignInThrottle

# Authlib (with joserfc) is imported where a sign-in needs it: loading it is a few hundredths
# of a second of every process's start, and most deployments sign staff in with passwords.
if TYPE_CHECKING:
    from authlib.integrations.django_client import DjangoOAuth2App

# This session's sign-in at the provider: whose it is, when the provider last asked for
# their credentials (``signed_in_at``: ``_authenticated_at``, None when unknown), whether
# the provider did MFA, and the ID token (the id_token_hint of the logout; nothing else
# reads it).
SESSION_KEY = "dropportal_oidc"
# How long a sign-in at the provider stands for the password asked again of an account that
# has none (to enrol our second factor, or to make new recovery codes): a stolen session
# cookie cannot sign in at the provider again. Counted from when the provider authenticated
# the person, not from our callback: a provider that signs someone in from its own session
# (single sign-on) asks nothing, so a browser left open would otherwise pass at any time.
RECENT_SIGN_IN = dt.timedelta(minutes=15)
# The sign-in's query flag that asks the provider for the person's credentials again
# (``prompt=login``, ``max_age=0``: OpenID Connect Core 3.1.2.1), as a password asked again.
REAUTHENTICATE = "reauthenticate"
_NEXT_KEY = "dropportal_oidc_next"
# In a pending sign-in's own state data (Authlib's, spent by its callback): it asked for it.
# Not in the session, where a sign-in started later would speak for an earlier one's callback.
_REAUTHENTICATE_KEY = "dropportal_reauthenticate"
_TIMEOUT_SECONDS = 10  # every call to the provider (discovery, JWKS, token)
_BACKEND = "django.contrib.auth.backends.ModelBackend"

UNVERIFIED = (
    "The identity provider's answer could not be verified, so you are not signed in. Try "
    "again; if it happens again, tell your dropportal administrator."
)
UNREACHABLE = "The identity provider did not answer. Try again in a moment."
NOT_SIGNED_IN_THERE = "The identity provider did not sign you in"
TOO_MANY_REFUSED = (
    "Too many sign-ins from your address were refused: try again in {seconds} seconds."
)


def oidc_enabled() -> bool:
    return bool(settings.DROPPORTAL_OIDC_ISSUER)


@functools.cache
def _client(issuer: str, client_id: str, client_secret: str, scopes: str) -> DjangoOAuth2App:
    # One per configuration: it keeps the provider's metadata and JWKS once fetched (a key
    # it does not know sends it to fetch the JWKS again).
    from authlib.integrations.django_client import OAuth

    registry = OAuth()
    registry.register(
        name="staff_idp",
        client_id=client_id,
        client_secret=client_secret,
        server_metadata_url=f"{issuer}/.well-known/openid-configuration",
        client_kwargs={
            "scope": scopes,
            "code_challenge_method": "S256",
            "default_timeout": _TIMEOUT_SECONDS,
        },
    )
    client: DjangoOAuth2App = registry.create_client("staff_idp")
    return client


def identity_provider() -> DjangoOAuth2App:
    return _client(
        settings.DROPPORTAL_OIDC_ISSUER,
        settings.DROPPORTAL_OIDC_CLIENT_ID,
        settings.DROPPORTAL_OIDC_CLIENT_SECRET,
        settings.DROPPORTAL_OIDC_SCOPES,
    )


def callback_url() -> str:
    """The redirect URI registered at the provider."""
    return f"{settings.DROPPORTAL_PUBLIC_URL}{reverse('admin:oidc_callback')}"


def post_logout_url() -> str:
    """The post-logout redirect URI registered at the provider."""
    return f"{settings.DROPPORTAL_PUBLIC_URL}{reverse('admin:login')}"


def _metadata() -> dict[str, Any]:
    from authlib.common.errors import AuthlibBaseError

    metadata: dict[str, Any] = identity_provider().load_server_metadata()
    # OpenID Connect Discovery §4.3: the document must name the issuer it was fetched from.
    if metadata.get("issuer", "").rstrip("/") != settings.DROPPORTAL_OIDC_ISSUER:
        raise AuthlibBaseError(description="the discovery document names another issuer")
    return metadata


def _wanted(request: HttpRequest, wanted: str) -> str:
    if url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return reverse("admin:index")


@never_cache
def oidc_sign_in_view(request: HttpRequest) -> HttpResponse:
    if not oidc_enabled():
        raise Http404("sign-in through an identity provider is not set up")
    # Anyone may start one, and each can end in a refusal the ledger keeps: an address whose
    # refusals spent its tokens (``_refusal_counted``) starts none, answered before a
    # session, a state or a call to the provider is made. Starting spends nothing, so a page
    # that makes browsers start sign-ins cannot shut staff out.
    too_many = _too_many_refused(request)
    if too_many is not None:
        return too_many
    from authlib.common.errors import AuthlibBaseError

    request.session[_NEXT_KEY] = _wanted(request, request.GET.get("next") or "")
    # max_age also obliges the provider to say in the ID token when it authenticated them.
    again = {"prompt": "login", "max_age": 0} if request.GET.get(REAUTHENTICATE) else {}
    try:
        _metadata()
        # Authlib's authorize_redirect, with the flag kept beside this sign-in's state.
        started = identity_provider().create_authorization_url(callback_url(), **again)
        started[_REAUTHENTICATE_KEY] = bool(again)
        identity_provider().save_authorize_data(request, redirect_uri=callback_url(), **started)
    except (AuthlibBaseError, requests.RequestException, ValueError):
        return _refused_page(request, UNREACHABLE, status=502)
    return HttpResponseRedirect(started["url"])


@never_cache
def oidc_callback_view(request: HttpRequest) -> HttpResponse:
    if not oidc_enabled():
        raise Http404("sign-in through an identity provider is not set up")
    # Anyone may send this address anything: only the answer to a sign-in this session
    # started is recorded (one per sign-in started, each start a new state), and a link's
    # own text is neither shown nor kept.
    state = _started_here(request)
    if state is not None:
        # Asked again here, not only at the start: sign-ins started before the address's
        # tokens ran out would each still be a ledgered refusal and a call to the provider.
        too_many = _too_many_refused(request)
        if too_many is not None:
            identity_provider().framework.clear_state_data(request.session, state)  # spent
            return too_many
    if "error" in request.GET:  # the person cancelled, or the provider would not sign them in
        if state is None:  # anyone's link: nothing it carries is shown or kept
            return _refused_page(request, NOT_SIGNED_IN_THERE)
        error = storable(str(request.GET["error"]))[:100]  # kept in jsonb: no NUL
        identity_provider().framework.clear_state_data(request.session, state)  # spent
        staff_sign_in_refuse(
            method=OIDC,
            reason="the identity provider answered with an error",
            username="",
            error=error,
        )
        _refusal_counted(request)
        return _refused_page(request, f"{NOT_SIGNED_IN_THERE} ({error})")
    if state is None:  # a state this session never made, or one already spent: a replay
        return _refused_page(request, UNVERIFIED)
    from authlib.common.errors import AuthlibBaseError
    from joserfc.errors import JoseError

    # Read before the token request spends the state: this callback's own sign-in's flag.
    pending = identity_provider().framework.get_state_data(request.session, state)
    asked_again = bool(pending.get(_REAUTHENTICATE_KEY))
    try:
        # The issuer exactly as the provider spells it (OIDC Core 3.1.3.7: iss equals the
        # discovery document's issuer), which _metadata checked is ours: the setting loses a
        # trailing "/" that some providers' issuers end with (Auth0's).
        issuer = _metadata()["issuer"]
        token = identity_provider().authorize_access_token(
            request,
            # The audience is checked here, not left to Authlib: alone it accepts an ID token
            # for another client when its azp names ours (OIDC Core 3.1.3.7 wants aud to).
            claims_options={
                "iss": {"essential": True, "values": [issuer]},
                "aud": {"essential": True, "values": [settings.DROPPORTAL_OIDC_CLIENT_ID]},
            },
        )
        claims = dict(token["userinfo"])
    except (AuthlibBaseError, JoseError, requests.RequestException, ValueError, KeyError) as exc:
        # The error's kind names the check that failed; its text may quote the answer.
        staff_sign_in_refuse(
            method=OIDC, reason="the answer failed verification", username="", error=_kind(exc)
        )
        _refusal_counted(request)
        return _refused_page(request, UNVERIFIED)
    outcome = staff_oidc_sign_in(issuer=settings.DROPPORTAL_OIDC_ISSUER, claims=claims)
    if outcome.user is None:  # refused, and recorded
        _refusal_counted(request)
        return _refused_page(request, outcome.refusal)
    wanted = request.session.pop(_NEXT_KEY, None) or reverse("admin:index")
    authenticated_at = _authenticated_at(claims, asked_again=asked_again)
    login(request, outcome.user, backend=_BACKEND)
    request.session[SESSION_KEY] = {
        "user": outcome.user.pk,
        "mfa": outcome.mfa_by_idp,
        "signed_in_at": authenticated_at,
        "id_token": token.get("id_token", ""),
    }
    # Ends this long after the sign-in whatever the activity: the roles are read again then.
    request.session.set_expiry(
        timezone.now() + dt.timedelta(hours=settings.DROPPORTAL_SESSION_HOURS)
    )
    sign_in_record_when_complete(request, **outcome.sign_in)
    if not admin.site.has_permission(request):  # our own second factor is still to pass
        return HttpResponseRedirect(f"{reverse('admin:mfa_verify')}?{urlencode({'next': wanted})}")
    return HttpResponseRedirect(wanted)


def _authenticated_at(claims: dict[str, Any], *, asked_again: bool) -> float | None:
    """When the provider last asked the person for their credentials: the ID token's
    ``auth_time`` (never later than now); without one, now when this sign-in asked it to ask
    them (``prompt=login``), else None (unknown: a sign-in from its own session, maybe)."""
    at = claims.get("auth_time")
    now = timezone.now().timestamp()
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        return now if asked_again else None
    return min(float(at), now)


def _too_many_refused(request: HttpRequest) -> HttpResponse | None:
    """The 429 page when the client's address spent its refusals' tokens, else None."""
    throttle = OidcSignInThrottle()
    if throttle.allow_request(Request(request), None):
        return None
    seconds = max(1, math.ceil(throttle.wait()))
    refused = _refused_page(request, TOO_MANY_REFUSED.format(seconds=seconds), status=429)
    refused["Retry-After"] = str(seconds)
    # Anyone can flood this: no line per answer in the log (as the callbacks' refusals).
    refused._has_been_logged = True  # type: ignore[attr-defined]
    return refused


def _refusal_counted(request: HttpRequest) -> None:
    """A refusal the ledger recorded spends a token of the client's address."""
    OidcSignInThrottle().take(Request(request), None)  # DRF's view of this request


def _started_here(request: HttpRequest) -> str | None:
    """The callback's ``state`` when it is a sign-in this session started and has not yet
    spent (Authlib keeps it in the session until the callback uses it), else None."""
    state = str(request.GET.get("state") or "")
    if state and identity_provider().framework.get_state_data(request.session, state):
        return state
    return None


def oidc_session(request: HttpRequest) -> dict[str, Any] | None:
    """This session's sign-in at the provider, if it is the signed-in person's."""
    found = request.session.get(SESSION_KEY)
    if isinstance(found, dict) and found.get("user") == request.user.pk:
        return found
    return None


def oidc_mfa_passed(request: HttpRequest) -> bool:
    """The provider did multi-factor authentication for this session's sign-in."""
    found = oidc_session(request)
    return bool(found and found.get("mfa"))


def oidc_signed_in_recently(request: HttpRequest) -> bool:
    """The provider authenticated this session's person less than ``RECENT_SIGN_IN`` ago."""
    found = oidc_session(request)
    at = found.get("signed_in_at") if found else None
    # Not said by the provider's ID token, or a session from before it was recorded: not
    # recent (a sign-in that asks for the credentials again gets it said).
    if not isinstance(at, int | float):
        return False
    return timezone.now().timestamp() - at < RECENT_SIGN_IN.total_seconds()


def oidc_sign_in_url(next_url: str, *, reauthenticate: bool = False) -> str:
    """The sign-in through the provider, back to ``next_url``; ``reauthenticate``: the
    provider asks for the person's credentials even when it has a session of theirs."""
    query = {"next": next_url, **({REAUTHENTICATE: "1"} if reauthenticate else {})}
    return f"{reverse('admin:oidc_sign_in')}?{urlencode(query)}"


def oidc_logout_url(id_token: str) -> str | None:
    """Where to send a person signing out of an OIDC session: the provider's end-session
    endpoint (None when it has none: the session here ends all the same)."""
    from authlib.common.errors import AuthlibBaseError

    try:
        metadata = _metadata()
    except (AuthlibBaseError, requests.RequestException, ValueError):
        return None
    if not metadata.get("end_session_endpoint"):
        return None
    created = identity_provider().create_logout_url(
        post_logout_redirect_uri=post_logout_url(), id_token_hint=id_token
    )
    return str(created["url"])


def _refused_page(request: HttpRequest, reason: str, *, status: int = 403) -> TemplateResponse:
    return TemplateResponse(
        request,
        "admin/oidc/refused.html",
        {
            **admin.site.each_context(request),
            "title": "Not signed in",
            "reason": reason,
            "provider_name": settings.DROPPORTAL_OIDC_PROVIDER_NAME,
        },
        status=status,
    )


def _kind(exc: Exception) -> str:
    # Only an error code, else the exception's class: the token endpoint's error text may
    # echo the client secret, and the ledger keeps what it is given for good.
    return oauth_error_code(getattr(exc, "error", None)) or type(exc).__name__
