"""OpenAPI (drf-spectacular) additions: the API key authentication (a bearer token), and
postprocessing hooks that say what every operation answers and reads (problem details, no
NUL in any string).

Imported by ``integrations.api.urls`` so the extension is registered before the schema is
generated; every view authenticated by ``ApiKeyAuthentication`` then lists it as security.
"""

from __future__ import annotations

import copy
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
            "webhook_callback, ingest, audit or suppression.",
        }


PROBLEM_MEDIA_TYPE = "application/problem+json"

# No string the API reads may hold a NUL (json_body refuses it: PostgreSQL's text cannot store
# one), so no string the schema describes does.
NUL_FREE_PATTERN = "^[^\\u0000]*$"
# Any JSON value the API can read: its strings and keys hold no NUL.
JSON_VALUE = "JsonValue"
JSON_VALUE_REF = {"$ref": f"#/components/schemas/{JSON_VALUE}"}
_NUL_FREE_STRING = {"type": "string", "pattern": NUL_FREE_PATTERN}
_JSON_VALUE_SCHEMA = {
    "description": "Any JSON value whose strings and keys hold no NUL (\\u0000).",
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "number"},
        _NUL_FREE_STRING,
        {"type": "array", "items": JSON_VALUE_REF},
        {
            "type": "object",
            "propertyNames": _NUL_FREE_STRING,
            "additionalProperties": JSON_VALUE_REF,
        },
    ],
}


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


def nul_free_strings_hook(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing: every free string (no pattern, format or enum of its
    own), every key of an open object and every value under a key it does not name says it
    holds no NUL, and the ``JsonValue`` component is there to refer to."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas[JSON_VALUE] = copy.deepcopy(_JSON_VALUE_SCHEMA)
    pending: list[Any] = [result.get("paths", {}), schemas]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, dict):
            types = node.get("type")
            is_string = types == "string" or (isinstance(types, list) and "string" in types)
            if is_string and not {"pattern", "format", "enum", "anyOf"} & node.keys():
                node["pattern"] = NUL_FREE_PATTERN
            # A nullable object (``allow_null``) is typed ["object", "null"]: its keys too.
            is_object = types == "object" or (isinstance(types, list) and "object" in types)
            if is_object and node.get("additionalProperties") is not False:
                node.setdefault("propertyNames", dict(_NUL_FREE_STRING))
                # A key an object does not name holds any JSON value without a NUL too.
                node.setdefault("additionalProperties", dict(JSON_VALUE_REF))
            pending.extend(node.values())
    return result
