"""Standardization: DROP's official values standardized by the deployed rules at export."""

from __future__ import annotations

from integrations.drop import vectors
from integrations.services.evidence.components.base import Component, PackContext
from integrations.services.evidence.components.vector_runs import vectors_component


def build(context: PackContext) -> Component:
    return vectors_component(
        context,
        key="standardization",
        results=vectors.standardization_results(),
        test_name="DROP's official values standardized by the deployed code",
        proves=(
            "The code running when the pack was exported standardizes every value of DROP's "
            "worked examples (emails, phones, names, dates of birth, ZIP codes, VINs, MAIDs, "
            "CTV IDs) and the name examples DROP settled exactly as DROP does: inputs, "
            "expected and computed values are in the file named below."
        ),
        cannot_prove=(
            "That the same code ran all through the period (the software version is in the "
            "manifest; earlier packs hold earlier runs), or how values DROP gave no example "
            "for are standardized (names of scripts DROP's table does not cover)."
        ),
    )
