"""DRF fields for the broker's JSON bodies: strict on types, verbatim on values.

Used by the callback serializers (what the broker sends us) and by the ISI client (what the
broker's API answers), which read the same shapes.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A JSON string, taken as sent (no trimming); numbers and booleans are refused."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictChoiceField(serializers.ChoiceField):
    """One of ``choices``, as a JSON string (``1.0`` the number is not ``"1.0"``)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class ResolvedIdentifiersField(serializers.DictField):
    """``{"email": [{"email": "..."}], "phone": [{"phone": "+1..."}]}``: categories of
    arrays of objects of strings, kept verbatim. Each object holds its category's key (other
    keys are tolerated); an empty category, or none, is accepted: nothing was resolved."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            child=serializers.ListField(
                child=serializers.DictField(
                    child=StrictCharField(max_length=1000), allow_empty=False
                )
            ),
            **kwargs,
        )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        identifiers: dict[str, Any] = super().to_internal_value(data)
        # Read by the category's key downstream: an object without it would be a crash, or
        # a SaaS deletion cancelled as having nothing to delete.
        missing = {
            category: {
                index: {category: [self.error_messages["required"]]}
                for index, entry in enumerate(entries)
                if category not in entry
            }
            for category, entries in identifiers.items()
        }
        # Indexes as ints, as DRF's ListField keys its errors (read as ``[0]``, not ``.0``).
        errors: dict[str, Any] = {category: found for category, found in missing.items() if found}
        if errors:
            raise serializers.ValidationError(errors, code="required")
        return identifiers
