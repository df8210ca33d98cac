"""API keys in the admin: the clear key is shown once, right after creation.

Who mints which key: whoever may add keys (Connections managers) mints ``webhook_callback``,
``ingest`` and ``metrics`` keys of a broker; only Auditors (``add_audit_apikey``) mint
``audit`` keys, which read every outcome of the broker; only a superuser mints a ``metrics``
key without a broker, which sees every broker's series (the operator's own Prometheus).
Whoever may revoke keys revokes only those they could mint (``revocable``): a Connections
manager leaves Auditors' ``audit`` keys and the operator's broker-less key alone.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from unfold.admin import ModelAdmin

from integrations.admin.actors import staff_actor
from integrations.admin.credentials import SecretLookupsRefused
from integrations.admin.shown_once import SecretShownOnce, show_once
from integrations.models import ApiKey, ApiKeyScope
from integrations.services.staff.keys import api_key_create, api_keys_revoke

AUDIT_KEY_PERMISSION = "integrations.add_audit_apikey"
EVERY_BROKER_HELP = (
    "Leave empty only for a metrics key that sees every broker's series (your own "
    "Prometheus); a broker's key sees its broker's only."
)


def mintable_scopes(user: Any) -> list[str]:
    """The scopes ``user`` may give a new key."""
    scopes = []
    if user.has_perm("integrations.add_apikey"):
        scopes += [
            ApiKeyScope.WEBHOOK_CALLBACK,
            ApiKeyScope.INGEST,
            ApiKeyScope.METRICS,
            ApiKeyScope.SUPPRESSION,
            ApiKeyScope.DIRECTIVE_ACK,
        ]
    if user.has_perm(AUDIT_KEY_PERMISSION):
        scopes.append(ApiKeyScope.AUDIT)
    return [str(scope) for scope in scopes]


def revocable(user: Any, api_key: ApiKey) -> bool:
    """Whether ``user`` may revoke ``api_key``: only a key they could mint themselves."""
    mintable = set(mintable_scopes(user))
    return set(api_key.scopes) <= mintable and (api_key.broker_id is not None or user.is_superuser)


class ApiKeyCreateForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiKeyScope.choices, widget=forms.CheckboxSelectMultiple
    )
    # Set per request by ApiKeyAdmin.get_form: what this staff member may mint.
    allowed_scopes: tuple[str, ...] = ()
    every_broker_allowed = False  # a superuser's

    class Meta:
        model = ApiKey
        fields = ["broker", "name", "scopes", "provider"]
        help_texts = {
            "provider": "For a directive_ack key only (that scope alone): the service provider "
            "whose directives it acknowledges, one of the broker's.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A scope not offered is an invalid choice on POST too.
        scopes = self.fields["scopes"]
        assert isinstance(scopes, forms.MultipleChoiceField)
        scopes.choices = [c for c in ApiKeyScope.choices if c[0] in self.allowed_scopes]
        broker = self.fields["broker"]
        broker.required = not self.every_broker_allowed
        if self.every_broker_allowed:
            broker.help_text = EVERY_BROKER_HELP

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        without_broker = data.get("broker") is None and "broker" not in self.errors
        if without_broker and set(data.get("scopes") or ()) != {ApiKeyScope.METRICS}:
            self.add_error("broker", "A key without a broker may only have the metrics scope.")
        provider = data.get("provider")
        acknowledges = ApiKeyScope.DIRECTIVE_ACK in (data.get("scopes") or ())
        if (provider is not None or acknowledges) and (
            provider is None
            or provider.broker_id != getattr(data.get("broker"), "pk", None)
            or set(data.get("scopes") or ()) != {ApiKeyScope.DIRECTIVE_ACK}
        ):
            self.add_error(
                "provider",
                "A directive_ack key is a service provider's own: choose one of the broker's "
                "providers and that scope alone.",
            )
        return data


@admin.register(ApiKey)
class ApiKeyAdmin(SecretLookupsRefused, ModelAdmin):
    secret_lookups = ["digest"]
    list_display = [
        "prefix",
        "name",
        "broker",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["broker", "revoked_at"]
    search_fields = ["prefix", "name"]
    # Its broker column: Django reads only the foreign keys that are not null with its rows.
    list_select_related = ["broker"]
    actions = ["revoke_keys"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(mintable_scopes(request.user))

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        if obj is None:
            kwargs["form"] = type(
                "ApiKeyCreateForm",
                (ApiKeyCreateForm,),
                {
                    "allowed_scopes": tuple(mintable_scopes(request.user)),
                    "every_broker_allowed": request.user.is_superuser,
                },
            )
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        return [
            "broker",
            "provider",
            "name",
            "scopes",
            "prefix",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the ledger refers to keys by prefix

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            return  # keys are immutable; only revocation changes them
        created = api_key_create(
            broker=form.cleaned_data["broker"],
            scopes=form.cleaned_data["scopes"],
            name=form.cleaned_data["name"],
            actor=staff_actor(request),
            provider=form.cleaned_data.get("provider"),
        )
        obj.pk = created.api_key.pk
        obj.prefix = created.api_key.prefix
        obj.scopes = created.api_key.scopes
        obj.created_key = created.key  # type: ignore[attr-defined]  # for response_add only

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        key = getattr(obj, "created_key", None)
        if key is None:
            return super().response_add(request, obj, post_url_continue)
        return show_once(
            request,
            SecretShownOnce(
                title="API key created",
                label="API key",
                secret=key,
                facts=[
                    ("Prefix (stays visible)", obj.prefix),
                    ("Broker", str(obj.broker) if obj.broker else "every broker (metrics)"),
                    ("Scopes", ", ".join(obj.scopes)),
                ],
                explanation=(
                    "The broker's systems send it as 'Authorization: Bearer <key>'. "
                    "dropportal stores only its SHA-256 digest; a lost key is revoked and "
                    "replaced, never recovered."
                ),
                guide_section="api-keys",
                guide_title="API keys",
                done_url=reverse("admin:integrations_apikey_changelist"),
                done_label="API keys",
            ),
        )

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        active = list(queryset.filter(revoked_at__isnull=True).order_by("prefix"))
        theirs = [api_key for api_key in active if revocable(request.user, api_key)]
        skipped = [api_key.prefix for api_key in active if api_key not in theirs]
        revoked = api_keys_revoke(api_keys=theirs, actor=staff_actor(request))
        self.message_user(request, f"Revoked {revoked} key(s).")
        if skipped:
            self.message_user(
                request,
                f"Not revoked: {', '.join(skipped)}. You revoke only keys you could create "
                "(an audit key needs the audit-key permission, a key without a broker a "
                "superuser).",
                messages.WARNING,
            )
