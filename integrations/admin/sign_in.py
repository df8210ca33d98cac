"""A staff sign-in is a ledger event (``staff_user.signed_in``) once it is complete.

That is at once when no second factor of ours is asked (MFA off for the account, the
identity provider's MFA standing for it); otherwise the sign-in waits in the session until
the second factor passes (``/admin/mfa/``, or the enrolment of a first one), or until the
second step finds it passed already (a member signing in again from a session that passed
it). A password, or a provider's sign-in without its MFA, that never passes our second
factor is no sign-in in the ledger: each wrong code is ``staff_user.mfa_failed``
(``staff_mfa_verify``)::

    sign_in_record_when_complete(request, method="password")  # right after login()
    sign_in_complete(request, second_factor="app")  # the second step passed ("": already)
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from integrations.services.staff.staff_sign_in import staff_signed_in_record

# The sign-in of this session waiting for the second factor: its user and what it records.
_PENDING_KEY = "dropportal_sign_in_pending"


def sign_in_record_when_complete(request: HttpRequest, *, method: str, **details: Any) -> None:
    """The sign-in ``login()`` just made: recorded now when it is complete, else kept."""
    # An earlier sign-in of this session that never passed the second factor: not this one's.
    request.session.pop(_PENDING_KEY, None)
    if admin.site.has_permission(request):
        staff_signed_in_record(user=request.user, method=method, **details)  # type: ignore[arg-type]
    else:
        request.session[_PENDING_KEY] = {"user": request.user.pk, "method": method, **details}


def sign_in_complete(request: HttpRequest, *, second_factor: str) -> None:
    """The second step passed (``second_factor``: the factor, "" when this session had passed
    it already): the sign-in waiting for it, if any, is recorded."""
    pending = request.session.pop(_PENDING_KEY, None)
    if isinstance(pending, dict) and pending.pop("user", None) == request.user.pk:
        staff_signed_in_record(user=request.user, second_factor=second_factor, **pending)  # type: ignore[arg-type]
