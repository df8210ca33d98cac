"""Content negotiation that never answers 406: DRF's choice when the ``Accept`` header (or
``?format=``) allows one of the view's renderers, else the view's first renderer.

The API speaks JSON whatever a client asks for, as RFC 9110 section 12.5.1 allows: DRF
negotiates before authentication, so its 406 refused a valid key's ping or a correctly signed
callback with nothing recorded. Views with several renderers (the OpenAPI schema's YAML and
JSON, the outcome history's CSV) still answer by ``Accept`` or ``?format=``. Named by DRF's
``DEFAULT_CONTENT_NEGOTIATION_CLASS`` setting, DRF calls it for every view::

    renderer, media_type = FallbackContentNegotiation().select_renderer(request, renderers)
"""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request


class FallbackContentNegotiation(DefaultContentNegotiation):
    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)  # read twice when nothing fits
        try:
            selected: tuple[BaseRenderer, str] = super().select_renderer(
                request, renderers, format_suffix
            )
        except exceptions.NotAcceptable:
            # Only the header is disregarded: an explicit format still chooses (an unknown
            # one was DRF's 404 above).
            requested = format_suffix or request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)
            if requested:
                renderers = self.filter_renderers(renderers, requested)
            return renderers[0], str(renderers[0].media_type)
        return selected
