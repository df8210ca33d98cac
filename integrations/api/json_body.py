"""What the API accepts as a JSON request body: the one place that decides it.

Every JSON body (the consumer registration through DRF's parser, the signed callbacks
from their raw bytes) is read here::

    payload = json_body(raw)      # raises Problem: 400 validation_failed, 413

A body is accepted when it is UTF-8 JSON (RFC 8259; no ``NaN`` or ``Infinity``), nested no
deeper than Python's parser can follow, and every string in it can be stored: no NUL
character (PostgreSQL's text cannot hold one) and no unpaired surrogate (a lone ``\\ud800``
escape decodes to a string that cannot be written back as UTF-8). Anything else is a 400
naming the reason, never a 500 further down.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from rest_framework.parsers import BaseParser

from integrations.api.errors import Problem

# The largest body the API reads (the consumer registration's 10,000 consumers with several
# identifiers each are a few MB). Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) would refuse
# a full registration, so JSON bodies are read here instead, against this cap.
MAX_BODY_BYTES = 32 * 1024 * 1024


def json_body(raw: bytes) -> Any:
    """``raw`` parsed, or ``Problem`` 400 ``validation_failed`` saying why not."""
    try:
        payload = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise _invalid("The body is nested too deeply.") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise _invalid(f"The body is not valid JSON: {exc}.") from None
    reason = unstorable_reason(payload)
    if reason:
        raise _invalid(f"The body cannot be stored: {reason}.")
    return payload


def unstorable_reason(value: Any) -> str | None:
    """Why a string in ``value`` (a parsed JSON value, or a path parameter) cannot be
    stored, or None."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            strings: Any = (item,)
        elif isinstance(item, dict):
            strings = item.keys()
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
            continue
        else:
            continue
        for text in strings:
            if "\x00" in text:
                return "a string holds a NUL character (\\u0000)"
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return "a string holds an unpaired surrogate (\\ud800 to \\udfff)"
    return None


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
        raw = stream.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            raise Problem(
                status=413,
                code="payload_too_large",
                detail=f"The body is over {MAX_BODY_BYTES // (1024 * 1024)} MiB.",
            )
        return json_body(raw)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _invalid(detail: str) -> Problem:
    return Problem(
        status=400,
        code="validation_failed",
        detail=detail,
        errors={"non_field_errors": [detail]},
    )
