"""Cutting from a URL what it carries beyond its place: a ``user:password@`` part, the query
and the fragment, where tokens and identifiers travel. For what is kept for good or sent out
of the process (ledger events, alert texts)::

    without_url_extras("410 Gone from HTTPS://u:p@crm.example/drop?token=s3cr3t at noon")
    # '410 Gone from https://crm.example/drop at noon'
    data_without_url_extras({"url": "https:\\/\\/crm.example\\/drop?email=ann%40x.com"})
    # {'url': 'https://crm.example/drop'}

Each URL found is parsed (``urllib.parse.urlsplit``) and rebuilt from its scheme, host, port
and path only. Found in any case and however its ``://`` is written: plainly, with JSON's
escaped slashes (``\\/``) or percent-encoded (``%3A%2F%2F``, a URL inside another's text),
each unescaped before it is parsed.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

# A scheme, then "://" in one of its spellings, then everything up to white space or a
# character that ends a URL in text (a quote, an angle bracket).
_URL = re.compile(r"(?i)(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*(?::|%3a)(?:/|\\/|%2f){2}[^\s\"'<>`]*")
_SEPARATOR_ENCODED = re.compile(r"(?i)^[a-z][a-z0-9+.\-]*%3a")


def _cut(found: re.Match[str]) -> str:
    text = found.group(0)
    kept = text.rstrip("\\")  # an escaped quote's backslash belongs to the text around
    trailing = text[len(kept) :]
    url = kept.replace("\\/", "/")
    if _SEPARATOR_ENCODED.match(url):
        url = unquote(url)
    try:
        parts = urlsplit(url)
    except ValueError:  # an unparsable authority ("[::1"): keep no part of it but the scheme
        scheme = url.partition(":")[0].lower()
        return f"{scheme}://(unparsable URL){trailing}"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme.lower(), host, parts.path, "", "")) + trailing


def without_url_extras(text: str) -> str:
    """``text`` with every URL in it cut to its scheme, host, port and path."""
    return _URL.sub(_cut, text)


def data_without_url_extras(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string, keys included,
    passed through ``without_url_extras``."""
    if isinstance(value, str):
        return without_url_extras(value)
    if isinstance(value, dict):
        return {
            (without_url_extras(key) if isinstance(key, str) else key): data_without_url_extras(
                item
            )
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [data_without_url_extras(item) for item in value]
    return value
