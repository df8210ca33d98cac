"""Root URLs: the admin (staff) and the versioned API (brokers' systems, auditors)."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from integrations.operations import health, metrics

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/v1/", include("integrations.api.urls")),
    # Operations: probes and Prometheus metrics.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.MetricsView.as_view(), name="metrics"),
]

handler400 = "integrations.web.errors.bad_request"
handler404 = "integrations.web.errors.not_found"
handler500 = "integrations.web.errors.server_error"
