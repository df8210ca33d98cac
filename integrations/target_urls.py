"""Which URLs this process may call: absolute ``https://`` with a host and no
``user:password@`` part; plain ``http://`` only where private targets are allowed
(``DROPPORTAL_ALLOW_PRIVATE_TARGETS``: development and tests). The one home of that rule,
applied where staff set a URL (``validators``), where a call is made (``outbound_http``)
and where a DROP client is built; each words the refusal for its own reader. A base URL
(an ISI integration's, DROP's) also ends at its path (``url_has_extras``)::

    problem = target_url_problem(url, allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS)
    if problem is TargetUrlProblem.PLAIN_HTTP:
        ...
"""

from __future__ import annotations

import enum
import re
from urllib.parse import urlsplit


class TargetUrlProblem(enum.Enum):
    UNREADABLE = "not a URL"
    NOT_ABSOLUTE = "not an absolute http(s) URL with a host"
    PLAIN_HTTP = "plain http"
    # A user:password part is sent as Basic auth, and shown and logged wherever the URL is.
    CREDENTIALS = "a user name or password in the URL"


def target_url_schemes(*, allow_private: bool) -> tuple[str, ...]:
    return ("https", "http") if allow_private else ("https",)


def url_has_credentials(url: str) -> bool:
    """Whether ``url`` carries a ``user:password@`` part (an empty one too), one whose
    password holds "?", "#" or ";" among them (``https://u:p?w@host/``: the parser's host
    is ``u``, its port ``p``): an "@" before the first "/" of what follows ``://``, unless
    a host without a port comes first (``https://host?email=ann@x.com``)."""
    try:
        if "@" in urlsplit(url).netloc:
            return True
    except ValueError:
        return False
    head = url.partition("://")[2].split("/", 1)[0]
    authority = re.split(r"[?#;]", head, maxsplit=1)[0]
    return "@" in head and ":" in authority.rpartition("]")[2]


def url_has_extras(url: str) -> bool:
    """Whether ``url`` carries a query, a fragment or ``;`` parameters, even an empty one
    (``https://api.example/isi?``). A base URL, to which paths are appended, must not: the
    paths would land inside them (``/isi?tenant=7/api/v1/...``)."""
    return any(mark in url for mark in "?#;")


def target_url_problem(url: str, *, allow_private: bool) -> TargetUrlProblem | None:
    """Why ``url`` may not be called, the first problem found; None when it may be."""
    try:
        parts = urlsplit(url)
        has_host = bool(parts.hostname)
    except ValueError:
        return TargetUrlProblem.UNREADABLE
    if parts.scheme not in ("https", "http") or not has_host:
        return TargetUrlProblem.NOT_ABSOLUTE
    if parts.scheme not in target_url_schemes(allow_private=allow_private):
        return TargetUrlProblem.PLAIN_HTTP
    if url_has_credentials(url):
        return TargetUrlProblem.CREDENTIALS
    try:
        # Read only on access: a port past 65535 (or not a number) raises, as it would when
        # the call is made, rather than being stored and failing at every send. After the
        # credentials: in ``https://u:p?w@host/`` the parser's port is a password's start.
        parts.port  # noqa: B018
    except ValueError:
        return TargetUrlProblem.UNREADABLE
    return None
