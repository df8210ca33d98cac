"""Mask again the free text kept before the masking, or before its rules of today.

A broker's free text (a callback's ``error_message`` and ``exemption_basis``, an answer kept
on a delivery attempt, a failure's text on a request) has been masked as it is kept since
the masking came in (``integrations/dispatch/masking.py``), and its rules grew since (an
advertising ID written as a request UUID, phones with slashes, ordinal dates, emails with
invisible characters). Rows kept before either are still shown as they were: this applies
the rules of this release to them, a row's own UUIDs kept as the services keep them. A
cancelled row's ``last_error`` is left as it is: it is the reason staff or the service
wrote, which the services never mask, and as its ledger event has it.

Not atomic, as 0065: the old release still serves while ``migrate`` runs, and one
transaction over every attempt would hold its rows' locks for the whole run. The rows are
read in primary-key order, a batch at a time, each batch written in a transaction of its
own; a text is written back only where masking changes it, and only if it is still the
text read (a delivery or a callback may have written the row meanwhile). Stopped midway,
it runs again from the start: masked text masks to itself.

The ledger is append-only (PostgreSQL refuses UPDATE on it): events recorded before keep
their text.

The masking is a frozen copy of this release's (``integrations/dispatch/masking.py`` and
``integrations/url_extras.py``), as Django advises for a data migration: imported, a later
change to the masker would change what this migration did, or break it.
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote

from django.db import migrations, transaction

BATCH = 1000

# -- the masking of this release, frozen ----------------------------------------------------

# integrations/url_extras.py: a URL cut to its scheme, host, port and path.
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


# integrations/dispatch/masking.py: a broker's free text masked.
_MONTHS = (
    "january", "jan", "february", "feb", "march", "mar", "april", "apr", "may", "june", "jun",
    "july", "jul", "august", "aug", "september", "sep", "sept", "october", "oct", "november",
    "nov", "december", "dec",
)  # fmt: skip

# What in a broker's free text looks like a clear identifier, each found only where a word
# starts (so a search never restarts inside one: linear time on any text). Names, a ZIP code
# alone and a number shorter than a phone's cannot be told from the rest of a message: those
# the broker guide asks brokers not to write.
# Longest first: "june" is tried before "jun", not cut to it.
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_GAP = (
    r"\s{1,3}"  # any white space (a tab, a line break, a no-break space): the standardizer folds it
)
_ORDINAL = r"(?:st|nd|rd|th)?"  # July 4th, 1985
# A date, as a date of birth is written: 1985-07-04 (a time after a "T" part of it, as an
# ISO date-time serializes a date: 1985-07-04T00:00:00.000Z, 1985-07-04T0000Z), 07/04/1985,
# 4.7.85, or with its month's name, as the standardizer reads it and as people write it:
# July 4, 1985, July 4th 1985, 4 Jul 1985, 4th of July 1985, 04-Jul-85. Every part of
# bounded length: no search backtracks far.
_DATE = (
    r"(?:\d{4}[-/.]\d{1,2}[-/.]\d{1,2}(?:T[\d:.,]{1,24}(?:Z|[+-][\d:]{1,5})?)?"
    r"|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}"
    rf"|(?:{_MONTH})\.?(?:{_GAP})?\d{{1,2}}{_ORDINAL}(?:,(?:{_GAP})?|{_GAP})\d{{4}}"
    rf"|\d{{1,2}}{_ORDINAL}{_GAP}(?:of{_GAP})?(?:{_MONTH})\.?,?{_GAP}\d{{4}}"
    rf"|\d{{1,2}}-(?:{_MONTH})-(?:\d{{4}}|\d{{2}}))"
)
_DASHED_ID = r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"  # a UUID's form, a MAID's
_FREE_TEXT_IDENTIFIER = re.compile(
    # An email, its "@" plain or percent-encoded; the domain may lack a dot (user@localhost).
    # Its local part is read without "/", which RFC 5322 allows but a URL's path ends with:
    # an email at the end of a path is masked alone, the path kept.
    r"(?P<email>(?<![\w.!#$%&*+=?^{|}~-])[\w.!#$%&*+=?^{|}~-]+(?:@|%40)[\w-]+(?:\.[\w-]+)*)"
    rf"|(?P<date>(?<![\w/.-]){_DATE}(?![\w/-]|\.\d))"
    # A VIN: 17 letters and digits (no I, O or Q), at least one a digit.
    r"|(?P<vin>(?<![\w-])(?=[a-z]*\d)[a-hj-npr-z0-9]{17}(?![\w-]))"
    # A mobile advertising ID: 32 hex digits, with a UUID's dashes or none, in any case
    # (Google's are written as our request UUIDs are). A UUID is kept only when it is one
    # the service issued for the row the text is kept on (``own_uuids``).
    rf"|(?P<maid>(?<![\w-])(?:{_DASHED_ID}|[0-9a-f]{{32}})(?![\w-]))"
    # An IPv4 address (a refused target's, in a failure's text): kept, not read as a number.
    r"|(?P<ip>(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\w.]|\.\d))"
    # A phone number, or any long number (an account's, a social security number): digits,
    # with spaces, dots, dashes, slashes or brackets between them (415/555/1234,
    # 415 - 555 - 1234), 7 digits or more (counted when found). Not an ID's first digits
    # after a bracket: "(38400000-8cf0-..." is the ID, read from its first digit.
    rf"|(?P<number>(?<![\w+])\+?\(?(?!{_DASHED_ID}(?![\w-]))\d(?:[ .()/-]{{0,3}}\d)+(?!\w))",
    re.IGNORECASE,
)
_NUMBER_DIGITS = 7
# The same, tried where a mask was just put: each lookbehind above reads the character
# before, which masked text turns into a ">" that none of them refuses. Tried only there
# (and at each such place once), the search stays linear; without it "a@x.com&alt=b@y.com"
# would keep its second email in clear, found only when masked again.
_AFTER_MASK, _LOOKBEHINDS = re.subn(r"\(\?<!\[[^\]]*\]\)", "", _FREE_TEXT_IDENTIFIER.pattern)
assert _LOOKBEHINDS == 6, "one lookbehind per kind of identifier"
_FREE_TEXT_IDENTIFIER_AFTER_MASK = re.compile(_AFTER_MASK, re.IGNORECASE)


def _identifier_masked(found: re.Match[str], own: frozenset[str] = frozenset()) -> str:
    kind = found.lastgroup
    text = found.group()
    if kind == "ip" or (kind == "maid" and text.replace("-", "").lower() in own):
        return text
    if kind == "number" and sum(c.isdigit() for c in text) < _NUMBER_DIGITS:
        return text
    return f"<{kind}>"


def _identifiers_found(text: str, own: frozenset[str]) -> Iterator[tuple[re.Match[str], str]]:
    """Each identifier in ``text`` and what is kept of it, found as masking the text again
    would find them: where a mask was put, the text after it is read as it will be read
    then (``_FREE_TEXT_IDENTIFIER_AFTER_MASK``), so that masked text masks to itself."""
    done = 0
    after_mask = False
    while True:
        found = (
            _FREE_TEXT_IDENTIFIER_AFTER_MASK.match(text, done) if after_mask else None
        ) or _FREE_TEXT_IDENTIFIER.search(text, done)
        if found is None:
            return
        shown = _identifier_masked(found, own)
        yield found, shown
        done = found.end()
        after_mask = shown != found.group()


def _identifiers_masked(text: str, own: frozenset[str]) -> str:
    kept: list[str] = []
    done = 0
    for found, shown in _identifiers_found(text, own):
        kept += [text[done : found.start()], shown]
        done = found.end()
    kept.append(text[done:])
    return "".join(kept)


def _readable(text: str) -> str:
    """``text`` as it is read and kept: what shows nothing taken out (a zero-width space or
    joiner, a soft hyphen, a direction mark: Unicode's format characters) and compatibility
    forms folded (NFKC: a full-width "＠" is an "@", a full-width digit a digit), so that an
    identifier cannot hide from the patterns above by how it is spelt."""
    if text.isascii():  # nothing to take out or fold: most texts, read at no cost
        return text
    shown = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return unicodedata.normalize("NFKC", shown)


def free_text_masked(text: str, *, limit: int, own_uuids: Iterable[uuid.UUID | str] = ()) -> str:
    """A broker's free text as it is kept (on its row and in the ledger, for good): every
    email, phone or other long number, date, VIN and mobile advertising ID in it replaced by
    ``<email>``, ``<number>``, ``<date>``, ``<vin>``, ``<maid>``; then cut to ``limit``
    characters. The whole text is read (a callback's body, an answer kept, both bounded, in
    linear time): cut first, an identifier across the cut would be kept in part.

    ``own_uuids``: the UUIDs the service issued for the row the text is kept on (its
    ``request_uuid``), kept as written, in any case; every other UUID may be a consumer's
    advertising ID and is masked. The text is kept as it is read (``_readable``)."""
    own = frozenset(str(u).replace("-", "").lower() for u in own_uuids)
    # A URL's query and credentials first (what the ledger cuts anyway): read as free text,
    # "case?email=ann%40x.com" would be one email, the path before it lost.
    readable = without_url_extras(_readable(text))
    return _identifiers_masked(readable, own)[:limit]


# -- the rows -------------------------------------------------------------------------------

_UNBOUNDED = 2**31  # a column of no length of its own: cut nowhere

# Each model's columns of free text, the length each is kept to, and the columns holding
# the UUIDs issued for the row (None where a join finds no row): those the services keep in
# its text (``masking.row_own_uuids``: a request's ``request_uuid``, ``webhook_request_id``
# and ISI connection's uuid; a SaaS deletion's resolution's ``request_uuid``; an attempt's,
# its row's).
_REQUEST_UUIDS = ("request_uuid", "webhook_request_id", "isi_connection__uuid")
_TABLES: tuple[tuple[str, dict[str, int], tuple[str, ...]], ...] = (
    (
        "DeletionRequest",
        {"error_message": 2000, "last_error": _UNBOUNDED},
        _REQUEST_UUIDS,
    ),
    (
        "ResolutionRequest",
        {"exemption_basis": 100, "last_error": _UNBOUNDED},
        _REQUEST_UUIDS,
    ),
    ("SaasDeletion", {"last_error": _UNBOUNDED}, ("resolution__request_uuid",)),
    (
        "DeliveryAttempt",
        {"response_body": 4096, "error": _UNBOUNDED},
        (
            *(f"deletion_request__{column}" for column in _REQUEST_UUIDS),
            *(f"resolution_request__{column}" for column in _REQUEST_UUIDS),
            "saas_deletion__resolution__request_uuid",
        ),
    ),
)
# A cancelled row's ``last_error`` is why it was cancelled, written by staff or the service
# (a target retired, a work item DROP removed), never a delivery's failure: its words and
# numbers (a date, a ticket's) are kept as written, as its ledger event has them.
_CANCELLED = "cancelled"
_STAFF_WRITTEN = "last_error"


def _mask_table(model: Any, columns: dict[str, int], uuid_columns: tuple[str, ...]) -> int:
    """Mask ``columns`` of ``model``'s rows, a batch at a time: how many texts changed."""
    changed = 0
    last = 0
    has_state = any(field.name == "state" for field in model._meta.get_fields())
    state_columns = ("state",) if has_state else ()
    while True:
        rows = list(
            model.objects.filter(pk__gt=last)
            .order_by("pk")
            .values_list("pk", *state_columns, *columns, *uuid_columns)[:BATCH]
        )
        if not rows:
            return changed
        last = rows[-1][0]
        with transaction.atomic():
            for pk, *values in rows:
                state = values.pop(0) if has_state else None
                texts, uuids = values[: len(columns)], values[len(columns) :]
                own = [u for u in uuids if u is not None]
                for (column, limit), text in zip(columns.items(), texts, strict=True):
                    if column == _STAFF_WRITTEN and state == _CANCELLED:
                        continue
                    masked = free_text_masked(text, limit=limit, own_uuids=own)
                    if masked != text:
                        # Only if still as read: a later write is the service's, masked.
                        changed += (
                            model.objects.filter(pk=pk, **{column: text})
                            .update(**{column: masked})
                        )  # fmt: skip


def free_text_masked_again(apps: Any, schema_editor: Any) -> None:
    for name, columns, uuid_columns in _TABLES:
        _mask_table(apps.get_model("integrations", name), columns, uuid_columns)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("integrations", "0067_stored_body_fields_and_first_report_filled"),
    ]

    operations = [
        # Masked text cannot be unmasked: going back leaves it masked.
        migrations.RunPython(free_text_masked_again, migrations.RunPython.noop, elidable=True),
    ]
