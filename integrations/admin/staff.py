"""Staff accounts and their roles in the admin, each change a ledger event.

Django's own user and group admins, plus one ledger event per addition, change or deletion
in the same transaction, with the staff user who made it as the actor. The event names the
changed fields and the account's roles afterwards, never a password or its hash::

    staff_user.added / staff_user.changed / staff_user.deleted   subject: the username
    group.added / group.changed / group.deleted                  subject: the group name

Who may grant a role is itself something an auditor asks about. A superuser may reset a staff
member's two-factor authentication (a lost phone): they enrol again at their next login. A
reset of the factor or of the password ends every session of that member and is its own
ledger event (``staff_user.mfa_reset``, ``staff_user.password_reset``) naming the superuser.
django-otp's own device admins are not offered (``dropportal.apps``): they would show TOTP seeds
and recovery codes.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from unfold.admin import ModelAdmin
from unfold.forms import AdminPasswordChangeForm, UserChangeForm, UserCreationForm

from integrations.admin.actors import staff_actor
from integrations.ledger_kinds import ledger_kind_compose
from integrations.services.ledger import ledger_event_append
from integrations.services.staff_mfa import staff_mfa_reset, staff_password_reset_record


def _changed_fields(message: Any) -> list[str]:
    """The changed fields as the form labels them, from Django's change message."""
    if isinstance(message, list):
        entries = message
    else:
        try:
            entries = json.loads(message) if message else []
        except ValueError:
            return [str(message)]
    fields: list[str] = []
    for entry in entries:
        for details in entry.values():
            fields.extend(str(name) for name in details.get("fields", []))
    return sorted(set(fields))


class _LedgeredAdmin(admin.ModelAdmin):
    """Appends a ledger event wherever Django's admin writes its own log entry."""

    ledger_kind = ""

    def ledger_data(self, obj: Any) -> dict[str, Any]:
        return {}

    def _append(self, request: HttpRequest, obj: Any, verb: str, **data: Any) -> None:
        ledger_event_append(
            kind=ledger_kind_compose(self.ledger_kind, verb),
            subject=str(obj),
            actor=staff_actor(request),
            data={**data, **self.ledger_data(obj)},
        )

    # changeform_view runs these inside its transaction, right after saving.
    def log_addition(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        self._append(request, obj, "added", fields=_changed_fields(message))
        return super().log_addition(request, obj, message)

    def log_change(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        self._append(request, obj, "changed", fields=_changed_fields(message))
        return super().log_change(request, obj, message)

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        with transaction.atomic():
            self._append(request, obj, "deleted")
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            for obj in queryset:
                self._append(request, obj, "deleted")
            super().delete_queryset(request, queryset)


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class StaffUserAdmin(_LedgeredAdmin, UserAdmin, ModelAdmin):  # UserAdmin's fieldsets first
    ledger_kind = "staff_user"
    form = UserChangeForm
    add_form = UserCreationForm
    change_password_form = AdminPasswordChangeForm
    actions = ["reset_mfa"]

    @admin.action(description="Reset two-factor authentication (they set it up again)")
    def reset_mfa(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        if not request.user.is_superuser:
            raise PermissionDenied
        for user in queryset:
            staff_mfa_reset(
                user=user,
                actor=staff_actor(request),
                keep_session_key=request.session.session_key,
            )
        self.message_user(
            request,
            f"Two-factor authentication reset for {queryset.count()} account(s).",
            messages.SUCCESS,
        )

    def ledger_data(self, obj: User) -> dict[str, Any]:
        return {
            "is_active": obj.is_active,
            "is_staff": obj.is_staff,
            "is_superuser": obj.is_superuser,
            "groups": sorted(obj.groups.values_list("name", flat=True)) if obj.pk else [],
        }

    def user_change_password(
        self, request: HttpRequest, id: str, form_url: str = ""
    ) -> HttpResponse:
        with transaction.atomic():  # the new password and its ledger event, together
            response = super().user_change_password(request, id, form_url)
            if request.method == "POST" and isinstance(response, HttpResponseRedirect):
                # Saved (an invalid form renders the page again): their sessions end, but
                # the superuser's own when they set their own password.
                staff_password_reset_record(
                    user=User.objects.get(pk=id),
                    actor=staff_actor(request),
                    keep_session_key=request.session.session_key,
                )
            return response


@admin.register(Group)
class RoleGroupAdmin(_LedgeredAdmin, GroupAdmin, ModelAdmin):
    ledger_kind = "group"

    def ledger_data(self, obj: Group) -> dict[str, Any]:
        if not obj.pk:
            return {}
        return {
            "permissions": sorted(obj.permissions.values_list("codename", flat=True)),
            "members": obj.user_set.count(),
        }
