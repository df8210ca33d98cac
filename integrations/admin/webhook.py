"""Webhook integrations in the admin (signed POSTs to a URL of the broker): their own pages,
``/admin/integrations/webhookintegration/``. Every change goes through
``services.staff.integrations``.

- Add one (the list's "Add webhook integration"): its Webhook Secret is shown once, right
  after, with the callback URLs the broker is given.
- Edit its name and URL; "Send test notification" (the broker's answer is shown on the page)
  and "Regenerate secret" on its page.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern
from django.utils.html import format_html

from integrations.admin.actors import staff_actor
from integrations.admin.integrations import (
    Created,
    IntegrationAdmin,
    ObjectButton,
    TargetUrlMixin,
)
from integrations.admin.shown_once import SecretShownOnce
from integrations.dispatch import webhook
from integrations.models import Integration, WebhookIntegration
from integrations.services.staff.integrations import (
    integration_test_send,
    integration_update,
    webhook_integration_create,
)
from integrations.url_extras import without_url_extras


class WebhookIntegrationAddForm(TargetUrlMixin, forms.ModelForm):
    url = forms.URLField(
        label="URL",
        assume_scheme="https",
        max_length=500,
        help_text="Where dispatches are POSTed (https).",
    )

    class Meta:
        model = WebhookIntegration
        fields = ["broker", "name", "url"]


class WebhookIntegrationChangeForm(TargetUrlMixin, forms.ModelForm):
    url = forms.URLField(label="URL", assume_scheme="https", max_length=500)

    class Meta:
        model = WebhookIntegration
        fields = ["name", "url", "enabled"]


@admin.register(WebhookIntegration)
class WebhookIntegrationAdmin(IntegrationAdmin):
    kind_label = "Webhook"
    edited_fields = ("name", "url")
    add_form = WebhookIntegrationAddForm
    form = WebhookIntegrationChangeForm
    add_fieldsets = [(None, {"fields": ["broker", "name", "url"]})]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "uuid",
                    "broker",
                    "kind",
                    "name",
                    "url",
                    "enabled",
                    "disabled_reason",
                    "retired_at",
                    "retired_reason",
                    "callback_urls",
                    "previous_secret_expires_at",
                    "waiting",
                    "created_at",
                ]
            },
        )
    ]
    readonly_fields = [
        "uuid",
        "broker",
        "kind",
        "disabled_reason",
        "retired_at",
        "retired_reason",
        "callback_urls",
        "previous_secret_expires_at",
        "waiting",
        "created_at",
    ]

    @admin.display(description="Callback URLs given to the broker")
    def callback_urls(self, obj: Integration) -> str:
        return format_html(
            "{}<br>{}", webhook.deletion_callback_url(), webhook.resolution_callback_url()
        )

    # -- its services ------------------------------------------------------------------------

    def create(self, request: HttpRequest, data: dict[str, Any], actor: str) -> Created:
        created = webhook_integration_create(
            broker=data["broker"], name=data["name"], url=data["url"], actor=actor
        )
        return Created(created.integration, created.webhook_secret)

    def update(self, integration: Integration, data: dict[str, Any], actor: str) -> None:
        integration_update(
            integration=integration, actor=actor, name=data.get("name"), url=data.get("url")
        )

    def secret_shown_once(
        self, integration: Integration, secret: str, title: str
    ) -> SecretShownOnce:
        return SecretShownOnce(
            title=title,
            label="Webhook Secret",
            secret=secret,
            facts=[
                ("Integration", f"{integration.name} ({integration.broker.broker_id})"),
                ("integration_id", str(integration.uuid)),
                ("Dispatches go to", integration.url),
                ("Deletion callbacks (PUT)", webhook.deletion_callback_url()),
                ("Resolution callbacks (PUT)", webhook.resolution_callback_url()),
            ],
            explanation=(
                "The broker's systems verify every dispatch with it and sign every callback "
                "with it (HMAC-SHA256 over '<timestamp>:<body>'). Callbacks also need an API "
                "key with the webhook_callback scope."
            ),
            guide_section="webhook-secret",
            guide_title="Webhook Secret",
            done_url=self.admin_url("change", integration.pk),
            done_label=integration.name,
        )

    # -- "Send test notification" ------------------------------------------------------------

    def object_buttons(self, obj: Integration) -> list[ObjectButton]:
        own = ObjectButton("Send test notification", self.admin_url("test_notification", obj.pk))
        return [own, *super().object_buttons(obj)]

    def object_views(self) -> list[URLPattern]:
        own = self.object_view("test-notification", "test_notification", self.test_notification)
        return [*super().object_views(), own]

    def test_notification(self, request: HttpRequest, pk: int) -> HttpResponse:
        integration = self.posted_integration(request, pk)
        try:
            result = integration_test_send(integration=integration, actor=staff_actor(request))
        except ValidationError as exc:
            messages.error(request, f"No test notification sent: {' '.join(exc.messages)}.")
            return HttpResponseRedirect(self.admin_url("change", pk))
        # A message may travel in a cookie (signed, not encrypted): the URL without the
        # token its query may hold, the answer as an attempt keeps it (the token redacted).
        answer = result.response_body[:500] or "(empty body)"
        where = without_url_extras(result.url, value=True)
        if result.status is not None and 200 <= result.status < 300 and not result.error:
            messages.success(
                request,
                f"Test notification to {where}: HTTP {result.status} in "
                f"{result.duration_ms} ms. The broker answered: {answer}",
            )
        else:
            got = f"HTTP {result.status}" if result.status is not None else "no answer"
            error = without_url_extras(result.error or "")
            messages.error(
                request,
                f"Test notification to {where} failed: {got}"
                f"{f' ({error})' if error else ''} after {result.duration_ms} ms."
                + (f" The broker answered: {answer}" if result.status is not None else ""),
            )
        return HttpResponseRedirect(self.admin_url("change", pk))
