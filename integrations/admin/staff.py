"""Staff accounts and their roles in the admin, each change a ledger event.

Django's own user and group admins, plus one ledger event per addition, change or deletion
in the same transaction, with the staff user who made it as the actor (``services.staff.staff``
records them, and deletes). The event names the changed fields and the account's roles
afterwards, never a password or its hash::

    staff_user.added / staff_user.changed / staff_user.deleted   subject: the username
    group.added / group.changed / group.deleted                  subject: the group name

Who may grant a role is itself something an auditor asks about. A superuser may reset a staff
member's two-factor authentication (a lost phone): they enrol again at their next login. A
reset of the factor or of the password ends every session of that member and is its own
ledger event (``staff_user.mfa_reset``, ``staff_user.password_reset``) naming the superuser,
and so is unticking *Active*, as ``manage.py staff deactivate`` (``staff_user.deactivated``);
unticking *Staff status* ends the sessions too, its change the ``staff_user.changed`` event.
Never on their own account (``services.staff.staff_mfa``): its password page sends them to
the one that asks for the old password, and resetting their own factor is refused.
django-otp's own device admins are not offered (``dropportal.apps``): they would show TOTP seeds
and recovery codes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from unfold.admin import ModelAdmin
from unfold.forms import AdminPasswordChangeForm, UserChangeForm, UserCreationForm

from integrations.admin.actors import staff_actor
from integrations.admin.refusals import RefusalsShown, Refused
from integrations.services.staff.staff import (
    Verb,
    role_group_change_record,
    role_groups_delete,
    staff_user_change_record,
    staff_users_delete,
)
from integrations.services.staff.staff_mfa import (
    REFUSED_OWN_CREDENTIAL_RESET,
    staff_mfa_reset,
    staff_password_reset_record,
    staff_sessions_end,
)
from integrations.services.staff.staff_sign_in import staff_user_deactivate


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


class _LedgeredAdmin(RefusalsShown, admin.ModelAdmin):
    """Records a change wherever Django's admin writes its own log entry, and deletes
    through the service that records each deletion."""

    def change_record(self, obj: Any, verb: Verb, actor: str, fields: list[str]) -> None:
        raise NotImplementedError

    def records_delete(self, objs: Iterable[Any], actor: str) -> None:
        raise NotImplementedError

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        try:
            with transaction.atomic():  # a savepoint: the page's transaction stays usable
                super().save_model(request, obj, form, change)
        except IntegrityError as exc:
            # The form found the name free, then another submit (a double click, a colleague)
            # saved it first: the page again, saying so, rather than a 500.
            messages.error(
                request,
                f"Not saved: a {obj._meta.verbose_name} named {obj} already exists (saved "
                "meanwhile, by another submit); nothing was changed.",
            )
            raise Refused from exc

    # changeform_view runs these inside its transaction, right after saving.
    def log_addition(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        self.change_record(obj, "added", staff_actor(request), _changed_fields(message))
        return super().log_addition(request, obj, message)

    def log_change(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        self.change_record(obj, "changed", staff_actor(request), _changed_fields(message))
        return super().log_change(request, obj, message)

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        self.records_delete([obj], staff_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self.records_delete(queryset, staff_actor(request))


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class StaffUserAdmin(_LedgeredAdmin, UserAdmin, ModelAdmin):  # UserAdmin's fieldsets first
    form = UserChangeForm
    add_form = UserCreationForm
    change_password_form = AdminPasswordChangeForm
    actions = ["reset_mfa"]
    # A member may do what their roles may, and a role changes only by a migration: no
    # permission is granted to one account beside its roles.
    fieldsets = tuple(
        (
            name,
            {**options, "fields": tuple(f for f in options["fields"] if f != "user_permissions")},
        )
        for name, options in UserAdmin.fieldsets or ()
    )

    @admin.action(description="Reset two-factor authentication (they set it up again)")
    def reset_mfa(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        if not request.user.is_superuser:
            raise PermissionDenied
        try:
            with transaction.atomic():  # all of them, or none when one is refused
                for user in queryset:
                    staff_mfa_reset(
                        user=user,
                        actor=staff_actor(request),
                        by=request.user,
                        keep_session_key=request.session.session_key,
                    )
        except ValidationError as exc:
            self.message_user(request, f"Nothing reset. {' '.join(exc.messages)}", messages.ERROR)
            return
        self.message_user(
            request,
            f"Two-factor authentication reset for {queryset.count()} account(s).",
            messages.SUCCESS,
        )

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and "is_active" in form.changed_data and not obj.is_active:
            # As `manage.py staff deactivate`: every session ends now, or a reactivation
            # would revive them (a stolen one too), already past the second factor.
            staff_user_deactivate(user=obj, actor=staff_actor(request))
        elif change and "is_staff" in form.changed_data and not obj.is_staff:
            # The same for the staff status, given back later; the change is the ledger's
            # staff_user.changed event.
            staff_sessions_end(obj)

    def change_record(self, obj: User, verb: Verb, actor: str, fields: list[str]) -> None:
        staff_user_change_record(user=obj, verb=verb, actor=actor, fields=fields)

    def records_delete(self, objs: Iterable[User], actor: str) -> None:
        staff_users_delete(users=objs, actor=actor)

    def user_change_password(
        self, request: HttpRequest, id: str, form_url: str = ""
    ) -> HttpResponse:
        if not request.user.is_authenticated:  # the admin's login let nobody else here
            raise PermissionDenied
        target = self.get_object(request, unquote(id))  # as Django finds it: "007" is 7
        if (
            target is not None
            and target.pk == request.user.pk
            and self.has_change_permission(request, target)
        ):
            # No old password asked here: one's own is changed on the page that asks it.
            self.message_user(request, REFUSED_OWN_CREDENTIAL_RESET, messages.INFO)
            return HttpResponseRedirect(reverse(f"{self.admin_site.name}:password_change"))
        with transaction.atomic():  # the new password and its ledger event, together
            response = super().user_change_password(request, id, form_url)
            if request.method == "POST" and isinstance(response, HttpResponseRedirect):
                # Saved (an invalid form renders the page again): their sessions end.
                staff_password_reset_record(
                    user_id=int(id),
                    actor=staff_actor(request),
                    by=request.user,
                    keep_session_key=request.session.session_key,
                )
            return response


@admin.register(Group)
class RoleGroupAdmin(_LedgeredAdmin, GroupAdmin, ModelAdmin):
    def change_record(self, obj: Group, verb: Verb, actor: str, fields: list[str]) -> None:
        role_group_change_record(group=obj, verb=verb, actor=actor, fields=fields)

    def records_delete(self, objs: Iterable[Group], actor: str) -> None:
        role_groups_delete(groups=objs, actor=actor)
