"""Validation of the broker's callback bodies (docs/contracts.md §2.2 and §2.4).

Strict on types (a JSON number is not the string ``"1.0"``) and verbatim on values: nothing
is trimmed or case-folded, since the service matches and records resolved identifiers
exactly as the broker stores them. Errors come back keyed by field; the cross-field rules
use the dotted path of the field (docs/contracts.md §5.2) (``identifiers.email[0].email``)::

    serializer = DeletionCallbackSerializer(data=payload)
    serializer.is_valid(raise_exception=True)    # 400 validation_failed with ``errors``

The deletion callback is the hot path: ``deletion_callback_validated`` answers for its
serializer.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from integrations.models import DropOutcome
from integrations.wire_fields import (
    IDENTIFIER_MAX_LENGTH,
    OPT_OUT_EMAIL,
    CanonicalUUIDField,
    ResolvedIdentifiersField,
    StrictCharField,
    StrictChoiceField,
    uuid_from_text,
)


class EmailIdentifierSerializer(serializers.Serializer):
    email = StrictCharField(max_length=IDENTIFIER_MAX_LENGTH)


class DeletionIdentifiersSerializer(serializers.Serializer):
    email = serializers.ListField(child=EmailIdentifierSerializer(), required=False)


class DeletionCallbackSerializer(serializers.Serializer):
    """Body §2.2: the deletion outcome callback."""

    schema_version = StrictChoiceField(choices=["1.0"])
    status = StrictChoiceField(choices=["completed"])
    request_uuid = CanonicalUUIDField()
    drop_outcome = StrictChoiceField(choices=DropOutcome.values)
    # No length limit of its own (the body's 64 KiB is one): the service keeps the first
    # 2,000 characters, and refusing a longer message would leave a failure unreported.
    error_message = StrictCharField(required=False, allow_null=True, allow_blank=True)
    identifiers = DeletionIdentifiersSerializer(required=False, allow_null=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        outcome = attrs["drop_outcome"]
        if outcome == DropOutcome.FAILED and not (attrs.get("error_message") or "").strip():
            raise serializers.ValidationError(
                {"error_message": ["Required when drop_outcome is 'failed'."]}
            )
        if outcome == DropOutcome.OPTED_OUT and not opt_out_email(attrs).strip():
            raise serializers.ValidationError(
                {OPT_OUT_EMAIL: ["Required when drop_outcome is 'opted_out'."]}
            )
        return attrs


# A plain outcome (no error message, no identifiers) in a body with nothing else: the
# serializer would accept it as it is, its UUID parsed. Kept: without it the web process spends
# about 0.5 ms more CPU per callback (13 to 15 %; callgrind: 24 % more instructions), per
# docs/benchmarks.md on ``_PLAIN_KEYS``.
_PLAIN_KEYS = frozenset({"schema_version", "status", "request_uuid", "drop_outcome"})
_PLAIN_OUTCOMES = frozenset({DropOutcome.DELETED, DropOutcome.NOT_FOUND, DropOutcome.EXEMPT})


def deletion_callback_validated(payload: dict[str, Any]) -> dict[str, Any]:
    """Body §2.2 validated, as ``DeletionCallbackSerializer``'s ``validated_data``; raises its
    400. A plain outcome skips building the serializer, whose fields DRF deep-copies for
    every instance: kept because the callbacks bench measures it (docs/benchmarks.md); the
    serializer stays the rule, and a test holds the shortcut to its answer."""
    outcome, request_uuid = payload.get("drop_outcome"), payload.get("request_uuid")
    if (
        payload.keys() == _PLAIN_KEYS
        and payload["schema_version"] == "1.0"
        and payload["status"] == "completed"
        and isinstance(outcome, str)
        and outcome in _PLAIN_OUTCOMES
        and isinstance(request_uuid, str)
    ):
        parsed = uuid_from_text(request_uuid)
        if parsed is not None:  # else the serializer says what is wrong
            return {**payload, "request_uuid": parsed}
    serializer = DeletionCallbackSerializer(data=payload)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def opt_out_email(attrs: dict[str, Any]) -> str:
    """``identifiers.email[0].email`` of a validated body §2.2 or §2.4, or ``""``."""
    emails = (attrs.get("identifiers") or {}).get("email") or []
    return str(emails[0]["email"]) if emails else ""


class ResolutionCallbackSerializer(serializers.Serializer):
    """Body §2.4: the identifier retrieval outcome callback."""

    status = StrictChoiceField(choices=["completed"])
    results_token = StrictCharField(max_length=64)
    drop_outcome = StrictChoiceField(
        choices=[DropOutcome.OPTED_OUT, DropOutcome.EXEMPT], required=False, allow_null=True
    )
    exemption_basis = StrictCharField(
        required=False, allow_null=True, allow_blank=True, max_length=100
    )
    # null is taken as absent, as drop_outcome's and the deletion callback's identifiers are.
    identifiers = ResolvedIdentifiersField(
        required=False,
        allow_null=True,
        help_text="Categories, each an array of objects keyed by the category name: "
        '{"email": [{"email": "..."}], "phone": [{"phone": "+1..."}]}.',
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "identifiers" in attrs and attrs["identifiers"] is None:
            del attrs["identifiers"]  # null is absent: required below unless an outcome
        outcome = attrs.get("drop_outcome") or ""
        if outcome == DropOutcome.EXEMPT and not (attrs.get("exemption_basis") or "").strip():
            raise serializers.ValidationError(
                {"exemption_basis": ["Required when drop_outcome is 'exempt'."]}
            )
        if outcome == DropOutcome.OPTED_OUT and not opt_out_email(attrs).strip():
            raise serializers.ValidationError(
                {OPT_OUT_EMAIL: ["Required when drop_outcome is 'opted_out'."]}
            )
        if not outcome and "identifiers" not in attrs:
            raise serializers.ValidationError(
                {"identifiers": ["Required unless drop_outcome is 'opted_out' or 'exempt'."]}
            )
        return attrs


class CallbackRecordedSerializer(serializers.Serializer):
    """The 200 answer: recorded, or unchanged (the same outcome was already recorded)."""

    status = serializers.ChoiceField(choices=["recorded", "unchanged"])
    request_uuid = serializers.UUIDField()
    drop_outcome = serializers.CharField(allow_blank=True)


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details, with the stable ``code`` and, on 400, ``errors`` by field."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.CharField()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # Declared here: as a class attribute it would shadow Serializer.errors.
        fields["errors"] = serializers.DictField(required=False)
        return fields
