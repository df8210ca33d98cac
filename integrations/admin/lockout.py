"""The staff login's lockout: django-axes' database handler with a ceiling per account.

axes counts failed passwords per (username, address); an IPv6 address counts by its /64
(``client_network``), since one client holds a whole /64 to rotate through. On top of that,
failures for one account from every address together are held to
``DROPPORTAL_STAFF_LOGIN_ACCOUNT_FAILURE_LIMIT`` within the cool-off time, so guesses spread over
many addresses end too. Past that ceiling only addresses this account already signed in from
(axes' access log) keep their own count: whoever spreads wrong passwords over the network
locks out the guessing, not the owner at their usual address. Set in settings::

    AXES_HANDLER = "integrations.admin.lockout.StaffLoginLockout"
    AXES_CLIENT_IP_CALLABLE = "integrations.admin.lockout.lockout_address"

A signed-in member's password asked again (to enrol, for new recovery codes, to change it)
is under the same lockout, so a session left open or stolen is no way to guess it::

    codes = password_asked_again(request, lambda: service(user=..., password=typed))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username
from axes.models import AccessAttempt, AccessLog
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import ValidationError
from django.db.models import Sum
from django.http import HttpRequest

from integrations.client_address import client_network

_T = TypeVar("_T")
LOCKED_OUT = "Too many wrong passwords for this account: try again in 15 minutes."


def lockout_address(request: HttpRequest) -> str | None:
    """The address axes records: ``client_network``, a /64 by its first address (axes keeps
    addresses, not networks)."""
    network = client_network(request)
    return network.split("/")[0] if network else None


class StaffLoginLockout(AxesDatabaseHandler):  # type: ignore[misc]
    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """The failures that count: the pair's, or the limit itself once the account's
        ceiling is reached from an address the account never signed in from."""
        pair = int(super().get_failures(request, credentials))
        username = get_client_username(request, credentials)
        if not username or pair >= settings.AXES_FAILURE_LIMIT:
            return pair
        account = (
            AccessAttempt.objects.filter(
                username=username, attempt_time__gte=get_cool_off_threshold(request)
            ).aggregate(failures=Sum("failures_since_start"))["failures"]
            or 0
        )
        if account < settings.DROPPORTAL_STAFF_LOGIN_ACCOUNT_FAILURE_LIMIT:
            return pair
        address = getattr(request, "axes_ip_address", None)
        if address and AccessLog.objects.filter(username=username, ip_address=address).exists():
            return pair
        return int(settings.AXES_FAILURE_LIMIT)


def password_asked_again(request: HttpRequest, call: Callable[[], _T]) -> _T:
    """``call``, a service that checks the signed-in member's password asked again, under
    the login's lockout: refused while the account is locked out, and a wrong password (the
    service's ValidationError on ``password``) counts as a failed login."""
    credentials = {"username": request.user.get_username()}
    if not AxesProxyHandler.is_allowed(request, credentials):
        raise ValidationError({"password": LOCKED_OUT})
    try:
        return call()
    except ValidationError as exc:
        if "password" in exc.message_dict:
            user_login_failed.send(sender=__name__, credentials=credentials, request=request)
        raise
