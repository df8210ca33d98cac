"""Hashing: DROP's standardized values and whole list examples hashed by the deployed code."""

from __future__ import annotations

from integrations.drop import vectors
from integrations.services.evidence.components.base import Component, PackContext
from integrations.services.evidence.components.vector_runs import vectors_component


def build(context: PackContext) -> Component:
    return vectors_component(
        context,
        key="hashing",
        results=vectors.hashing_results(),
        test_name="DROP's official hashes computed by the deployed code",
        proves=(
            "The code running when the pack was exported computes DROP's published hashes: "
            "SHA-256 in standard Base64 of each standardized value, and each list type's "
            "example from the record to its hash, the composite NDZ and NameVIN included."
        ),
        cannot_prove=(
            "That every consumer was hashed by this code (consumers registered with hashes "
            "computed elsewhere are matched as given), or that the same code ran all through "
            "the period."
        ),
    )
