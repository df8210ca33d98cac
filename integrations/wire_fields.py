"""DRF fields for the broker's JSON bodies: strict on types, verbatim on values.

Used by the callback serializers (what the broker sends us) and by the ISI client (what the
broker's API answers), which read the same shapes.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty

# The longest identifier value the broker may send back (an opted-out consumer's email, a
# resolved identifier), as it stores it: the contract sets no length, so the bound is only
# generous; one rule for every callback, so no outcome is accepted on one path and refused
# on another.
IDENTIFIER_MAX_LENGTH = 1000
# Where an opted_out answer carries the consumer's email: the path its errors, and a 409 for
# a repeat with another email, name.
OPT_OUT_EMAIL = "identifiers.email[0].email"

# A UUID as the wire writes it: 8-4-4-4-12 hexadecimal digits, as ``str(uuid)`` gives it.
# Python's ``UUID()`` also reads braces, "urn:uuid:" and 32 bare digits: a UUID spelt so
# would be answered, called or matched by another name than the one written. Either case is
# read (RFC 9562: a UUID's text is case-insensitive on input; a broker's database may give
# it back in upper case, and its outcome must not be lost for that).
UUID_PATTERN = "^[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"
_UUID_TEXT = re.compile(UUID_PATTERN[1:-1])


def uuid_from_text(value: Any) -> uuid.UUID | None:
    """``value`` as a UUID if it is one written 8-4-4-4-12 (``UUID_PATTERN``), else None."""
    if not isinstance(value, str) or not _UUID_TEXT.fullmatch(value):
        return None
    return uuid.UUID(value)


@extend_schema_field({"type": "string", "format": "uuid", "pattern": UUID_PATTERN})
class CanonicalUUIDField(serializers.UUIDField):
    """A UUID the service wrote (a ``request_uuid``), echoed 8-4-4-4-12: ``uuid_from_text``."""

    default_error_messages = {
        "invalid": "Must be the UUID as the service wrote it: hexadecimal digits, 8-4-4-4-12."
    }

    def to_internal_value(self, data: Any) -> uuid.UUID:
        found = uuid_from_text(data)
        if found is None:
            self.fail("invalid")
        return found


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

    default_error_messages = {"not_a_string": "Must be {expected}."}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            # Not DRF's '"1.0" is not a valid choice.': for the number 1.0 that names the
            # very string the sender must send as the one refused.
            choices = [json.dumps(str(choice)) for choice in self.choices]
            expected = (
                f"the string {choices[0]}"
                if len(choices) == 1
                else f"a string, one of {', '.join(choices)}"
            )
            self.fail("not_a_string", expected=expected)
        return super().to_internal_value(data)


class ResolvedIdentifiersField(serializers.DictField):
    """``{"email": [{"email": "..."}], "phone": [{"phone": "+1..."}]}``: categories of
    arrays of objects, kept verbatim. Each object holds its category's key, a string; other
    keys beside it are tolerated whatever their JSON type (``"primary": true``), as the
    deletion callback's identifiers are. An empty category, or none, is accepted: nothing
    was resolved."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            # Each object's values unchecked here (DRF's default child): its category's key
            # alone is read downstream, and checked below.
            child=serializers.ListField(child=serializers.DictField(allow_empty=False)),
            **kwargs,
        )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        identifiers: dict[str, Any] = super().to_internal_value(data)
        # Read by the category's key downstream: an object without it would be a crash, or
        # a SaaS deletion cancelled as having nothing to delete.
        value = StrictCharField(max_length=IDENTIFIER_MAX_LENGTH)  # an absent key is refused
        found: dict[str, Any] = {}
        for category, entries in identifiers.items():
            for index, entry in enumerate(entries):
                try:
                    value.run_validation(entry.get(category, empty))
                except serializers.ValidationError as exc:
                    # Indexes as ints, as DRF's ListField keys its errors (read as ``[0]``).
                    found.setdefault(category, {})[index] = {category: exc.detail}
        if found:
            raise serializers.ValidationError(found)
        return identifiers
