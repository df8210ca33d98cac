"""dropportal's admin site: the staff dashboard is its index page.

``dropportal.apps.DropportalAdminConfig`` makes this the default site, so every
``@admin.register`` in ``integrations/admin/`` lands here. It lives outside
``integrations.admin`` on purpose: importing that package registers the ModelAdmins, which
must not happen while the default site itself is being built.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path


class DropportalAdminSite(admin.AdminSite):
    site_header = "dropportal"
    site_title = "dropportal"
    index_title = "Dashboard"

    def get_urls(self) -> list[URLPattern | URLResolver]:
        from integrations.admin.audit import drop_metrics_view, evidence_view
        from integrations.admin.cycle_files import cycle_response_files_view
        from integrations.admin.guide import broker_guide_view
        from integrations.admin.shown_once import shown_once_view

        return [
            path("guide/", self.admin_view(broker_guide_view), name="broker_guide"),
            path("metrics/", self.admin_view(drop_metrics_view), name="drop_metrics"),
            path("evidence/", self.admin_view(evidence_view), name="evidence"),
            # Ahead of the cycle admin's own URLs, which would take it for an object id.
            path(
                "integrations/dropcycle/<int:pk>/response-files.zip",
                self.admin_view(cycle_response_files_view),
                name="cycle_response_files",
            ),
            path(
                "shown-once/<str:token>/",
                self.admin_view(shown_once_view),
                name="shown_once",
            ),
            *super().get_urls(),
        ]

    def index(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        from integrations.admin.dashboard import dashboard_context  # after the app registry

        # Staff with no role in the app see no figures of it, as Django shows them no list.
        shown = dashboard_context(request) if request.user.has_module_perms("integrations") else {}
        return super().index(request, {**shown, **(extra_context or {})})
