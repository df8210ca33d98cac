"""Standardization and hashing share their shape: DROP's official test vectors run through
the deployed code at export (``integrations.drop.vectors``), every input, expected and
computed value in a file of the pack, any difference failing the component."""

from __future__ import annotations

import json

from integrations.drop.vectors import VectorResult
from integrations.evidence.components import VECTORS_SUFFIX
from integrations.services.evidence.components.base import Component, PackContext


def vectors_component(
    context: PackContext,
    *,
    key: str,
    results: list[VectorResult],
    test_name: str,
    proves: str,
    cannot_prove: str,
) -> Component:
    name = f"components/{key}{VECTORS_SUFFIX}"  # the name the offline verifier checks
    component = Component(key=key, proves=proves, cannot_prove=cannot_prove)
    differ = [result for result in results if not result.equal]
    component.records = {
        "vectors": len(results),
        "equal": len(results) - len(differ),
        "differ": len(differ),
        "source": "DROP's official worked examples (docs/contracts.md §12)",
    }
    component.test(
        test_name,
        passed=bool(results) and not differ,
        detail=f"{len(results) - len(differ)} of {len(results)} equal"
        + "".join(
            f"; {result.field} {json.dumps(result.given, ensure_ascii=False)}: expected "
            f"{result.expected}, computed {result.computed}"
            for result in differ
        ),
    )
    document = {"vectors": [result.as_json() for result in results]}
    context.writer.write(
        name,
        [json.dumps(document, indent=2, ensure_ascii=False).encode() + b"\n"],
        rows=len(results),
        description=f"DROP's test vectors run through the deployed code at export ({key})",
    )
    component.files.append(name)
    return component
