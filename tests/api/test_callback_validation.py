"""The deletion callback's validation shortcut answers exactly as its serializer does.

``deletion_callback_validated`` skips building ``DeletionCallbackSerializer`` for a plain
outcome (the callbacks' hot path); the serializer stays the rule. No database needed.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError

from integrations.api.callback_serializers import (
    DeletionCallbackSerializer,
    deletion_callback_validated,
)
from integrations.wire_fields import IDENTIFIER_MAX_LENGTH, ResolvedIdentifiersField

UUID = uuid.UUID("3f2c8a8e-6a4b-4c1e-9a57-0c5d2f1e9b10")
SPELLINGS = [str(UUID), str(UUID).upper(), UUID.hex, f"{{{UUID}}}", UUID.urn]


def plain(**changes: Any) -> dict[str, Any]:
    body = {
        "schema_version": "1.0",
        "status": "completed",
        "request_uuid": str(UUID),
        "drop_outcome": "deleted",
    }
    body.update(changes)
    return {key: value for key, value in body.items() if value is not ...}


def serializer_answer(payload: dict[str, Any]) -> dict[str, Any]:
    serializer = DeletionCallbackSerializer(data=payload)
    if serializer.is_valid():
        return {"valid": dict(serializer.validated_data)}
    return {"errors": serializer.errors}


def shortcut_answer(payload: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"valid": deletion_callback_validated(payload)}
    except ValidationError as exc:
        return {"errors": exc.detail}


@pytest.mark.parametrize(
    "payload",
    [
        *(plain(drop_outcome=o) for o in ("deleted", "not_found", "exempt")),
        *(plain(request_uuid=spelling) for spelling in SPELLINGS),
        # near misses: each must reach the serializer and get its answer
        plain(request_uuid="3f2c8a8e-not-a-uuid"),
        plain(request_uuid=7),
        plain(schema_version=1.0),
        plain(schema_version="1.1"),
        plain(status="done"),
        plain(status=...),
        plain(drop_outcome="DELETED"),
        plain(drop_outcome=["deleted"]),
        plain(drop_outcome="failed"),
        plain(drop_outcome="failed", error_message="CRM down"),
        plain(drop_outcome="opted_out"),
        plain(drop_outcome="opted_out", identifiers={"email": [{"email": "a@b.example"}]}),
        plain(error_message=None),
        plain(identifiers=None),
        plain(extra="ignored by the serializer"),
    ],
    ids=repr,
)
def test_the_shortcut_answers_as_the_serializer(payload: dict[str, Any]) -> None:
    assert shortcut_answer(payload) == serializer_answer(payload)


@pytest.mark.parametrize("spelling", SPELLINGS, ids=repr)
def test_only_the_request_uuid_written_8_4_4_4_12_is_valid(spelling: str) -> None:
    answer = shortcut_answer(plain(request_uuid=spelling))

    if spelling in (str(UUID), str(UUID).upper()):
        assert answer["valid"]["request_uuid"] == UUID
    else:
        assert list(answer["errors"]) == ["request_uuid"]


@pytest.mark.parametrize(("length", "valid"), [(IDENTIFIER_MAX_LENGTH, True), (1001, False)])
def test_an_opted_out_email_has_the_resolved_identifiers_bound(length: int, valid: bool) -> None:
    """An email the broker stores may be long: the deletion callback takes what the
    resolution callback takes, so an opt-out is never refused on one path alone."""
    email = "a" * (length - len("@b.example")) + "@b.example"
    payload = plain(drop_outcome="opted_out", identifiers={"email": [{"email": email}]})

    assert ("valid" in serializer_answer(payload)) is valid
    resolved = ResolvedIdentifiersField()
    if valid:
        resolved.run_validation({"email": [{"email": email}]})
    else:
        with pytest.raises(ValidationError):
            resolved.run_validation({"email": [{"email": email}]})
