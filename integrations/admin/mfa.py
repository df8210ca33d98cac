"""The staff login's second step: a TOTP code (or a recovery code), and guided enrolment.

After the password, a staff member who must use MFA (``staff_mfa_required``) and has not yet
passed it this session is sent here by the admin site (``DropportalAdminSite``):

- ``/admin/mfa/``: enter the code of the authenticator app, or one recovery code (used up);
- ``/admin/mfa/enrol/``: the first time, the app's secret as a QR code, an ``otpauth://``
  URI and in text, this session's own; a code from the app and the password again confirm
  it, and the recovery codes are shown once;
- ``/admin/mfa/recovery-codes/``: once logged in, new recovery codes (the password again),
  shown once; the old ones stop working.

An account of the identity provider has no password: the provider asking for its
credentials within ``RECENT_SIGN_IN`` (its ID token's ``auth_time``) stands for it on both
pages (a stolen session cookie cannot sign in there again); past that, the page sends the
person to sign in there again, the provider asked to ask for the credentials even when it
still has a session of theirs (a browser left open signs in there without them).

A wrong code slows down only the factor it was shaped for, and is a ledger event
(``staff_mfa_verify``); django-axes locks out repeated wrong passwords before this step, and
counts a wrong password asked again here as a failed login (a session left open is no way to
guess the password).
"""

from __future__ import annotations

from base64 import b32encode
from collections.abc import Callable
from functools import wraps
from typing import Any

import django_otp
from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import logout
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_POST

from integrations.admin.actors import staff_actor
from integrations.admin.lockout import password_asked_again
from integrations.admin.oidc import RECENT_SIGN_IN, oidc_sign_in_url, oidc_signed_in_recently
from integrations.admin.sign_in import sign_in_complete
from integrations.services.staff.staff_mfa import (
    staff_mfa_enrol,
    staff_mfa_enrolled,
    staff_mfa_factor,
    staff_mfa_pending_device,
    staff_mfa_recovery_codes_left,
    staff_mfa_recovery_codes_renew,
    staff_mfa_verify,
)


def _next_url(request: HttpRequest) -> str:
    wanted = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return reverse("admin:index")


def _staff_with_password(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Only for a staff member who gave their password: anyone else logs in first."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if not (user.is_authenticated and user.is_active and user.is_staff):
            return HttpResponseRedirect(resolve_url("admin:login"))
        return view(request, *args, **kwargs)

    return never_cache(sensitive_post_parameters("otp_token", "password")(guarded))


def _member(request: HttpRequest) -> Any:
    """The staff member who gave their password (``_staff_with_password`` checked it)."""
    return request.user


def _session_key(request: HttpRequest) -> str:
    if request.session.session_key is None:
        request.session.save()
    return str(request.session.session_key)


def _error(exc: ValidationError) -> str:
    return " ".join(m for messages in exc.message_dict.values() for m in messages)


def _at_provider(request: HttpRequest) -> bool:
    """An account of the identity provider: it has no password to ask again."""
    return not _member(request).has_usable_password()


def _password_or_provider(request: HttpRequest, password: str) -> str | None:
    """What a service checks as the password asked again: the one typed, or None for an
    account of the identity provider that gave its credentials there lately, which stands
    for it. Otherwise it is sent there again (not a wrong password: nothing is counted)."""
    if not _at_provider(request):
        return password
    if oidc_signed_in_recently(request):
        return None
    minutes = int(RECENT_SIGN_IN.total_seconds() // 60)
    raise ValidationError(
        {
            "sign_in": f"Sign in again at {settings.DROPPORTAL_OIDC_PROVIDER_NAME} first: it "
            f"stands for your password for {minutes} minutes after you gave it your credentials."
        }
    )


def _render(request: HttpRequest, template: str, **context: Any) -> TemplateResponse:
    return TemplateResponse(
        request,
        template,
        {**admin.site.each_context(request), "next": _next_url(request), **context},
    )


@_staff_with_password
def mfa_verify_view(request: HttpRequest) -> HttpResponse:
    if admin.site.has_permission(request):
        # Passed already (a member signing in again, from a session that passed its second
        # factor): that sign-in is complete; on to the page they were going to.
        sign_in_complete(request, second_factor="")
        return HttpResponseRedirect(_next_url(request))
    if not staff_mfa_enrolled(_member(request)):
        return HttpResponseRedirect(f"{reverse('admin:mfa_enrol')}?next={_next_url(request)}")
    error = ""
    if request.method == "POST":
        device = staff_mfa_verify(
            user=_member(request),
            token=request.POST.get("otp_token") or "",
            actor=staff_actor(request),
        )
        if device is not None:
            django_otp.login(request, device)
            request.session.cycle_key()  # a new session id once fully authenticated
            sign_in_complete(request, second_factor=staff_mfa_factor(device))
            return HttpResponseRedirect(_next_url(request))
        error = "That code does not match (or too many tries: wait a moment and try again)."
    return _render(request, "admin/mfa/verify.html", title="Two-factor authentication", error=error)


@_staff_with_password
def mfa_enrol_view(request: HttpRequest) -> HttpResponse:
    if staff_mfa_enrolled(_member(request)):
        return HttpResponseRedirect(f"{reverse('admin:mfa_verify')}?next={_next_url(request)}")
    session_key = _session_key(request)
    device = staff_mfa_pending_device(user=_member(request), session_key=session_key)
    error = ""
    if request.method == "POST":
        try:
            codes = password_asked_again(
                request,
                lambda: staff_mfa_enrol(
                    user=_member(request),
                    session_key=session_key,
                    token=request.POST.get("otp_token") or "",
                    password=_password_or_provider(request, request.POST.get("password") or ""),
                    actor=staff_actor(request),
                ),
            )
        except ValidationError as exc:
            error = _error(exc)
        else:
            device.refresh_from_db()
            django_otp.login(request, device)
            request.session.cycle_key()
            sign_in_complete(request, second_factor=staff_mfa_factor(device))
            return _render(
                request,
                "admin/mfa/recovery_codes.html",
                title="Your recovery codes",
                codes=codes,
            )
    # Only this page draws a QR code, and every process (each command, each web worker)
    # loads the admin at start.
    import segno

    uri = device.config_url
    return _render(
        request,
        "admin/mfa/enrol.html",
        title="Set up two-factor authentication",
        secret=b32encode(device.bin_key).decode("ascii"),
        uri=uri,
        qr_svg=segno.make(uri, error="m").svg_inline(scale=5, dark="#1f2937"),
        error=error,
        **_provider_context(request),
    )


def _provider_context(request: HttpRequest) -> dict[str, Any]:
    """What a page asking for the password again shows an account of the identity provider:
    no password field, and the way back there once its sign-in is no longer recent."""
    at_provider = _at_provider(request)
    stale = at_provider and not oidc_signed_in_recently(request)
    return {
        "signed_in_at_provider": at_provider,
        "provider_name": settings.DROPPORTAL_OIDC_PROVIDER_NAME,
        "sign_in_again_url": (
            oidc_sign_in_url(request.get_full_path(), reauthenticate=True) if stale else ""
        ),
    }


class _PasswordAgainForm(forms.Form):
    password = forms.CharField(
        label="Your password", strip=False, widget=forms.PasswordInput(render_value=False)
    )


@sensitive_post_parameters("password")
def mfa_recovery_codes_view(request: HttpRequest) -> HttpResponse:
    """New recovery codes for a fully logged-in staff member (behind ``admin_view``); the
    password again, so that a session left open does not yield lasting second factors (for
    an account of the identity provider, a recent sign-in there instead)."""
    form = _PasswordAgainForm(request.POST if request.method == "POST" else None)
    form.fields["password"].required = not _at_provider(request)
    if request.method == "POST" and form.is_valid():
        try:
            codes = password_asked_again(
                request,
                lambda: staff_mfa_recovery_codes_renew(
                    user=_member(request),
                    password=_password_or_provider(request, form.cleaned_data["password"]),
                    actor=staff_actor(request),
                ),
            )
        except ValidationError as exc:
            form.add_error("password", _error(exc))
        else:
            return _render(
                request,
                "admin/mfa/recovery_codes.html",
                title="Your new recovery codes",
                codes=codes,
                renewed=True,
            )
    return _render(
        request,
        "admin/mfa/recovery_codes_renew.html",
        title="New recovery codes",
        form=form,
        remaining=staff_mfa_recovery_codes_left(_member(request)),
        **_provider_context(request),
    )


@require_POST
@_staff_with_password
def mfa_logout_view(request: HttpRequest) -> HttpResponse:
    """Leave the second step: the admin's own logout needs a fully logged-in staff member."""
    logout(request)
    return HttpResponseRedirect(resolve_url("admin:login"))
