"""URLs of the broker-facing API, mounted at /api/v1/."""

from django.urls import path, register_converter
from django.urls.converters import PathConverter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from integrations.api import (
    callbacks,
    consumers,
    directives,
    drop_notifications,
    isi_callbacks,
    outcomes,
    suppression,
    views,
)
from integrations.api import schema as _schema  # noqa: F401  (registers the bearer scheme)


class PointerConverter(PathConverter):
    """A remote_identifier, stored verbatim: any characters, "/" and newlines included
    (path's ".+" stops at a newline, so a pointer ending in one could not be forgotten)."""

    regex = r"[\s\S]+"


register_converter(PointerConverter, "pointer")

urlpatterns = [
    path("ping", views.PingView.as_view(), name="api-ping"),
    path(
        "drop/callbacks/deletion",
        callbacks.DeletionCallbackView.as_view(),
        name="api-callback-deletion",
    ),
    path(
        "drop/callbacks/resolution",
        callbacks.ResolutionCallbackView.as_view(),
        name="api-callback-resolution",
    ),
    path("drop/callbacks/isi", isi_callbacks.IsiCallbackView.as_view(), name="api-callback-isi"),
    path(
        "drop/notifications/<str:broker_id>",
        drop_notifications.DropNotificationView.as_view(),
        name="api-drop-notifications",
    ),
    path("drop/outcomes", outcomes.OutcomesView.as_view(), name="api-outcomes"),
    path("drop/consumers", consumers.ConsumersView.as_view(), name="api-consumers"),
    path(
        "drop/consumers/<pointer:remote_identifier>",
        consumers.ConsumerView.as_view(),
        name="api-consumer",
    ),
    path(
        "drop/suppression/check",
        suppression.SuppressionCheckView.as_view(),
        name="api-suppression-check",
    ),
    path(
        "drop/directives/<int:directive_id>/acknowledgement",
        directives.DirectiveAcknowledgementView.as_view(),
        name="api-directive-acknowledgement",
    ),
    path("schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
