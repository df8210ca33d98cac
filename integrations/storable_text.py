"""What PostgreSQL can store of a text: the one home of that rule.

Its ``text`` columns hold no NUL character, its ``jsonb`` no ``\\u0000``, and neither holds a
surrogate (a lone ``\\ud800``, which ``json.loads`` makes of an escape, cannot be written as
UTF-8). What we receive is refused when it holds one (``unstorable_reason``, for a body we
would keep verbatim); what we only keep a trace of, such as the answer to a call, has each
one replaced by U+FFFD (``storable``)::

    unstorable_reason({"email": [{"email": "ann\\x00"}]})  # 'a string holds a NUL character ...'
    storable("ok\\x00 binary")                             # 'ok\\ufffd binary'
"""

from __future__ import annotations

import re
from typing import Any

# Every character PostgreSQL's text and jsonb refuse. A Python string holds a surrogate only
# unpaired: json.loads joins an escaped pair into the one character it stands for.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"
_NUL = "a string holds a NUL character (\\u0000)"
_SURROGATE = "a string holds an unpaired surrogate (\\ud800 to \\udfff)"


def _text_problem(text: str) -> str | None:
    # On the delivery and import hot paths: a memchr and, for text that is not ASCII, one
    # encoding, both far quicker than a regular expression over every character.
    if "\x00" in text:
        return _NUL
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATE
    return None


def storable(text: str) -> str:
    """``text`` with every character PostgreSQL cannot store replaced by U+FFFD; ordinary
    text is returned as it is."""
    if _text_problem(text) is None:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


def unstorable_reason(value: Any) -> str | None:
    """Why a string in ``value`` (a parsed JSON value, keys included, or a single string)
    cannot be stored, or None."""
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
            problem = _text_problem(text) if isinstance(text, str) else None
            if problem is not None:
                return problem
    return None
