"""Brokers in the admin: creating and editing go through the broker services (ledger events),
and so does recording which lists the broker selected in DROP's portal."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from unfold.admin import ModelAdmin

from integrations.admin.actors import staff_actor
from integrations.admin.as_shown import fields_as_shown
from integrations.admin.credentials import Credential, WriteOnlyCredentials
from integrations.admin.page_values import page_value
from integrations.admin.refusals import RefusalsShown, Refused
from integrations.drop.notifications import notifications_url
from integrations.list_types import DATA_TYPE_OF, LABELS
from integrations.models import Broker, ListSelection
from integrations.selectors.list_selection import list_selections, selection_in_force
from integrations.services.staff.brokers import (
    BROKER_SETTINGS,
    broker_create,
    broker_drop_webhook_secret_set,
    broker_lists_select,
    broker_update,
    drop_api_key_check,
    drop_base_url_check,
    drop_webhook_secret_check,
)


def recorded_selections(broker: Broker) -> list[ListSelection]:
    """Every selection recorded for the broker, read once for the page that shows it: its form
    reads the lists in force from them, its history shows them all."""
    return page_value(broker, "list_selections", lambda: list(list_selections(broker)))


class BrokerForm(forms.ModelForm):
    drop_base_url = forms.URLField(
        label="DROP base URL",
        required=False,
        assume_scheme="https",
        help_text="Leave empty to use DROP's URL for the mode (or DROP_API_URL).",
    )
    drop_api_key = forms.CharField(
        label="DROP API key",
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Stored encrypted and never shown. Leave empty to keep the current key; a "
        "new DROP base URL or mode clears it unless it is entered again.",
    )
    drop_webhook_secret = forms.CharField(
        label="DROP webhook secret",
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="The signing secret DROP's portal shows under Notification settings. Stored "
        "encrypted and never shown; leave empty to keep the current one.",
    )
    pull_interval_days = forms.IntegerField(
        label="Pull interval (days)",
        required=False,
        min_value=1,
        initial=30,
        help_text="Leave empty for 30. DROP requires a download at least every 45 days.",
    )

    lists_selected = forms.MultipleChoiceField(
        label="Lists selected in DROP's portal",
        required=False,
        choices=list(LABELS.items()),
        widget=forms.CheckboxSelectMultiple,
        help_text="The lists the broker selected in DROP's portal; the evidence pack compares "
        "every cycle's lists with the selection in force at its download.",
    )
    lists_selected_reason = forms.CharField(
        label="Why these lists",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Required when the selection changes: why the broker selected these lists "
        "(the identifiers it holds). Each change is recorded in the ledger.",
    )

    class Meta:
        model = Broker
        fields = [
            "broker_id",
            "name",
            "mode",
            "drop_base_url",
            "drop_api_key",
            "drop_webhook_secret",
            "auto_pull",
            "pull_interval_days",
            "approve_uploads",
            "lists_selected",
            "lists_selected_reason",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = (
            selection_in_force(recorded_selections(self.instance)) if self.instance.pk else None
        )
        self.lists_in_force = list(current.lists) if current else []
        self.fields["lists_selected"].initial = self.lists_in_force
        # Read by save_model's changed_data, and by clean for the lists.
        fields_as_shown(self.fields, [*BROKER_SETTINGS, "lists_selected"])

    def clean_drop_webhook_secret(self) -> str:
        secret = self.cleaned_data.get("drop_webhook_secret") or ""
        if secret:
            drop_webhook_secret_check(secret)  # its ValidationError shows on the field
        return secret

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for check, field in (
            (drop_base_url_check, "drop_base_url"),
            (drop_api_key_check, "drop_api_key"),
        ):
            try:
                check(cleaned.get(field) or "")
            except ValidationError as exc:  # keyed by the field, so it shows there
                self.add_error(None, exc)
        lists = list(cleaned.get("lists_selected") or [])
        reason = (cleaned.get("lists_selected_reason") or "").strip()
        # A new selection to record: lists this person changed to other lists than those in
        # force, or a reason given (the same lists again, with why). Lists left as the page
        # showed them keep a selection recorded since the page was opened.
        cleaned["lists_to_record"] = None
        changed = "lists_selected" in self.changed_data and set(lists) != set(self.lists_in_force)
        if changed or reason:
            if not lists:
                self.add_error("lists_selected", "Select at least one list.")
            elif not reason:
                self.add_error("lists_selected_reason", "Say why the broker selected these lists.")
            else:
                cleaned["lists_to_record"] = lists
        return cleaned

    def clean_pull_interval_days(self) -> int:
        # Empty keeps the current interval (30 for a new broker); the model checks the cadence.
        days = self.cleaned_data.get("pull_interval_days")
        if days is None:
            return self.instance.pull_interval_days if self.instance.pk else 30
        return int(days)


@admin.register(Broker)
class BrokerAdmin(RefusalsShown, WriteOnlyCredentials, ModelAdmin):
    form = BrokerForm
    credentials = [
        Credential("drop_api_key", "DROP API key", "drop_api_key_changed_at"),
        Credential("drop_webhook_secret", "DROP webhook secret", "drop_webhook_secret_changed_at"),
    ]
    list_display = [
        "broker_id",
        "name",
        "mode",
        "has_drop_api_key",
        "auto_pull",
        "pull_interval_days",
        "approve_uploads",
        "last_pulled_at",
        "created_at",
    ]
    list_filter = ["mode", "auto_pull", "approve_uploads"]
    search_fields = ["broker_id", "name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Broker]:
        # Whether a key is set, read in SQL: a list reads no encrypted column
        # (``dropportal.admin._EncryptedColumnsUnread``), so the key itself is not there.
        key_set = ExpressionWrapper(~Q(drop_api_key=""), output_field=BooleanField())
        return super().get_queryset(request).annotate(drop_api_key_set=key_set)

    @admin.display(boolean=True, description="DROP API key", ordering="drop_api_key_set")
    def has_drop_api_key(self, obj: Broker) -> bool:
        return bool(obj.drop_api_key_set)  # type: ignore[attr-defined]  # get_queryset's

    @admin.display(description="DROP webhook URL")
    def drop_notifications_url(self, obj: Broker) -> str:
        return format_html(
            "<code>{}</code><div class='help'>Enter it in DROP's portal, Notification "
            "settings, with the signing secret shown there entered above.</div>",
            notifications_url(obj.broker_id),
        )

    @admin.display(description="Lists selected, as recorded")
    def lists_selection_history(self, obj: Broker) -> str:
        selections = recorded_selections(obj)
        if not selections:
            return "None recorded yet."
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li>from {}: {} &mdash; {} <span class='help'>({})</span></li>",
                (
                    (
                        s.effective_from.isoformat(timespec="minutes"),
                        ", ".join(DATA_TYPE_OF[t] for t in s.lists),
                        s.reason,
                        s.actor,
                    )
                    for s in selections
                ),
            ),
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        own = (
            ["broker_id", "last_pulled_at", "drop_notifications_url", "lists_selection_history"]
            if obj
            else []
        )
        return [*own, *super().get_readonly_fields(request, obj)]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the ledger and DROP's records refer to brokers forever

    def save_model(self, request: HttpRequest, obj: Broker, form: Any, change: bool) -> None:
        try:
            self._save(request, obj, form, change)
        except ValidationError as exc:
            # The form's checks passed, then a rule of the service refused (a broker id
            # registered meanwhile by a second submit): nothing is saved, the page says why.
            messages.error(request, " ".join(exc.messages))
            raise Refused from exc

    def _save(self, request: HttpRequest, obj: Broker, form: Any, change: bool) -> None:
        new_key = form.cleaned_data.get("drop_api_key") or ""
        new_webhook_secret = form.cleaned_data.get("drop_webhook_secret") or ""
        actor = staff_actor(request)
        if not change:
            created = broker_create(
                broker_id=obj.broker_id,
                name=obj.name,
                mode=obj.mode,
                drop_api_key=new_key,
                drop_base_url=obj.drop_base_url,
                auto_pull=obj.auto_pull,
                pull_interval_days=obj.pull_interval_days,
                approve_uploads=obj.approve_uploads,
                actor=actor,
            )
            obj.pk = created.pk
            if new_webhook_secret:
                broker_drop_webhook_secret_set(
                    broker=created, secret=new_webhook_secret, actor=actor
                )
            self._lists_record(created, form, actor)
            return
        current = Broker.objects.get(pk=obj.pk)
        # Only what was changed on the page: a setting left as shown keeps the stored value,
        # which another manager may have changed since the page was opened.
        changes: dict[str, Any] = {
            f: getattr(obj, f) for f in BROKER_SETTINGS if f in form.changed_data
        }
        if new_key:
            changes["drop_api_key"] = new_key
        had_key = bool(current.drop_api_key)
        updated = broker_update(broker=current, actor=actor, **changes)
        if new_webhook_secret:
            broker_drop_webhook_secret_set(broker=updated, secret=new_webhook_secret, actor=actor)
        self._lists_record(updated, form, actor)
        if had_key and not updated.drop_api_key:
            messages.warning(
                request,
                "The DROP API key was cleared: it is never sent to a DROP URL it was not entered "
                "for. Enter it again.",
            )

    @staticmethod
    def _lists_record(broker: Broker, form: Any, actor: str) -> None:
        lists = form.cleaned_data.get("lists_to_record")
        if lists:
            broker_lists_select(
                broker=broker,
                lists=lists,
                reason=form.cleaned_data["lists_selected_reason"],
                actor=actor,
            )
