"""Integrations and SaaS connections in the admin: every change goes through their services.

Each kind of integration has its own pages: a proxy model (``models.WebhookIntegration``,
``models.IsiIntegration``) and its ModelAdmin, a subclass of ``IntegrationAdmin`` here, in
its own module (``admin/webhook.py``, ``admin/isi.py``) with its forms, fieldsets, inlines,
buttons and the services it calls. What every kind shares is here:

- The list of every integration (``/admin/integrations/integration/``), its "Add" button per
  kind; an integration's page there, and the add page with ``?kind=``, are its kind's own
  (``IntegrationListAdmin`` hands them to the kind's ModelAdmin).
- Edit its name and settings; untick "enabled" to disable (queued deliveries wait), tick it
  to enable (they are queued again). A 410 from the broker disables it by itself: the list
  shows why. A disabled integration or SaaS connection is paused, still a deletion target.
- "Retire for good" (an action with a written reason) ends an integration or SaaS connection:
  its open requests are cancelled and it can never be enabled again.
- On the change page, "Regenerate secret": the new Webhook Secret is shown once; the old one
  keeps verifying callbacks for 24 hours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from unfold.admin import ModelAdmin

from integrations.admin.action_pages import action_form_page
from integrations.admin.actors import staff_actor
from integrations.admin.as_shown import fields_as_shown
from integrations.admin.bounded_actions import first_rows, taken
from integrations.admin.credentials import Credential, WriteOnlyCredentials
from integrations.admin.display import uuid_short
from integrations.admin.refusals import RefusalsShown, Refused
from integrations.admin.shown_once import SecretShownOnce, show_once
from integrations.drop.calendar import drop_time_text
from integrations.models import Integration, IntegrationKind, RequestState, SaasConnection
from integrations.selectors.search_terms import named_search_token
from integrations.services.staff.integrations import (
    integration_disable,
    integration_enable,
    integration_retire,
    integration_secret_rotate,
    secret_rotation_state,
)
from integrations.services.staff.saas import (
    categories_validate,
    saas_connection_create,
    saas_connection_disable,
    saas_connection_enable,
    saas_connection_retire,
    saas_connection_update,
)
from integrations.url_extras import without_url_extras
from integrations.validators import target_url_validate

# The list's add page without ``?kind=`` opens this kind's.
DEFAULT_KIND = IntegrationKind.WEBHOOK


class TargetUrlMixin:
    """The URL checked by the services' own rule (https, unless private targets are allowed)."""

    cleaned_data: dict[str, Any]

    def clean_url(self) -> str:
        url = self.cleaned_data.get("url") or ""
        try:
            return target_url_validate(url)
        except ValidationError as exc:
            raise forms.ValidationError(exc.message_dict["url"]) from None


class RetireForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=500,
        help_text="Why it is retired; kept with it, with each cancelled request and in the ledger.",
    )


def _retire_reason(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Any], action: str
) -> str | TemplateResponse:
    """The reason staff wrote, or the intermediate page that asks for it."""
    form = RetireForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        return str(form.cleaned_data["reason"])
    return action_form_page(
        modeladmin,
        request,
        queryset,
        action=action,
        title=f"Retire {modeladmin.model._meta.verbose_name_plural} for good",
        form=form,
        template="admin/integrations/retire.html",
        targets=taken(queryset)[:200],
    )


def _retired(modeladmin: admin.ModelAdmin, request: HttpRequest, done: int) -> None:
    if done:
        modeladmin.message_user(
            request,
            f"Retired {done} for good: their open requests are cancelled, their work items "
            "settled on their other requests (or waiting for a target).",
        )


def _validation_text(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{k}: {' '.join(v)}" for k, v in error.message_dict.items())
    return " ".join(error.messages)


@dataclass(frozen=True)
class Created:
    """An integration just created, and its Webhook Secret (shown once)."""

    integration: Integration
    webhook_secret: str


@dataclass(frozen=True)
class ObjectButton:
    """A button on an integration's change page: a POST to one of its admin's own views."""

    label: str
    url: str
    confirm: str = ""  # asked in the browser before it posts


class IntegrationAdmin(RefusalsShown, WriteOnlyCredentials, ModelAdmin):
    """What every kind's pages share: the list, the actions, the change page's state and
    buttons, and the save that goes through the kind's services.

    A kind's ModelAdmin (registered for its proxy model) sets ``form`` and ``add_form``,
    ``fieldsets`` and ``add_fieldsets``, ``readonly_fields``, ``inlines`` and ``credentials``,
    and says which services it calls: ``create``, ``update`` and ``secret_shown_once``
    (``object_buttons`` and ``object_views`` for buttons of its own).
    """

    kind_label = ""  # "Webhook", "ISI": the shown-once page's title
    # What its change page edits: ``update`` gets only those the person changed.
    edited_fields: Sequence[str] = ("name",)
    add_form: type[forms.ModelForm] = forms.ModelForm
    add_fieldsets: Sequence[Any] = ()
    list_display = ["name", "broker", "target", "enabled", "state", "created_at"]
    readonly_preprocess_fields = {"uuid": uuid_short}  # 8 characters, a copy button
    list_filter = ["enabled", "broker"]
    # Not by URL: a search on its query would read a token out of it.
    search_fields = ["name", "base_url"]
    # Searched by names of ours (the broker's targets), every kind's list alike: a name
    # travels in the list's address, a clear email or phone only as its hash.
    search_term_for_url = staticmethod(named_search_token)
    url_fields = ["url"]
    list_select_related = ["broker"]
    actions = ["disable_integrations", "retire_integrations"]
    change_form_template = "admin/integrations/integration/change_form.html"

    # -- the kind's services -----------------------------------------------------------------

    def create(self, request: HttpRequest, data: dict[str, Any], actor: str) -> Created:
        """Create one of its kind from the add form's data; may queue a message for staff."""
        raise NotImplementedError

    def update(self, integration: Integration, data: dict[str, Any], actor: str) -> None:
        """One edit, one ``integration.updated`` event: the name with the kind's settings;
        ``data`` holds those of ``edited_fields`` the person changed only."""
        raise NotImplementedError

    def secret_shown_once(
        self, integration: Integration, secret: str, title: str
    ) -> SecretShownOnce:
        raise NotImplementedError

    # -- columns and read-only fields --------------------------------------------------------

    @admin.display(description="URL")
    def target(self, obj: Integration) -> str:
        return without_url_extras(obj.url or obj.base_url)

    @admin.display(description="state")
    def state(self, obj: Integration) -> str:
        """One column for why it is not sending (a list must fit 1280 pixels)."""
        if obj.retired_at is not None:
            return f"retired: {obj.retired_reason}"
        return "" if obj.enabled else f"paused: {obj.disabled_reason}"

    @admin.display(description="Deliveries waiting")
    def waiting(self, obj: Integration) -> str:
        queued = obj.deletion_requests.filter(state=RequestState.QUEUED).count()
        undeliverable = obj.deletion_requests.filter(state=RequestState.UNDELIVERABLE).count()
        return f"{queued} queued, {undeliverable} undeliverable deletion requests"

    # -- the add and change pages ------------------------------------------------------------

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        kwargs["form"] = self.form if obj is not None else self.add_form
        form = super().get_form(request, obj, change=change, **kwargs)
        # Read by save_model's changed_data.
        fields_as_shown(form.base_fields, ["enabled", *self.edited_fields])
        return form

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return self.add_fieldsets
        return super().get_fieldsets(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []  # the add form: every field it shows is entered
        return super().get_readonly_fields(request, obj)

    def get_inlines(self, request: HttpRequest, obj: Any) -> list[Any]:
        return list(self.inlines) if obj is not None else []

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # requests and the ledger refer to it for good: disable it instead

    def has_module_permission(self, request: HttpRequest) -> bool:
        # A kind's pages are reached from the list of every integration: not in the app index
        # or the sidebar of their own.
        return not self.opts.proxy and super().has_module_permission(request)

    def admin_url(self, name: str, *args: Any) -> str:
        """The URL of one of its pages (``change``, ``add``, a button's view) on its site."""
        opts = self.opts
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_{name}", args=args
        )

    def save_model(self, request: HttpRequest, obj: Integration, form: Any, change: bool) -> None:
        actor = staff_actor(request)
        data = form.cleaned_data
        try:
            if not change:
                created = self.create(request, data, actor)
                obj.pk, obj.uuid = created.integration.pk, created.integration.uuid
                obj.created_secret = created.webhook_secret  # type: ignore[attr-defined]
                return
            current = self.model._default_manager.get(pk=obj.pk)
            # Only what the person changed (admin.as_shown): a field left as the page showed
            # it must not undo a change made meanwhile (a new URL, a disable).
            edits = {
                name: value
                for name, value in data.items()
                if name not in self.edited_fields or name in form.changed_data
            }
            self.update(current, edits, actor)
            toggled = "enabled" in form.changed_data
            if toggled and data["enabled"] and not current.enabled:
                queued = integration_enable(integration=current, actor=actor)
                messages.info(request, f"Enabled; {queued} waiting request(s) queued.")
            elif toggled and not data["enabled"] and current.enabled:
                integration_disable(integration=current, reason="disabled by staff", actor=actor)
        except ValidationError as exc:
            # Form validation ran already; this is a rule of the service (https only, ...).
            messages.error(request, _validation_text(exc))
            raise Refused from exc

    def response_add(
        self, request: HttpRequest, obj: Integration, post_url_continue: str | None = None
    ) -> HttpResponse:
        secret = getattr(obj, "created_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        created = self.model._default_manager.select_related("broker").get(pk=obj.pk)
        return show_once(
            request,
            self.secret_shown_once(created, secret, f"{self.kind_label} integration created"),
        )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        context["object_buttons"] = self.object_buttons(obj) if obj is not None else []
        return super().render_change_form(request, context, add, change, form_url, obj)

    # -- actions -----------------------------------------------------------------------------

    @admin.action(description="Disable selected integrations", permissions=["change"])
    def disable_integrations(self, request: HttpRequest, queryset: QuerySet[Integration]) -> None:
        done = 0
        # Those disabled already are not counted: the page says of how many enabled ones.
        batch = first_rows(queryset.filter(enabled=True), of="enabled in the selection")
        for integration in batch.rows:
            integration_disable(
                integration=integration, reason="disabled by staff", actor=staff_actor(request)
            )
            done += 1
        self.message_user(request, f"Disabled {done} integration(s); their deliveries wait.")
        batch.tell(request)

    @admin.action(description="Retire selected integrations for good (with a reason)",
                  permissions=["change"])  # fmt: skip
    def retire_integrations(
        self, request: HttpRequest, queryset: QuerySet[Integration]
    ) -> HttpResponse | None:
        """An intermediate page asks for the reason, then each is retired by its service; one
        already retired is named, not changed."""
        reason = _retire_reason(self, request, queryset, "retire_integrations")
        if not isinstance(reason, str):
            return reason
        done = 0
        batch = first_rows(queryset)
        for integration in batch.rows:
            try:
                integration_retire(
                    integration=integration, reason=reason, actor=staff_actor(request)
                )
            except ValidationError as exc:
                self.message_user(request, _validation_text(exc), messages.ERROR)
            else:
                done += 1
        _retired(self, request, done)
        batch.tell(request)
        return None

    # -- buttons on the change page ----------------------------------------------------------

    def object_buttons(self, obj: Integration) -> list[ObjectButton]:
        """The change page's buttons; a kind puts its own before these."""
        if obj.retired_at is not None:
            return []  # retired is final: no new secret (the service refuses one)
        return [
            ObjectButton(
                "Regenerate secret",
                # The page says which secret it showed: pressed twice, the broker's stays valid.
                self.admin_url("rotate_secret", obj.pk)
                + "?"
                + urlencode({"shown": secret_rotation_state(obj)}),
                confirm="Regenerate the Webhook Secret? The current one keeps verifying "
                "callbacks for 24 hours; dispatches are signed with the new one at once.",
            )
        ]

    def object_view(self, route: str, name: str, view: Any) -> URLPattern:
        """``<pk>/<route>/``, named ``<app>_<model>_<name>``: one of its buttons' views."""
        opts = self.opts
        return path(
            f"<int:pk>/{route}/",
            self.admin_site.admin_view(view),
            name=f"{opts.app_label}_{opts.model_name}_{name}",
        )

    def object_views(self) -> list[URLPattern]:
        """Its buttons' views; a kind adds its own to these."""
        return [self.object_view("rotate-secret", "rotate_secret", self.rotate_secret_view)]

    def get_urls(self) -> list[Any]:
        return [*self.object_views(), *super().get_urls()]

    def posted_integration(self, request: HttpRequest, pk: int) -> Integration:
        """The integration a button posted for, refused (403) to whom may not change it."""
        integration = get_object_or_404(self.model._default_manager.select_related("broker"), pk=pk)
        if request.method != "POST" or not self.has_change_permission(request, integration):
            raise PermissionDenied
        return integration

    def rotate_secret_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        integration = self.posted_integration(request, pk)
        try:
            secret = integration_secret_rotate(
                integration=integration,
                actor=staff_actor(request),
                shown_rotation_state=request.GET.get("shown"),
            )
        except ValidationError as exc:  # retired since the page was shown
            messages.error(request, f"No new secret: {_validation_text(exc)}.")
            return HttpResponseRedirect(self.admin_url("change", pk))
        shown = self.secret_shown_once(integration, secret, "Webhook Secret regenerated")
        expires_at = integration.previous_secret_expires_at
        assert expires_at is not None  # the rotation just set it
        return show_once(
            request,
            dataclasses.replace(
                shown,
                explanation=f"{shown.explanation} The previous secret keeps verifying callbacks "
                f"until {drop_time_text(expires_at)}.",
            ),
        )


@admin.register(Integration)
class IntegrationListAdmin(IntegrationAdmin):
    """Every integration, of every kind. An integration's page here is its kind's (the same
    page as under its proxy model's URL), and so is the add page ``?kind=`` names."""

    list_display = ["name", "broker", "kind", "target", "enabled", "state", "created_at"]
    list_filter = ["enabled", "kind", "broker"]
    change_list_template = "admin/integrations/integration/change_list.html"

    def kind_admins(self) -> dict[str, IntegrationAdmin]:
        """Each kind's ModelAdmin on this site, by kind: those registered for a proxy model."""
        return {
            model.KIND: model_admin
            for model, model_admin in self.admin_site._registry.items()
            if isinstance(model_admin, IntegrationAdmin)
            and model._meta.proxy
            and model._meta.concrete_model is Integration
        }

    def _kind_admin(self, kind: str) -> IntegrationAdmin:
        kinds = self.kind_admins()
        if kind not in kinds:
            raise Http404(f"No kind of integration {kind!r}")
        return kinds[kind]

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        kind = request.GET.get("kind") or DEFAULT_KIND
        return self._kind_admin(kind).add_view(request, form_url, extra_context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        if obj is None:  # Django's own answer: back to the list, "does not exist"
            return super().change_view(request, object_id, form_url, extra_context)
        return self._kind_admin(obj.kind).change_view(request, object_id, form_url, extra_context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        adds = [
            (f"Add {model_admin.opts.verbose_name}", model_admin.admin_url("add"))
            for model_admin in self.kind_admins().values()
            if model_admin.has_add_permission(request)
        ]
        return super().changelist_view(request, {**(extra_context or {}), "kind_adds": adds})

    def object_views(self) -> list[URLPattern]:
        return []  # its buttons are its kinds' own


class SaasConnectionForm(TargetUrlMixin, forms.ModelForm):
    url = forms.URLField(label="URL", assume_scheme="https", max_length=500)
    token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Sent as 'Authorization: Bearer <token>'. Stored encrypted and never shown; "
        "leave empty to keep the current one (a new URL clears it unless entered again).",
    )
    categories = forms.CharField(
        initial="email",
        help_text="Comma-separated identifier categories it deletes by (email, phone, ...).",
    )

    class Meta:
        model = SaasConnection
        fields = ["broker", "name", "url", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["categories"].initial = ", ".join(self.instance.identifier_categories)

    def clean_categories(self) -> list[str]:
        try:
            return categories_validate(self.cleaned_data["categories"].split(","))
        except ValidationError as exc:
            raise forms.ValidationError(exc.message_dict["categories"]) from None


# What a SaaS connection's change page edits besides its token and the enabled box.
SAAS_EDITED = ("name", "url", "categories")


@admin.register(SaasConnection)
class SaasConnectionAdmin(RefusalsShown, WriteOnlyCredentials, ModelAdmin):
    form = SaasConnectionForm
    credentials = [Credential("token", "Token", "token_changed_at")]
    list_display = [
        "name",
        "broker",
        "target",
        "categories",
        "enabled",
        "disabled_reason",
        "retired_at",
    ]
    list_filter = ["enabled", "broker"]
    search_fields = ["name"]  # not by URL, as for integrations
    url_fields = ["url"]
    list_select_related = ["broker"]
    actions = ["disable_connections", "retire_connections"]

    @admin.display(description="URL")
    def target(self, obj: SaasConnection) -> str:
        return without_url_extras(obj.url)

    @admin.display(description="Categories")
    def categories(self, obj: SaasConnection) -> str:
        return ", ".join(obj.identifier_categories)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        own = ["uuid", "broker", "disabled_reason", "retired_at", "retired_reason"] if obj else []
        return [*own, *super().get_readonly_fields(request, obj)]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        form = super().get_form(request, obj, change=change, **kwargs)
        # Read by save_model's changed_data.
        fields_as_shown(form.base_fields, ["enabled", *SAAS_EDITED])
        return form

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["broker", "name", "url", "token", "categories", "enabled"]
        if obj is None:
            return fields
        return ["uuid", *fields, "disabled_reason", "retired_at", "retired_reason"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(
        self, request: HttpRequest, obj: SaasConnection, form: Any, change: bool
    ) -> None:
        actor = staff_actor(request)
        data = form.cleaned_data
        categories = data["categories"]
        try:
            if not change:
                created = saas_connection_create(
                    broker=data["broker"],
                    name=data["name"],
                    url=data["url"],
                    token=data.get("token") or "",
                    categories=categories,
                    actor=actor,
                )
                obj.pk = created.pk
                if not data["enabled"]:
                    saas_connection_disable(
                        connection=created, reason="added disabled", actor=actor
                    )
                return
            current = SaasConnection.objects.get(pk=obj.pk)
            # Only what the person changed, as for integrations above: a URL left as the page
            # showed it must not undo a move made meanwhile (and clear its new token).
            edited = {name: data[name] for name in SAAS_EDITED if name in form.changed_data}
            updated = saas_connection_update(
                connection=current,
                actor=actor,
                token=data.get("token") or None,
                **edited,
            )
            if current.token and not updated.token:
                messages.warning(
                    request,
                    "The token was cleared: it is never sent to a URL it was not entered for. "
                    "Enter it again.",
                )
            toggled = "enabled" in form.changed_data  # as for integrations, above
            if toggled and data["enabled"] and not current.enabled:
                saas_connection_enable(connection=current, actor=actor)
            elif toggled and not data["enabled"] and current.enabled:
                saas_connection_disable(connection=current, reason="disabled by staff", actor=actor)
        except ValidationError as exc:
            messages.error(request, _validation_text(exc))
            raise Refused from exc

    @admin.action(description="Disable selected SaaS connections", permissions=["change"])
    def disable_connections(self, request: HttpRequest, queryset: QuerySet[SaasConnection]) -> None:
        done = 0
        # Those disabled already are not counted: the page says of how many enabled ones.
        batch = first_rows(queryset.filter(enabled=True), of="enabled in the selection")
        for connection in batch.rows:
            saas_connection_disable(
                connection=connection, reason="disabled by staff", actor=staff_actor(request)
            )
            done += 1
        self.message_user(request, f"Disabled {done} SaaS connection(s).")
        batch.tell(request)

    @admin.action(description="Retire selected SaaS connections for good (with a reason)",
                  permissions=["change"])  # fmt: skip
    def retire_connections(
        self, request: HttpRequest, queryset: QuerySet[SaasConnection]
    ) -> HttpResponse | None:
        reason = _retire_reason(self, request, queryset, "retire_connections")
        if not isinstance(reason, str):
            return reason
        done = 0
        batch = first_rows(queryset)
        for connection in batch.rows:
            try:
                saas_connection_retire(
                    connection=connection, reason=reason, actor=staff_actor(request)
                )
            except ValidationError as exc:
                self.message_user(request, _validation_text(exc), messages.ERROR)
            else:
                done += 1
        _retired(self, request, done)
        batch.tell(request)
        return None
