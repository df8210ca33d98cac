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


PROBLEM_MEDIA_TYPE = "application/problem+json"


def problem_details_hook(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing: every error answer is documented as what it is, RFC
    9457 problem details (``application/problem+json``), and every operation that needs an
    API key documents its 401."""
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            for status, response in responses.items():
                if status.isdigit() and int(status) >= 400 and response.get("content"):
                    response["content"] = {PROBLEM_MEDIA_TYPE: problem}
            if operation.get("security") and "401" not in responses:
                responses["401"] = {
                    "description": "authentication_failed: no API key, or an unknown or "
                    "revoked one",
                    "content": {PROBLEM_MEDIA_TYPE: problem},
                }
    return result
