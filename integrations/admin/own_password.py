"""A staff member changes their own password (the admin's *Change password*,
``/admin/password_change/``).

Django's page and form, but the old password is checked by ``staff_password_change`` under
the login's lockout (``password_asked_again``), not by the form: a wrong one counts as a
failed login and the page refuses every try while the account is locked out, so a session
left open or stolen is no way to guess the password. The change is a ledger event, and the
member's other sessions end::

    own_password_change_view(request, success_url=done, template_name=None, context=page)
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import update_session_auth_hash
from django.contrib.auth.views import PasswordChangeView
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from unfold.forms import AdminOwnPasswordChangeForm

from integrations.admin.actors import staff_actor
from integrations.admin.lockout import password_asked_again
from integrations.services.staff.staff_mfa import staff_password_change


class _OwnPasswordChangeForm(AdminOwnPasswordChangeForm):
    def clean_old_password(self) -> str:
        # Checked in form_valid, under the lockout; here it would be an unthrottled oracle.
        return str(self.cleaned_data["old_password"])


class _OwnPasswordChangeView(PasswordChangeView):
    form_class = _OwnPasswordChangeForm

    def form_valid(self, form: Any) -> HttpResponse:
        request = self.request
        try:
            password_asked_again(
                request,
                lambda: staff_password_change(
                    user=form.user,
                    old_password=form.cleaned_data["old_password"],
                    new_password=form.cleaned_data["new_password1"],
                    actor=staff_actor(request),
                    keep_session_key=request.session.session_key,
                ),
            )
        except ValidationError as exc:
            for messages in exc.message_dict.values():
                for message in messages:
                    form.add_error("old_password", message)
            return self.form_invalid(form)
        update_session_auth_hash(request, form.user)  # this session stays signed in
        return HttpResponseRedirect(self.get_success_url())


def own_password_change_view(
    request: HttpRequest, *, success_url: str, template_name: str | None, context: dict[str, Any]
) -> HttpResponseBase:
    """The page, as ``AdminSite.password_change`` builds it, with the checks above."""
    options: dict[str, Any] = {"success_url": success_url, "extra_context": context}
    if template_name is not None:
        options["template_name"] = template_name
    return _OwnPasswordChangeView.as_view(**options)(request)
