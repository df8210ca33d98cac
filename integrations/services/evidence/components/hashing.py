"""Hashing: DROP's standardized values and whole list examples hashed by the deployed code,
and each list example registered as a consumer would be in clear (the readers' digests)."""

from __future__ import annotations

import base64
from typing import Any

from integrations.consumers.api_reader import parse_api_consumers
from integrations.consumers.readers import ConsumerRecord
from integrations.drop import vectors
from integrations.services.evidence.components.base import Component, PackContext
from integrations.services.evidence.components.vector_runs import vectors_component


def _registered(list_type: str, given: Any) -> str:
    """``given`` registered in clear as the API reads it (the file reader uses the same
    digests): its hash as stored, or why it was refused."""
    try:
        (record,) = parse_api_consumers([{"remote_identifier": "vector", list_type: [given]}])
    except ValueError as exc:  # a digest that is not Base64 (binascii.Error), say
        return f"raised: {exc}"
    if not isinstance(record, ConsumerRecord):
        return f"refused: {record.reason}"
    return "; ".join(base64.b64encode(digest).decode() for _, digest in record.hashes)


def registration_results() -> list[vectors.VectorResult]:
    """Each list example the way a consumer registered in clear is hashed: the readers keep
    their own digests (raw bytes, no Base64 round trip), which ``hash_value`` does not run."""
    return [
        vectors.VectorResult("register", list_type, given, expected, _registered(list_type, given))
        for list_type, given, expected in vectors.LIST_VECTORS
    ]


def build(context: PackContext) -> Component:
    return vectors_component(
        context,
        key="hashing",
        results=vectors.hashing_results() + registration_results(),
        test_name="DROP's official hashes computed by the deployed code",
        proves=(
            "The code running when the pack was exported computes DROP's published hashes: "
            "SHA-256 in standard Base64 of each standardized value, and each list type's "
            "example from the record to its hash, the composite NDZ and NameVIN included, "
            "both by the hashing functions and as a consumer registered in clear is hashed."
        ),
        cannot_prove=(
            "That every consumer was hashed by this code (consumers registered with hashes "
            "computed elsewhere are matched as given), or that the same code ran all through "
            "the period."
        ),
    )
