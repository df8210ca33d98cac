"""Canaries and their rounds in the admin.

Connections managers name a broker's canary (a consumer the broker registered and keeps only
for testing) and remove one; Operators and Auditors see them. Every round, and how each
target answered, is listed read-only. Every change goes through ``services.cycle.canaries``
(ledger events with the staff actor), as ``consumers canary`` does.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html_join
from unfold.admin import ModelAdmin

from integrations.admin.actors import staff_actor
from integrations.admin.page_values import page_value, page_value_set
from integrations.admin.refusals import RefusalsShown, Refused
from integrations.models import Canary, CanaryRound, Consumer
from integrations.selectors.canaries import CanaryRoundResult, canary_round_results
from integrations.services.cycle.canaries import canary_add, canary_remove


class CanaryForm(forms.ModelForm):
    class Meta:
        model = Canary
        fields = ["broker", "remote_identifier"]
        help_texts = {
            "remote_identifier": "The consumer's remote_identifier, as the broker registered "
            "it: a test record the broker keeps in its systems and puts back after each "
            "deletion.",
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        broker, name = cleaned.get("broker"), cleaned.get("remote_identifier")
        registered = Consumer.objects.filter(broker=broker, remote_identifier=name)
        if broker is not None and name and not registered.exists():
            raise ValidationError(
                f"broker {broker.broker_id} has no consumer registered as {name!r}"
            )
        return cleaned


@admin.register(Canary)
class CanaryAdmin(RefusalsShown, ModelAdmin):
    form = CanaryForm
    list_display = ["remote_identifier", "broker", "added_by", "created_at"]
    list_filter = ["broker"]
    search_fields = ["remote_identifier"]
    list_select_related = ["broker"]
    fields = ["broker", "remote_identifier"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # name another one instead

    # The form's checks passed, then the service refused: another submit (a double click,
    # a colleague, ``consumers canary``) named or removed it meanwhile. The page says why.

    def save_model(self, request: HttpRequest, obj: Canary, form: Any, change: bool) -> None:
        try:
            created = canary_add(
                broker=obj.broker,
                remote_identifier=obj.remote_identifier,
                actor=staff_actor(request),
            )
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
            raise Refused from exc
        obj.pk = created.pk

    def delete_model(self, request: HttpRequest, obj: Canary) -> None:
        try:
            self._remove(request, obj)
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
            raise Refused from exc

    # One run's rows at most, as every "Delete selected" (admin/bounded_actions.py).
    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Canary]) -> None:
        for canary in queryset.select_related("broker"):
            try:
                self._remove(request, canary)
            except ValidationError as exc:  # the others are still removed
                messages.error(request, " ".join(exc.messages))

    @staticmethod
    def _remove(request: HttpRequest, canary: Canary) -> None:
        canary_remove(
            broker=canary.broker,
            remote_identifier=canary.remote_identifier,
            actor=staff_actor(request),
        )


@admin.register(CanaryRound)
class CanaryRoundAdmin(ModelAdmin):
    list_display = ["id", "broker", "started_at", "answer_by", "cycle", "result"]
    list_filter = ["broker"]
    list_select_related = ["broker", "cycle"]
    readonly_fields = [
        "broker",
        "cycle",
        "started_at",
        "answer_by",
        "actor",
        "canaries",
        "missing",
        "targets",
        "result",
        "answers",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # `drop canary`, or a cycle's import

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # evidence

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        # The page's rounds judged in one query, not one per row's "result".
        listed = super().get_changelist_instance(request)
        _results_kept(list(listed.result_list))  # the list's rows, read once, kept by it
        return listed

    @admin.display(description="result")
    def result(self, obj: CanaryRound) -> str:
        return _result_of(obj).result

    @admin.display(description="answers per target")
    def answers(self, obj: CanaryRound) -> str:
        result = _result_of(obj)
        return format_html_join(
            "",
            "<div>{}: {} — {} {}</div>",
            (
                (a.target, a.remote_identifier, a.drop_outcome or a.state, a.why)
                for a in result.answers
            ),
        )


_RESULT = "canary_round_result"


def _results_kept(rounds: list[CanaryRound]) -> None:
    """Each round's result, judged now, kept on the round for the page that shows it."""
    for canary_round, result in zip(
        rounds, canary_round_results(rounds=rounds, now=timezone.now()), strict=True
    ):
        page_value_set(canary_round, _RESULT, result)


def _result_of(canary_round: CanaryRound) -> CanaryRoundResult:
    return page_value(
        canary_round,
        _RESULT,
        lambda: canary_round_results(rounds=[canary_round], now=timezone.now())[0],
    )
