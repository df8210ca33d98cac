"""A save or a deletion a service refused after the form's checks passed (a name taken by a
second submit, a row removed meanwhile): the ``ModelAdmin`` queues the message and raises
``Refused``; ``RefusalsShown`` answers with the page again (add, change) or the list
(delete), the message on it, and nothing saved::

    class BrokerAdmin(RefusalsShown, ModelAdmin):
        def save_model(self, request, obj, form, change):
            try:
                broker_create(...)
            except ValidationError as exc:
                messages.error(request, " ".join(exc.messages))
                raise Refused from exc
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse


class Refused(Exception):
    """A service refused the form's data; the message is already queued for staff."""


class RefusalsShown:
    """Before ``ModelAdmin`` in the bases: its add, change and delete views answer a
    ``Refused`` with a redirect rather than a 500 (the transaction it ran in rolled back)."""

    opts: Any

    def add_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().add_view(request, *args, **kwargs)  # type: ignore[misc]
        except Refused:  # the page again, with the message
            return HttpResponseRedirect(request.get_full_path())

    def change_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().change_view(request, *args, **kwargs)  # type: ignore[misc]
        except Refused:
            return HttpResponseRedirect(request.get_full_path())

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().delete_view(request, *args, **kwargs)  # type: ignore[misc]
        except Refused:  # the list, with the message (the row is gone)
            opts = self.opts
            return HttpResponseRedirect(
                reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
            )
