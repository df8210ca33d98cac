"""The login-lockout (django-axes) and job (Procrastinate) tables: for superusers only.

They are the service's machinery, not DROP records: a role granting their permissions by
mistake still shows them to nobody else. Their own admins are kept, on unfold's base, with
every permission narrowed to superusers, their lists' date drill-down bounded as ours are
(``date_drill_down``), a choice filter held to its choices (``KnownChoicesFilter``) and the
lockouts' own action mended (``ExpiredAttemptsCleanedNow``); the sidebar lists them apart
(``dropportal.navigation``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db import transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from unfold.admin import ModelAdmin

from integrations.admin.actors import staff_actor
from integrations.admin.bounded_actions import first_keys
from integrations.admin.date_drill_down import DateDrillDownBounded
from integrations.services.staff.machinery import machinery_change_record

APPS = ("axes", "procrastinate")


class SuperuserOnly:
    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request) and super().has_view_permission(  # type: ignore[misc]
            request, obj
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request) and super().has_change_permission(  # type: ignore[misc]
            request, obj
        )

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return self.has_module_permission(request) and super().has_add_permission(  # type: ignore[misc]
            request, *args
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request) and super().has_delete_permission(  # type: ignore[misc]
            request, obj
        )


class KnownChoicesFilter(admin.ChoicesFieldListFilter):
    """A choices field's filter that applies only the choices it offers: the job table's
    status is a PostgreSQL enum, which takes no other value (a ``DataError``). Any other is
    refused as a filter the list cannot apply."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        offered = {str(value) for value, _ in self.field.flatchoices}
        if any(value not in offered for value in self.lookup_val or ()):
            raise IncorrectLookupParameters(f"{self.field_path} is one of {sorted(offered)}")
        return super().queryset(request, queryset)


class ExpiredAttemptsCleanedNow:
    """django-axes 8.3.1's "Clean up expired attempts" reads the time of the sign-in being
    handled, which axes sets only on a sign-in's request: from the list it always failed
    (``AttributeError``, its issue #1424, fixed after 8.3.1). Kept, with the action's own time:
    it is how a superuser clears every expired lockout at once. Once axes sets the time
    itself, this sets nothing."""

    @admin.action(description="Clean up expired attempts")
    def cleanup_expired_attempts(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        if not hasattr(request, "axes_attempt_time"):
            request.axes_attempt_time = timezone.now()  # type: ignore[attr-defined]
        super().cleanup_expired_attempts(request, queryset)  # type: ignore[misc]


class LedgeredMachinery:
    """Each change a superuser makes here is a ``machinery.changed`` ledger event naming them,
    as every change in the admin is: a lockout lifted, a job retried or cancelled. Deletions
    are recorded where they happen (the confirmed page or action), other actions once run."""

    model: type[Model]

    def _record(self, request: HttpRequest, action: str, ids: list[Any]) -> None:
        machinery_change_record(
            model=self.model._meta.label, action=action, ids=ids, actor=staff_actor(request)
        )

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        pk = obj.pk  # before the deletion clears it
        with transaction.atomic():
            super().delete_model(request, obj)  # type: ignore[misc]
            self._record(request, "delete", [pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            ids = list(queryset.values_list("pk", flat=True))
            super().delete_queryset(request, queryset)  # type: ignore[misc]
            self._record(request, "delete", ids)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)  # type: ignore[misc]
        return {
            name: (
                (func if name == "delete_selected" else self._recorded(func, name)),
                name,
                description,
            )
            for name, (func, _, description) in actions.items()
        }

    def _recorded(self, func: Any, name: str) -> Any:
        # The rows the action changed or removed, not those selected: a retry leaves a job
        # that did not fail as it is, and axes' clean-up removes every expired attempt
        # whatever the selection. An action on the selection takes one run of it (a job
        # retried or cancelled is a statement each), read once to compare.
        def run(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
            manager = self.model._default_manager
            if name in _ACTS_ON_EVERY_ROW:
                batch, chosen = None, queryset
                before = _rows(manager.all())
            else:
                batch = first_keys(queryset)
                chosen = batch.chosen
                before = _rows(chosen)
            answer = func(modeladmin, request, chosen)
            if answer is None:  # done (a page asking for more would be an answer)
                after = _rows(manager.filter(pk__in=list(before)))
                changed = [pk for pk, row in before.items() if after.get(pk) != row]
                if changed:
                    self._record(request, name, changed)
                if batch is not None:
                    batch.tell(request)
            return answer

        return run


# Actions of the machinery's own admins that act on the table, not on the selection.
_ACTS_ON_EVERY_ROW = frozenset({"cleanup_expired_attempts"})


def _rows(queryset: QuerySet[Any]) -> dict[Any, tuple[Any, ...]]:
    """Each row's stored values, by primary key: compared before and after an action."""
    names = [field.attname for field in queryset.model._meta.concrete_fields]
    return {row[0]: row[1:] for row in queryset.values_list("pk", *names)}


def _choices_held(model: type[Model], entry: Any) -> Any:
    """A list filter named by a field with choices, as a ``KnownChoicesFilter``."""
    if isinstance(entry, str) and "__" not in entry:
        field = model._meta.get_field(entry)
        if getattr(field, "choices", None):
            return (entry, KnownChoicesFilter)
    return entry


def narrow_to_superusers(site: admin.AdminSite) -> None:
    """Called once every app registered its admins (``dropportal.apps``)."""
    for model, model_admin in list(site._registry.items()):
        if model._meta.app_label not in APPS or isinstance(model_admin, SuperuserOnly):
            continue
        mended = (ExpiredAttemptsCleanedNow,) if model._meta.label == "axes.AccessAttempt" else ()
        narrowed = type(
            type(model_admin).__name__,
            (
                SuperuserOnly,
                LedgeredMachinery,
                DateDrillDownBounded,
                *mended,
                type(model_admin),
                ModelAdmin,
            ),
            {
                "__module__": __name__,
                "list_filter": [_choices_held(model, entry) for entry in model_admin.list_filter],
            },
        )
        site.unregister(model)
        site.register(model, narrowed)
