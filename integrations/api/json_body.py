"""What the API accepts as a JSON request body: the one place that decides it.

Every JSON body (the consumer registration through DRF's parser, the signed callbacks
from their raw bytes) is read here::

    payload = json_body(raw)      # raises Problem: 400 validation_failed, 413

A body is accepted when it is UTF-8 JSON (RFC 8259: not UTF-16 or UTF-32; a leading byte
order mark is skipped; no ``NaN`` or ``Infinity``, no object naming a key twice), nested no
deeper than Python's parser can follow, and every string in it can be stored (``storable_text``): no
NUL character (PostgreSQL's text cannot hold one) and no unpaired surrogate (a lone
``\\ud800`` escape decodes to a string that cannot be written back as UTF-8). Anything
else is a 400 naming the reason, never a 500 further down.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from typing import IO, Any

from rest_framework.parsers import BaseParser

from integrations.storable_text import unstorable_reason
from integrations.web.errors import Problem

# The largest body the API reads (the consumer registration's 10,000 consumers with several
# identifiers each are a few MB). Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) would refuse
# a full registration, so JSON bodies are read here instead, against this cap.
MAX_BODY_BYTES = 32 * 1024 * 1024


def json_body(raw: bytes) -> Any:
    """``raw`` parsed, or ``Problem`` 400 ``validation_failed`` saying why not."""
    return _parsed(_utf8_text(raw))


def _utf8_text(raw: bytes) -> str:
    """``raw`` decoded as UTF-8, strictly: ``json.loads`` given bytes would guess UTF-16 or
    UTF-32, accepting bodies the contract does not. A UTF-8 byte order mark is skipped (RFC
    8259 §8.1 lets a parser ignore one; some platforms' writers add it, and refusing it
    would lose a broker's outcomes over an invisible character)."""
    try:
        return raw.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"The body is not valid JSON: {exc}.") from None


def _parsed(text: str) -> Any:
    try:
        payload = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_keys_once)
    except RecursionError:
        raise _invalid("The body is nested too deeply.") from None
    except ValueError as exc:
        raise _invalid(f"The body is not valid JSON: {exc}.") from None
    reason = unstorable_reason(payload)
    if reason:
        raise _invalid(f"The body cannot be stored: {reason}.")
    return payload


# RFC 8259 leaves an object naming a key twice to the parser; Python keeps the last, so
# {"consumers": [...], "consumers": [...]} lost the first list without a word. The key is
# not named back: a broker may key resolved identifiers by the identifier itself.
_TWICE = "an object names the same key twice, so which value is meant cannot be told"


def _keys_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError(_TWICE)
    return found


_WHITESPACE = re.compile(r"[ \t\n\r]*")


class TooManyItems(Exception):
    """A list named in ``json_object_body``'s limits holds more than its limit."""

    def __init__(self, key: str, limit: int) -> None:
        super().__init__(key, limit)
        self.key = key
        self.limit = limit


def json_object_body(raw: bytes, *, list_limits: Mapping[str, int]) -> Any:
    """Like ``json_body``, but a top-level object's lists named in ``list_limits`` are
    decoded one item at a time and refused (``TooManyItems``) as soon as they hold one item
    too many: a body of a million tiny items never builds them. A body that is not an object
    is parsed by ``json_body``."""
    text = _utf8_text(raw)
    start = _WHITESPACE.match(text, 0).end()  # type: ignore[union-attr]
    if text[start : start + 1] != "{":
        return _parsed(text)
    decoder = json.JSONDecoder(parse_constant=_refuse_constant, object_pairs_hook=_keys_once)

    def skip(at: int) -> int:
        return _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]

    def expect(at: int, chars: str) -> int:
        if text[at : at + 1] not in chars or at >= len(text):
            raise json.JSONDecodeError(f"Expecting one of {chars!r}", text, at)
        return at + 1

    payload: dict[str, Any] = {}
    try:
        at = skip(start + 1)
        if text[at : at + 1] == "}":
            at += 1
        else:
            while True:
                if text[at : at + 1] != '"':
                    raise json.JSONDecodeError("Expecting property name", text, at)
                key, at = decoder.raw_decode(text, at)
                if key in payload:
                    raise ValueError(_TWICE)
                at = skip(expect(skip(at), ":"))
                limit = list_limits.get(key)
                if limit is not None and text[at : at + 1] == "[":
                    items: list[Any] = []
                    at = skip(at + 1)
                    if text[at : at + 1] == "]":
                        at += 1
                    else:
                        while True:
                            if len(items) == limit:
                                raise TooManyItems(key, limit)
                            item, at = decoder.raw_decode(text, at)
                            items.append(item)
                            at = skip(at)
                            closing = text[at : at + 1]
                            at = skip(expect(at, ",]"))
                            if closing == "]":
                                break
                    payload[key] = items
                else:
                    payload[key], at = decoder.raw_decode(text, at)
                at = skip(at)
                closing = text[at : at + 1]
                at = skip(expect(at, ",}"))
                if closing == "}":
                    break
        if skip(at) != len(text):
            raise json.JSONDecodeError("Extra data", text, skip(at))
    except RecursionError:
        raise _invalid("The body is nested too deeply.") from None
    except ValueError as exc:
        raise _invalid(f"The body is not valid JSON: {exc}.") from None
    reason = unstorable_reason(payload)
    if reason:
        raise _invalid(f"The body cannot be stored: {reason}.")
    return payload


class JsonBodyParser(BaseParser):
    """DRF's parser for ``application/json`` bodies, by ``json_body``. Reads the stream
    itself: DRF's own JSONParser goes through ``request.body``, which Django caps at
    DATA_UPLOAD_MAX_MEMORY_SIZE."""

    media_type = "application/json"

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        return json_body(read_capped(stream))


def read_capped(stream: IO[Any]) -> bytes:
    """The body from ``stream``; 413 when it is over ``MAX_BODY_BYTES``."""
    raw: bytes = stream.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise Problem(
            status=413,
            code="payload_too_large",
            detail=f"The body is over {MAX_BODY_BYTES // (1024 * 1024)} MiB.",
        )
    return raw


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _invalid(detail: str) -> Problem:
    return Problem(
        status=400,
        code="validation_failed",
        detail=detail,
        errors={"non_field_errors": [detail]},
    )
