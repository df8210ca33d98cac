"""OpenAPI (drf-spectacular) description of the API key authentication: a bearer token.

Imported by ``integrations.api.urls`` so the extension is registered before the schema is
generated; every view authenticated by ``ApiKeyAuthentication`` then lists it as security.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "integrations.api.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (dpk_…) with the scope the operation needs: "
            "webhook_callback, ingest or audit.",
        }
