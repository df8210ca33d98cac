"""DROP access in the admin: the connection's outages (read-only) and the obligations a long
one creates, where staff record the written notice to CalPrivacy (the same service as
``drop notice``, one ledger event)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Model
from django.http import HttpRequest
from unfold.admin import ModelAdmin

from integrations.admin.actors import staff_actor
from integrations.admin.refusals import RefusalsShown, Refused
from integrations.drop.calendar import drop_date, drop_today
from integrations.models import DropAccessObligation, DropOutage
from integrations.services.cycle.drop_access import drop_access_notice_record


@admin.register(DropOutage)
class DropOutageAdmin(ModelAdmin):
    """Each outage of the automated DROP connection not of the broker's doing."""

    list_display = ["broker", "started_at", "last_failure_at", "ended_at", "failures"]
    list_filter = ["broker"]
    list_select_related = ["broker"]
    fields = readonly_fields = (
        "broker",
        "started_at",
        "last_failure_at",
        "ended_at",
        "failures",
        "last_error",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _already_recorded(obligation: DropAccessObligation) -> str:
    return (
        f"the notice is already recorded (sent on {obligation.notice_sent_on}, reference "
        f"{obligation.notice_reference!r}, by {obligation.notice_recorded_by}); "
        "nothing was changed"
    )


class NoticeForm(forms.ModelForm):
    class Meta:
        model = DropAccessObligation
        fields = ["notice_sent_on", "notice_reference"]
        labels = {
            "notice_sent_on": "notice sent on",
            "notice_reference": "notice reference",
        }
        help_texts = {
            "notice_sent_on": "the day the written notice went to CalPrivacy (DROP's calendar)",
            "notice_reference": "what identifies it: DROP's message number, a letter's reference",
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.notice_sent_on is not None:
            # A second submit, or ``drop notice`` recorded it since the page was opened: the
            # notice fields are read-only now, so the message goes above them.
            raise ValidationError(_already_recorded(self.instance))
        sent_on: dt.date | None = cleaned.get("notice_sent_on")
        reference = (cleaned.get("notice_reference") or "").strip()
        if sent_on is None:
            raise ValidationError({"notice_sent_on": "the day the notice was sent is required"})
        if not reference:
            raise ValidationError({"notice_reference": "the notice's reference is required"})
        if sent_on > drop_today():
            raise ValidationError({"notice_sent_on": "a future day"})
        if sent_on < drop_date(self.instance.failure_started_at):
            raise ValidationError({"notice_sent_on": "before the failure it reports"})
        return cleaned


@admin.register(DropAccessObligation)
class DropAccessObligationAdmin(RefusalsShown, ModelAdmin):
    """A DROP outage of more than a day: the download by hand and the written notice owed,
    due 45 days after the failure; staff record the notice on its page."""

    form = NoticeForm
    list_display = [
        "broker",
        "failure_started_at",
        "due_date",
        "days_left",
        "notice_sent_on",
        "notice_reference",
    ]
    list_filter = ["broker", ("notice_sent_on", admin.EmptyFieldListFilter)]
    list_select_related = ["broker"]
    _facts = (
        "broker",
        "failure_started_at",
        "due_date",
        "days_left",
        "outage_end",
        "created_at",
    )
    _recorded = ("notice_recorded_by", "notice_recorded_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*self._facts, "notice_sent_on", "notice_reference", *self._recorded]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is not None and obj.notice_sent_on is not None:  # recorded: kept as it is
            return [*self._facts, "notice_sent_on", "notice_reference", *self._recorded]
        return [*self._facts, *self._recorded]

    @admin.display(description="days left")
    def days_left(self, obj: DropAccessObligation) -> str:
        if obj.notice_sent_on is not None:
            return "notice recorded"
        return str((obj.due_date - drop_today()).days)

    @admin.display(description="outage ended")
    def outage_end(self, obj: DropAccessObligation) -> Any:
        return obj.outage.ended_at or "not yet: DROP still fails"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # only a long outage creates one

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        assert isinstance(obj, DropAccessObligation)
        try:
            drop_access_notice_record(
                broker=obj.broker,
                sent_on=form.cleaned_data["notice_sent_on"],
                reference=form.cleaned_data["notice_reference"],
                actor=staff_actor(request),
                obligations=[obj.pk],
            )
        except ValidationError as exc:
            # The form's checks passed, then another submit (a double click, a colleague,
            # ``drop notice``) recorded the notice before this one took the row: the service
            # refused, and the page says why instead of failing.
            current = DropAccessObligation.objects.get(pk=obj.pk)
            recorded = current.notice_sent_on is not None
            messages.error(
                request, _already_recorded(current) if recorded else " ".join(exc.messages)
            )
            raise Refused from exc
