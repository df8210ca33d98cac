"""ISI integrations in the admin (the broker's own REST API): their own pages,
``/admin/integrations/isiintegration/``. Every change goes through ``services.staff.isi``.

- Add one from the integration list's "Add ISI integration": base URL and a
  static token or OAuth client credentials. Its connections are listed at once, and its
  Webhook Secret (which signs the broker's completion callbacks) is shown once.
- On its change page, the connections inline says which take part in DROP and why the others
  do not; "Check connection" lists them again and shows the broker's answer.
- Secrets (token, client secret) are write-only: left empty, the current one is kept, unless
  the base URL or token URL it goes to changed (then it must be entered again).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern
from unfold.admin import TabularInline

from integrations.admin.actors import staff_actor
from integrations.admin.as_shown import fields_as_shown
from integrations.admin.credentials import Credential
from integrations.admin.display import uuid_short
from integrations.admin.integrations import Created, IntegrationAdmin, ObjectButton
from integrations.admin.shown_once import SecretShownOnce
from integrations.dispatch import isi
from integrations.models import Integration, IsiAuth, IsiConnection, IsiIntegration
from integrations.services.cycle.isi_connections import isi_connections_refresh
from integrations.services.staff.isi import (
    isi_credentials_validate,
    isi_integration_create,
    isi_integration_update,
)
from integrations.validators import base_url_validate

_WRITE_ONLY_HELP = "Stored encrypted and never shown again; leave empty to keep the current one."


@admin.display(description="Completion callbacks (PUT or POST)")
def isi_callback_url(obj: Integration) -> str:
    """Where the broker sends completions: ``callback_path`` on our public URL."""
    public = urlsplit(settings.DROPPORTAL_PUBLIC_URL)
    return f"{public.scheme}://{public.netloc}{isi.callback_path()}"


class _IsiFields(forms.ModelForm):
    """Base URL and authentication, checked by the service's own rules."""

    base_url = forms.URLField(
        label="Base URL",
        assume_scheme="https",
        max_length=500,
        help_text=(
            "The broker's API, e.g. https://api.broker.example or https://broker.example/isi"
            " (https, TLS 1.2 or later; no query or fragment)."
        ),
    )
    auth = forms.ChoiceField(
        label="Authentication", choices=IsiAuth.choices, widget=forms.RadioSelect
    )
    token = forms.CharField(
        label="Static bearer token",
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=_WRITE_ONLY_HELP,
    )
    token_url = forms.URLField(label="Token URL", assume_scheme="https", required=False)
    client_id = forms.CharField(label="Client id", required=False, max_length=200)
    client_secret = forms.CharField(
        label="Client secret",
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=_WRITE_ONLY_HELP,
    )

    def clean_base_url(self) -> str:
        try:
            return base_url_validate(self.cleaned_data["base_url"], field="base_url")
        except ValidationError as exc:
            raise forms.ValidationError(exc.message_dict["base_url"]) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        auth = data.get("auth")
        current = self.instance if self.instance.pk else None
        # A stored secret is kept only while it goes where it went (services.staff.isi's rule).
        keep = (
            current is not None
            and current.auth == auth
            and (data.get("base_url") or "").rstrip("/") == current.base_url
            and (auth != IsiAuth.OAUTH or (data.get("token_url") or "") == current.token_url)
        )
        values = {
            "token": data.get("token") or (current.token if keep and current else ""),
            "token_url": data.get("token_url") or "",
            "client_id": data.get("client_id") or "",
            "client_secret": data.get("client_secret")
            or (current.client_secret if keep and current else ""),
        }
        moved_from = current is not None and current.auth == auth and not keep
        if moved_from and not data.get("token" if auth == IsiAuth.TOKEN else "client_secret"):
            field = "token" if auth == IsiAuth.TOKEN else "client_secret"
            self.add_error(field, "The URL it is sent to changed: enter it again.")
            return data
        if auth == IsiAuth.TOKEN:
            values.update(token_url="", client_id="", client_secret="")
        elif auth == IsiAuth.OAUTH:
            values["token"] = ""
        try:
            isi_credentials_validate(**values)
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, errors)
        return data


class IsiIntegrationAddForm(_IsiFields):
    class Meta:
        model = IsiIntegration
        fields = ["broker", "name"]


class IsiIntegrationChangeForm(_IsiFields):
    class Meta:
        model = IsiIntegration
        fields = ["name", "enabled"]

    # Shown from the row and posted back as shown (admin.as_shown): one left as it was takes
    # the stored value, so a colleague's change made since the page opened stands.
    AS_SHOWN = ("base_url", "auth", "token_url", "client_id")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self.AS_SHOWN:
            self.fields[name].initial = getattr(self.instance, name)
        fields_as_shown(self.fields, self.AS_SHOWN)

    def clean(self) -> dict[str, Any]:
        for name in self.AS_SHOWN:
            if name in self.cleaned_data and name not in self.changed_data:
                self.cleaned_data[name] = getattr(self.instance, name)
        return super().clean()


class IsiConnectionInline(TabularInline):
    """The connections the broker listed, and which of them take part in DROP."""

    model = IsiConnection
    extra = 0
    can_delete = False
    ordering = ["-listed", "uuid"]
    fields = ("uuid", "capabilities_list", "listed", "takes_part", "not_taking_part_because")
    readonly_preprocess_fields = {"uuid": uuid_short}  # 8 characters, a copy button
    readonly_fields = fields
    verbose_name = "connection"
    verbose_name_plural = "Connections (listed by the broker's /api/v1/connections/list)"

    @admin.display(description="Capabilities")
    def capabilities_list(self, obj: IsiConnection) -> str:
        return ", ".join(obj.capabilities)

    @admin.display(description="Takes part in DROP", boolean=True)
    def takes_part(self, obj: IsiConnection) -> bool:
        return obj.takes_part_in_drop

    @admin.display(description="Why not")
    def not_taking_part_because(self, obj: IsiConnection) -> str:
        return obj.drop_exclusion

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the broker's list is the source: "Check connection" reads it again

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _credentials(data: dict[str, Any]) -> dict[str, str]:
    """The form's fields of the chosen way to authenticate only."""
    if data["auth"] == IsiAuth.TOKEN:
        return {"token": data.get("token") or ""}
    return {name: data.get(name) or "" for name in ("token_url", "client_id", "client_secret")}


@admin.register(IsiIntegration)
class IsiIntegrationAdmin(IntegrationAdmin):
    kind_label = "ISI"
    edited_fields = ("name", "base_url")
    add_form = IsiIntegrationAddForm
    form = IsiIntegrationChangeForm
    credentials = [
        Credential("token", "Static bearer token", "credentials_changed_at"),
        Credential("client_secret", "Client secret", "credentials_changed_at"),
    ]
    add_fieldsets = [
        (
            None,
            {
                "fields": [
                    "broker",
                    "name",
                    "base_url",
                    "auth",
                    "token",
                    "token_url",
                    "client_id",
                    "client_secret",
                ]
            },
        )
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "uuid",
                    "broker",
                    "kind",
                    "name",
                    "base_url",
                    "auth",
                    "token",
                    "token_url",
                    "client_id",
                    "client_secret",
                    "enabled",
                    "disabled_reason",
                    "retired_at",
                    "retired_reason",
                    isi_callback_url,
                    "connections_refreshed_at",
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
        isi_callback_url,
        "connections_refreshed_at",
        "previous_secret_expires_at",
        "waiting",
        "created_at",
    ]
    inlines = [IsiConnectionInline]

    # -- its services ------------------------------------------------------------------------

    def create(self, request: HttpRequest, data: dict[str, Any], actor: str) -> Created:
        created = isi_integration_create(
            broker=data["broker"],
            name=data["name"],
            base_url=data["base_url"],
            actor=actor,
            **_credentials(data),
        )
        if created.connections_error:
            messages.warning(
                request,
                f"Created, but its connections could not be listed: "
                f"{created.connections_error}. Once fixed, use 'Check connection' on its page.",
            )
        return Created(created.integration, created.webhook_secret)

    def update(self, integration: Integration, data: dict[str, Any], actor: str) -> None:
        isi_integration_update(
            integration=integration,
            actor=actor,
            name=data.get("name"),
            base_url=data.get("base_url"),
            auth=data["auth"],
            **_credentials(data),
        )

    def secret_shown_once(
        self, integration: Integration, secret: str, title: str
    ) -> SecretShownOnce:
        connections = list(integration.connections.all())
        taking_part = sum(1 for c in connections if c.takes_part_in_drop)
        return SecretShownOnce(
            title=title,
            label="Webhook Secret",
            secret=secret,
            facts=[
                ("Integration", f"{integration.name} ({integration.broker.broker_id})"),
                ("integration_id", str(integration.uuid)),
                ("Broker's API", integration.base_url),
                ("Connections taking part in DROP", f"{taking_part} of {len(connections)}"),
                ("Completion callbacks (PUT or POST)", isi_callback_url(integration)),
            ],
            explanation=(
                "The broker's systems sign every completion callback with it (HMAC-SHA256 over "
                "'<timestamp>:<body>'), and send an API key with the webhook_callback scope."
            ),
            guide_section="isi-your-rest-api",
            guide_title="ISI: your REST API",
            done_url=self.admin_url("change", integration.pk),
            done_label=integration.name,
        )

    # -- "Check connection" ------------------------------------------------------------------

    def object_buttons(self, obj: Integration) -> list[ObjectButton]:
        own = ObjectButton("Check connection", self.admin_url("check_connection", obj.pk))
        return [own, *super().object_buttons(obj)]

    def object_views(self) -> list[URLPattern]:
        own = self.object_view("check-connection", "check_connection", self.check_connection)
        return [*super().object_views(), own]

    def check_connection(self, request: HttpRequest, pk: int) -> HttpResponse:
        """List the connections again and tell staff what the broker answered."""
        integration = self.posted_integration(request, pk)
        try:
            refreshed = isi_connections_refresh(integration=integration, actor=staff_actor(request))
        except isi.IsiError as exc:
            answer = f" The broker answered: {exc.answer[:500]}" if exc.answer else ""
            messages.error(request, f"Check connection failed: {exc}.{answer}")
            return HttpResponseRedirect(self.admin_url("change", pk))
        taking_part = len(refreshed.taking_part)
        listed = sum(1 for c in refreshed.connections if c.listed)
        messages.success(
            request,
            f"Check connection: {refreshed.method} {integration.base_url}{isi.CONNECTIONS_PATH} "
            f"answered HTTP {refreshed.status}: {listed} connection(s) listed, {taking_part} "
            f"take part in DROP. The broker answered: {refreshed.answer[:500] or '(empty body)'}",
        )
        if refreshed.pending_requests_queued:
            messages.info(
                request,
                f"{refreshed.pending_requests_queued} request(s) that waited for a target queued.",
            )
        return HttpResponseRedirect(self.admin_url("change", pk))
