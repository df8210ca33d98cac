"""Cutting from a URL what it carries beyond its place: a ``user:password@`` part, ``;``
parameters, the query and the fragment, where tokens and identifiers travel. For what is
kept for good or sent out of the process (ledger events, alert texts)::

    without_url_extras("410 Gone from HTTPS://u:p@crm.example/drop?token=s3cr3t at noon")
    # '410 Gone from https://crm.example/drop at noon'
    data_without_url_extras({"url": "https:\\/\\/crm.example\\/drop?email=ann%40x.com"})
    # {'url': 'https://crm.example/drop'}

Each URL found is rebuilt from its scheme, host, port and path only. Found in any case and
however its ``://`` is written: plainly, with JSON's escaped slashes (``\\/``) or
percent-encoded (``%3A%2F%2F``, a URL inside another's text), each unescaped before it is
read. Read for safety rather than by the letter of RFC 3986:

- the path ends at a query, fragment or ``;`` parameter however it is spelt, percent-encoded
  once or more (``%3F``, ``%253F``), and at an "=" or "&" (a query spelt inside a path);
- a password may hold "?", "#", ";", "/" or "@" unescaped: what comes before the host goes,
  whatever it holds (``https://u:p?w@host/`` keeps ``https://host/``);
- a query's value may hold a space: the words after a query that carry "=" or "&" are
  its own, and a value of its own that starts with a URL (a field of an event:
  ``data_without_url_extras``) is that URL to the end of its line.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

# A scheme, then "://" in one of its spellings, then everything up to white space or a
# character that ends a URL in text (a quote, an angle bracket).
_URL = re.compile(r"(?i)(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*(?::|%3a)(?:/|\\/|%2f){2}[^\s\"'<>`]*")
# A query's value may hold a space: the words after a query that carry "=" or "&" are its.
_QUERY_WORDS = re.compile(r"(?: [^\s\"'<>`]*[=&][^\s\"'<>`]*)+")
_TO_LINE_END = re.compile(r"[^\n]*")
_PLAIN_SCHEME = re.compile(r"(?i)^[a-z][a-z0-9+.\-]*://")
# Where a host and port end: a path, a query, a fragment or a ';' parameter.
_AUTHORITY_END = re.compile(r"[/?#;]")
# A host (a name, an IPv4 address or a bracketed IPv6 one) and an optional port.
_HOST_PORT = re.compile(r"^(?:[\w.\-~%!$]*|\[[0-9a-fA-F:.]+(?:%25[\w.\-~]+)?\])(?::\d*)?$")
# Where a kept path ends: a query, a fragment or a ';' parameter, plainly or percent-encoded
# (once or more: "%3F", "%253F"), and "=" or "&" that spell a query inside a path.
_PATH_END = re.compile(r"(?i)[?#;=&]|%(?:25)*(?:3f|23|3b|3d|26)")
# Which of a query's values an answer kept must not echo (``url_extras_sent``): one whose
# name says it is a credential; under any other name, one shaped like a password or a token
# (8 characters or more, a digit or a sign among them: "hunter22", "5f2a91c0d3e7"), or long.
# A word ("json", "true", "descending") or a short value is left: taking each of its
# occurrences out of an answer would leave nothing to read, and it would be guessed anyway.
_CREDENTIAL_NAME = re.compile(
    r"(?i)token|key|secret|sig|code|auth|pass|pwd|^pw$|pin|cred|session|jwt"
)
_CREDENTIAL_REDACTED_FROM = 4
_MIXED_REDACTED_FROM = 8
_VALUE_REDACTED_FROM = 16


def _host_and_tail(rest: str) -> tuple[str, str] | None:
    """``rest`` (what follows ``://``) as its host and port, and what follows them; None
    when no host can be told apart from a ``user:password@`` part.

    A password may hold "?", "#", ";", "/" or "@" unescaped, so the part before the first
    "/" loses everything up to its last "@" (unless a plain host without a port comes first:
    then the "@" is its query's, ``h?email=ann@x.com``); and a host that is not a host
    (``u:p`` of ``u:p/ss@h``) gives way to the first "@" followed by one."""
    head = rest.split("/", 1)[0]
    authority = re.split(r"[?#;]", head, maxsplit=1)[0]
    plain_host = ":" not in authority.rpartition("]")[2] and bool(_HOST_PORT.match(authority))
    if "@" in head and not ("@" not in authority and plain_host):
        rest = rest[head.rindex("@") + 1 :]
    found = _AUTHORITY_END.search(rest)
    host, tail = (rest[: found.start()], rest[found.start() :]) if found else (rest, "")
    if _HOST_PORT.match(host):
        return host, tail
    for at in re.finditer("@", rest):
        after = rest[at.end() :]
        found = _AUTHORITY_END.search(after)
        host, tail = (after[: found.start()], after[found.start() :]) if found else (after, "")
        if host and _HOST_PORT.match(host):
            return host, tail
    return None


def _cut_url(url: str) -> str:
    """One URL cut to its scheme, host, port and path."""
    url = url.replace("\\/", "/")
    if not _PLAIN_SCHEME.match(url):  # "https%3A%2F%2F...", "https:%2F%2F...": a URL's text
        url = unquote(url)
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    split = _host_and_tail(rest)
    if split is None:
        return f"{scheme}://(unparsable URL)"
    host, tail = split
    path = tail if tail.startswith("/") else ""
    found = _PATH_END.search(path)
    return f"{scheme}://{host}{path[: found.start()] if found else path}"


def without_url_extras(text: str, *, value: bool = False) -> str:
    """``text`` with every URL in it cut to its scheme, host, port and path. ``value``: the
    text is a value of its own (a field of an event), so when it starts with a URL that has
    a query, that query runs to the end of its line, whatever spaces it holds."""
    if ":" not in text and "%" not in text:
        # No "://" in any spelling (each has ":" or "%3a"): no URL, as most keys and values.
        return text
    kept: list[str] = []
    done = 0
    for found in _URL.finditer(text):
        if found.start() < done:  # within the query words of the URL before
            continue
        url, end = found.group(0), found.end()
        if "?" in url or "%3f" in url.lower():
            more = (
                _TO_LINE_END.match(text, end)
                if value and found.start() == 0
                else _QUERY_WORDS.match(text, end)
            )
            if more:
                url, end = url + more.group(0), more.end()
        cut = url.rstrip("\\")  # an escaped quote's backslash belongs to the text around
        kept += [text[done : found.start()], _cut_url(cut), url[len(cut) :]]
        done = end
    kept.append(text[done:])
    return "".join(kept)


def query_value_is_secret(name: str, value: str) -> bool:
    """Whether a query's ``value`` may be a credential: 4 characters or more under a name
    that says so (``token``, ``api_key``, ``sig``, ``code``, ``password``, ``pin``, in any
    case); under any other, 8 or more with a digit or a sign among them, or 16 or more
    (``?format=json`` is not one, ``?p=Summer2026!`` is)."""
    if _CREDENTIAL_NAME.search(name):
        return len(value) >= _CREDENTIAL_REDACTED_FROM
    if len(value) >= _VALUE_REDACTED_FROM:
        return True
    return len(value) >= _MIXED_REDACTED_FROM and not value.isalpha()


def url_extras_sent(url: str) -> list[str]:
    """What ``without_url_extras`` cuts from ``url`` that may be a credential, in the forms
    an answer may echo it: a password, each query value that may be one
    (``query_value_is_secret``) as written and decoded, and then the query as written. An
    answer that quotes the path it was asked ("Cannot POST /hook?code=T") names no URL for
    ``without_url_extras`` to find: these are redacted from it first."""
    parts = urlsplit(url)
    password = parts.password or ""
    sent = [password, unquote(password)]
    for pair in parts.query.split("&"):
        name, _, value = pair.partition("=")
        sent += [value] if query_value_is_secret(unquote(name), value) else []
    sent += [
        value
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if query_value_is_secret(name, value)
    ]
    if any(sent[2:]):
        sent.append(parts.query)
    return [value for value in sent if len(value) >= _CREDENTIAL_REDACTED_FROM]


def data_without_url_extras(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string, keys included,
    passed through ``without_url_extras``."""
    if isinstance(value, str):
        return without_url_extras(value, value=True)
    if isinstance(value, dict):
        return {
            (
                without_url_extras(key, value=True) if isinstance(key, str) else key
            ): data_without_url_extras(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [data_without_url_extras(item) for item in value]
    return value
