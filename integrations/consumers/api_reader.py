"""Consumer records from the API's JSON objects (`POST /api/v1/drop/consumers`), and the
entries of a suppression check (`POST /api/v1/drop/suppression/check`: the same objects
without the pointer, `parse_api_identifiers`).

Each element of the body's ``consumers`` array becomes a `ConsumerRecord` or a
`RejectedRecord`, under the rules `integrations.consumers.readers` applies to CSV rows:
``email``, ``phone``, ``maid``, ``ctvid`` arrays, ``ndz`` and ``name_vin`` arrays of
objects, ``hashes`` as ``{list type: [Base64, ...]}``. Errors are keyed by the path of the
bad value. Pure Python, no Django.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from integrations.consumers.readers import (
    COMPOSITES,
    HASH_FORMAT,
    NO_IDENTIFIER,
    SIMPLE_DIGESTS,
    ConsumerRecord,
    Record,
    RejectedRecord,
    add_error,
    composite_digest,
    hash_digest,
    kind_problem,
    remote_identifier_problem,
)
from integrations.drop.standardize import LIST_TYPES, InvalidIdentifier

__all__ = [
    "API_FIELDS",
    "IDENTIFIER_FIELDS",
    "IdentifierEntry",
    "parse_api_consumers",
    "parse_api_identifiers",
]

_API_SIMPLE: Final = ("email", "phone", "maid", "ctvid")
_API_COMPOSITE: Final = dict(COMPOSITES)
IDENTIFIER_FIELDS: Final = (*_API_SIMPLE, *_API_COMPOSITE, "hashes")
API_FIELDS: Final = ("remote_identifier", "remote_identifier_kind", *IDENTIFIER_FIELDS)

Digest = tuple[str, bytes]  # (list type, 32-byte SHA-256 digest)


@dataclass(frozen=True, slots=True)
class IdentifierEntry:
    """One accepted entry of a suppression check: its index in the call and its digests."""

    position: int
    hashes: tuple[Digest, ...]


def parse_api_consumers(consumers: Sequence[Any]) -> Iterator[Record]:
    """One record per element of the API body's ``consumers`` array, in order.

    Errors are keyed by the path of the bad value: ``email[1]``, ``ndz[0].dob``,
    ``hashes.phone[2]``.
    """
    for index, item in enumerate(consumers):
        yield _api_consumer(index, item)


def _api_consumer(index: int, item: Any) -> Record:
    if not isinstance(item, dict):
        return RejectedRecord(index, None, {"non_field_errors": ["must be a JSON object"]})
    errors: dict[str, list[str]] = {}
    for key in item:
        if key not in API_FIELDS:
            add_error(errors, str(key), f"unknown field; expected {', '.join(API_FIELDS)}")

    rid = item.get("remote_identifier")
    pointer: str | None = None
    if rid is None:
        add_error(errors, "remote_identifier", "this field is required")
    elif not isinstance(rid, str):
        add_error(errors, "remote_identifier", "must be a string")
    else:
        pointer = rid
        problem = remote_identifier_problem(pointer)
        if problem:
            add_error(errors, "remote_identifier", problem)

    kind = item.get("remote_identifier_kind")
    if kind is not None:
        if not isinstance(kind, str):
            add_error(errors, "remote_identifier_kind", "must be a string")
        elif problem := kind_problem(kind.strip()):
            add_error(errors, "remote_identifier_kind", problem)
        else:
            kind = kind.strip()

    hashes = _api_identifiers(item, errors)
    if not errors and not hashes:
        add_error(errors, "non_field_errors", NO_IDENTIFIER)
    if errors:
        return RejectedRecord(index, pointer or None, errors)
    assert pointer is not None
    return ConsumerRecord(index, pointer, kind, hashes)


def parse_api_identifiers(entries: Sequence[Any]) -> Iterator[IdentifierEntry | RejectedRecord]:
    """One entry per element of a suppression check's ``consumers`` array, in order: a
    registration's consumer object without its pointer (``remote_identifier``, its kind),
    read under the same rules. A rejected entry has no ``remote_identifier``."""
    for index, item in enumerate(entries):
        if not isinstance(item, dict):
            yield RejectedRecord(index, None, {"non_field_errors": ["must be a JSON object"]})
            continue
        errors: dict[str, list[str]] = {}
        for key in item:
            if key not in IDENTIFIER_FIELDS:
                add_error(
                    errors, str(key), f"unknown field; expected {', '.join(IDENTIFIER_FIELDS)}"
                )
        hashes = _api_identifiers(item, errors)
        if not errors and not hashes:
            add_error(errors, "non_field_errors", NO_IDENTIFIER)
        yield RejectedRecord(index, None, errors) if errors else IdentifierEntry(index, hashes)


def _api_identifiers(item: dict[str, Any], errors: dict[str, list[str]]) -> tuple[Digest, ...]:
    """The digests of ``item``'s identifier fields (clear ones standardized and hashed,
    ``hashes`` decoded); each bad value's error goes into ``errors`` under its path."""
    hashes: list[Digest] = []
    for list_type in _API_SIMPLE:
        for i, value in _api_list(item, list_type, errors):
            if not isinstance(value, str):
                add_error(errors, f"{list_type}[{i}]", "must be a string")
                continue
            try:
                hashes.append((list_type, SIMPLE_DIGESTS[list_type](value)))
            except InvalidIdentifier as exc:
                add_error(errors, f"{list_type}[{i}]", exc.reason)
    for list_type, parts in _API_COMPOSITE.items():
        for i, value in _api_list(item, list_type, errors):
            digest = _api_composite(f"{list_type}[{i}]", list_type, parts, value, errors)
            if digest is not None:
                hashes.append((list_type, digest))
    _api_hashes(item.get("hashes"), hashes, errors)

    return tuple(hashes)


def _api_list(item: dict[str, Any], key: str, errors: dict[str, list[str]]) -> list[Any]:
    values = item.get(key)
    if values is None:
        return []
    if not isinstance(values, list):
        add_error(errors, key, "must be a list")
        return []
    return list(enumerate(values))


def _api_composite(
    path: str,
    list_type: str,
    parts: Sequence[str],
    value: Any,
    errors: dict[str, list[str]],
) -> bytes | None:
    if not isinstance(value, dict):
        add_error(errors, path, f"must be an object with {', '.join(parts)}")
        return None
    ok = True
    for key in value:
        if key not in parts:
            add_error(errors, f"{path}.{key}", f"unknown field; expected {', '.join(parts)}")
            ok = False
    for part in parts:
        if part not in value or value[part] is None:
            add_error(errors, f"{path}.{part}", "this field is required")
            ok = False
        elif not isinstance(value[part], str):
            add_error(errors, f"{path}.{part}", "must be a string")
            ok = False
    if not ok:
        return None
    try:
        return composite_digest(list_type, value)
    except InvalidIdentifier as exc:
        add_error(errors, f"{path}.{exc.field}", exc.reason)
        return None


def _api_hashes(value: Any, hashes: list[Digest], errors: dict[str, list[str]]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        add_error(errors, "hashes", "must be an object of list type to a list of Base64 hashes")
        return
    for list_type, texts in value.items():
        path = f"hashes.{list_type}"
        if list_type not in LIST_TYPES:
            add_error(errors, path, f"unknown list type; expected one of {', '.join(LIST_TYPES)}")
            continue
        if not isinstance(texts, list):
            add_error(errors, path, "must be a list of Base64 hashes")
            continue
        for i, text in enumerate(texts):
            digest = hash_digest(text) if isinstance(text, str) else None
            if digest is None:
                add_error(errors, f"{path}[{i}]", HASH_FORMAT)
            else:
                hashes.append((list_type, digest))
