"""Stored credentials in the admin: write-only, for every role (superusers included).

A ModelAdmin lists its credential fields; on a change or view page each one is shown as
"set (last changed ...)" or "not set", and staff who may change the row get an empty
password input next to it to enter a new value. The stored value is never rendered, so a
view-only role (Operators, Auditors) reads nothing through the read-only fields Django would
otherwise render from the decrypted model value::

    @admin.register(Broker)
    class BrokerAdmin(WriteOnlyCredentials, admin.ModelAdmin):
        credentials = [Credential("drop_api_key", "DROP API key", "drop_api_key_changed_at")]

A target's URL may carry a token in its query (``?key=``): its ``url_fields`` are shown to a
view-only role without their query, fragment or parameters (``without_url_extras``), as
the ledger keeps them. And no field of ``secret_lookups`` (a digest, such a URL, a token)
may be filtered on from the query string (``SecretLookupsRefused``), which Django allows on
any field of the model itself: ``?digest__startswith=a3`` would read it out a character at
a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest
from django.utils import timezone

from integrations.url_extras import without_url_extras


@dataclass(frozen=True)
class Credential:
    field: str  # the model's EncryptedTextField
    label: str
    changed_at: str  # the model's timestamp of the last change


def credential_status(obj: Any, credential: Credential) -> str:
    """What anyone may know of a stored credential: whether it is set, and since when."""
    if not getattr(obj, credential.field, ""):
        return "not set"
    changed_at = getattr(obj, credential.changed_at, None)
    if changed_at is None:
        return "set"
    return f"set (last changed {timezone.localtime(changed_at):%Y-%m-%d %H:%M %Z})"


def _status_display(credential: Credential) -> Callable[[Any], str]:
    def status(obj: Any) -> str:
        return credential_status(obj, credential)

    status.__name__ = f"{credential.field}_status"
    return admin.display(description=credential.label)(status)


def _url_display(field: str, label: str) -> Callable[[Any], str]:
    def url(obj: Any) -> str:
        return without_url_extras(getattr(obj, field) or "")

    url.__name__ = f"{field}_without_extras"
    return admin.display(description=label)(url)


class SecretLookupsRefused:
    """Mixin for a ModelAdmin: no filter from the query string on its ``secret_lookups``."""

    secret_lookups: Sequence[str] = ()

    def refused_lookups(self) -> Sequence[str]:
        return self.secret_lookups

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        if lookup.split(LOOKUP_SEP, 1)[0] in self.refused_lookups():
            return False
        return bool(super().lookup_allowed(lookup, value, request))  # type: ignore[misc]


class WriteOnlyCredentials(SecretLookupsRefused):
    """Mixin for a ModelAdmin: its ``credentials`` are entered, never read back; its
    ``url_fields`` are read back whole only by staff who may change the row. Neither is filtered
    on from the query string."""

    credentials: Sequence[Credential] = ()
    url_fields: Sequence[str] = ()

    def refused_lookups(self) -> Sequence[str]:
        return [*self.secret_lookups, *self.url_fields, *(c.field for c in self.credentials)]

    def _statuses(self) -> dict[str, Callable[[Any], str]]:
        cached = self.__dict__.get("_credential_statuses")
        if cached is None:
            cached = {c.field: _status_display(c) for c in self.credentials}
            self.__dict__["_credential_statuses"] = cached
        return cached

    def _url_displays(self) -> dict[str, Callable[[Any], str]]:
        cached = self.__dict__.get("_url_displays_cached")
        if cached is None:
            model = self.model  # type: ignore[attr-defined]
            cached = {
                name: _url_display(name, str(model._meta.get_field(name).verbose_name))
                for name in self.url_fields
            }
            self.__dict__["_url_displays_cached"] = cached
        return cached

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        if obj is None:
            return fieldsets  # the add form: inputs only, nothing stored yet
        may_change = self.has_change_permission(request, obj)  # type: ignore[attr-defined]
        statuses = self._statuses()
        urls = {} if may_change else self._url_displays()
        placed = {*statuses.values(), *urls.values()}

        def swap(names: Sequence[Any]) -> list[Any]:
            shown: list[Any] = []
            for name in names:
                if name in placed:
                    continue  # Django's default fields end with the read-only ones
                if isinstance(name, (list, tuple)):
                    shown.append(tuple(swap(name)))
                elif isinstance(name, str) and name in statuses:
                    shown.append(statuses[name])
                    if may_change:
                        shown.append(name)  # an empty password input: a new value
                elif isinstance(name, str) and name in urls:
                    shown.append(urls[name])
                else:
                    shown.append(name)
            return shown

        return [
            (title, {**options, "fields": swap(options.get("fields", ()))})
            for title, options in fieldsets
        ]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        """Its form, holding no stored credential: a ModelForm's initial values are the
        row's, so the decrypted credential sat in the page's form, and an input left empty
        differed from it, so Django's history (``LogEntry``, which every role that may view
        the row reads) said "Changed DROP API key" at every save."""
        form = super().get_form(request, obj, change=change, **kwargs)  # type: ignore[misc]
        names = [c.field for c in self.credentials]

        def __init__(self: Any, *args: Any, **form_kwargs: Any) -> None:
            form.__init__(self, *args, **form_kwargs)
            for name in names:
                self.initial.pop(name, None)

        return type(form.__name__, (form,), {"__init__": __init__})

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """A ModelAdmin that overrides this must add ``super()``'s to its own."""
        readonly = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        if obj is None:
            return readonly
        may_change = self.has_change_permission(request, obj)  # type: ignore[attr-defined]
        urls = [] if may_change else list(self._url_displays().values())
        return [*readonly, *self._statuses().values(), *urls]
