"""A credential echoed in an answer we keep or show, replaced by ``[redacted]``::

    text_redacted('{"error": "token Ab3\\/x= is not valid"}', ["Ab3/x="])
    # '{"error": "token [redacted] is not valid"}'

A leaf module: DROP's client and the brokers' transports both redact through it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"
# An OAuth error code as the registered ones are spelt (RFC 6749 section 5.2, and Authlib's
# own: "invalid_client", "bad_signature"); any other text in its place is not kept.
_OAUTH_ERROR_CODE = re.compile(r"[a-z_]{1,64}")


def text_redacted(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` that is set, as written or JSON-escaped in any of the
    ways encoders write it (``\\/``, ``\\u002B``), replaced by ``[redacted]``: a broker may echo
    a credential ("Bearer x is not valid"), and its answers are kept and shown, where a
    credential never is."""
    pattern = secrets_pattern(secrets)
    return text if pattern is None else pattern.sub(REDACTED, text)


def oauth_error_code(value: object) -> str | None:
    """``value`` when it is an OAuth error code (``invalid_client``), else None. The ``error``
    of an OAuth answer is the remote party's text: one may write there the credential it was
    sent ("invalid_client: client_secret x does not match"), which is never kept or shown,
    and a credential can be echoed in more forms than can be redacted."""
    return value if isinstance(value, str) and _OAUTH_ERROR_CODE.fullmatch(value) else None


def secrets_pattern(secrets: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern for every secret set, longest first (one inside another is not left half
    shown): each character but a letter or digit as itself, escaped with a backslash, or as
    a JSON ``\\uXXXX`` escape of any case."""
    alternatives = [
        "".join(ch if ch.isalnum() and ch.isascii() else _escaped_forms(ch) for ch in secret)
        for secret in sorted({s for s in secrets if s}, key=len, reverse=True)
    ]
    return re.compile("|".join(alternatives)) if alternatives else None


def _escaped_forms(ch: str) -> str:
    code = ord(ch)
    forms = [re.escape(ch), re.escape("\\" + ch)]
    if code <= 0xFFFF:
        forms.append(f"\\\\u(?i:{code:04x})")
    return "(?:" + "|".join(forms) + ")"
