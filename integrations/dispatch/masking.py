"""What is kept of an answer that may carry clear identifiers: its shape, never its text.

Every string and every number becomes its length (a phone, a ZIP code or a date of birth may
come as a number), and so does every object key that is not a name of ours:
a broker may key an answer by the identifier itself (``{"alice@example.com": true}``). Ours
are the protocol's field names, DROP's identifier types and the categories staff set on the
broker's SaaS connections (lower-case words, checked when set)::

    masked(b'{"identifiers": {"email": [{"email": "ann@x.com"}]}, "ann@x.com": true}')
    # '{"identifiers": {"email": [{"email": "<9 characters>"}]}, "<key of 9 characters>": true}'
    masked(b'{"phone": 14155551234, "zip": 94107.0}')
    # '{"phone": "<number of 11 characters>", "zip": "<number of 7 characters>"}'
    category_counts({"email": [{...}], "ann@x.com": [{...}]}, categories=["email"])
    # {"email": 1, "<key of 9 characters>": 1}

A broker's free text (an outcome's ``error_message``, a resolution's ``exemption_basis``) is
kept, so it is read rather than replaced: what looks like an identifier is masked
(``free_text_masked``), the rest kept as sent::

    free_text_masked("cannot delete Ann.Smith@Example.com: record locked", limit=2000)
    # 'cannot delete <email>: record locked'
"""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping
from typing import Any

from integrations.models import DeletionRequest, ResolutionRequest, SaasDeletion
from integrations.month_names import MONTHS
from integrations.outbound_http import RESPONSE_BODY_LIMIT
from integrations.url_extras import without_url_extras

# Field names of the answers and errors the broker's systems and SaaS APIs send (ISI,
# OAuth, RFC 9457), and DROP's identifier types: kept as they are.
PROTOCOL_NAMES = frozenset(
    {
        "identifiers",
        "request_uuid",
        "results_token",
        "status",
        "error",
        "error_description",
        "errors",
        "detail",
        "title",
        "type",
        "code",
        "message",
    }
)
IDENTIFIER_TYPES = frozenset(
    {"email", "phone", "first_name", "last_name", "dob", "zip", "vin", "maid", "ctvid"}
)


def _names(categories: Iterable[str]) -> frozenset[str]:
    return PROTOCOL_NAMES | IDENTIFIER_TYPES | frozenset(categories)


def masked_key(key: str, names: Collection[str], taken: Collection[str] = ()) -> str:
    """``key`` when it is one of ``names``, else its length (numbered past the first of a
    length, so that no two keys of one object merge)."""
    if key in names:
        return key
    shown = f"<key of {len(key)} characters>"
    number = 1
    while shown in taken:
        number += 1
        shown = f"<key of {len(key)} characters> #{number}"
    return shown


def _mask(value: Any, names: frozenset[str]) -> Any:
    if isinstance(value, str):
        return f"<{len(value)} characters>"
    if isinstance(value, dict):
        shape: dict[str, Any] = {}
        for key, item in value.items():
            shape[masked_key(key, names, shape)] = _mask(item, names)
        return shape
    if isinstance(value, list):
        return [_mask(item, names) for item in value]
    if isinstance(value, bool) or value is None:  # a bool is an int to Python
        return value
    # A number, by the length JSON writes it in (json.loads gives only int and float here).
    return f"<number of {len(json.dumps(value))} characters>"


def masked(content: bytes, *, categories: Iterable[str] = ()) -> str:
    """What an attempt keeps of an answer carrying clear identifiers: its shape, every string,
    number and key not of ours replaced by its length (the values themselves are kept only
    encrypted, and not for long). ``categories``: the identifier categories asked for."""
    try:
        shape = json.dumps(_mask(json.loads(content), _names(categories)), ensure_ascii=False)
    except ValueError:
        return f"[not kept: {len(content)} bytes, not JSON]"
    except RecursionError:  # on a sending thread: it would undo the whole batch
        return f"[not kept: {len(content)} bytes, nested too deeply]"
    return shape[:RESPONSE_BODY_LIMIT]


def category_counts(identifiers: Mapping[str, Any], *, categories: Iterable[str]) -> dict[str, int]:
    """How many identifiers the broker resolved per category, for the ledger: a category
    that is not of ours is shown by its length."""
    names = _names(categories)
    counts: dict[str, int] = {}
    for category, entries in identifiers.items():
        counts[masked_key(category, names, counts)] = len(entries)
    return counts


# What in a broker's free text looks like a clear identifier, each found only where a word
# starts (so a search never restarts inside one: linear time on any text). Names, a ZIP code
# alone and a number shorter than a phone's cannot be told from the rest of a message: those
# the broker guide asks brokers not to write.
# Longest first: "june" is tried before "jun", not cut to it.
_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_GAP = (
    r"\s{1,3}"  # any white space (a tab, a line break, a no-break space): the standardizer folds it
)
_ORDINAL = r"(?:st|nd|rd|th)?"  # July 4th, 1985
# A date, as a date of birth is written: 1985-07-04 (a time after a "T" part of it, as an
# ISO date-time serializes a date: 1985-07-04T00:00:00.000Z, 1985-07-04T0000Z), 07/04/1985,
# 4.7.85, or with its month's name, as the standardizer reads it and as people write it:
# July 4, 1985, July 4th 1985, 4 Jul 1985, 4th of July 1985, 04-Jul-85. Every part of
# bounded length: no search backtracks far. Without bounds: the admin search reads it
# inside a word too (selectors/search_terms.py).
DATE = (
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
    rf"|(?P<date>(?<![\w/.-]){DATE}(?![\w/-]|\.\d))"
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


def _identifier_masked(found: re.Match[str], own: Container[str] = frozenset()) -> str:
    kind = found.lastgroup
    text = found.group()
    if kind == "ip" or (kind == "maid" and text.replace("-", "").lower() in own):
        return text
    if kind == "number" and sum(c.isdigit() for c in text) < _NUMBER_DIGITS:
        return text
    return f"<{kind}>"


def _identifiers_found(text: str, own: Container[str]) -> Iterator[tuple[re.Match[str], str]]:
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


def _identifiers_masked(text: str, own: Container[str]) -> str:
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


def identifiers_in(text: str) -> set[str]:
    """The kinds of identifier ``free_text_masked`` would mask in ``text`` (``email``,
    ``number``, ``date``, ``vin``, ``maid``), no UUID being the row's own."""
    return {
        found.lastgroup or ""
        for found, shown in _identifiers_found(_readable(text), frozenset())
        if shown != found.group()
    }


OwnUuids = Iterable[uuid.UUID | str] | Callable[[], Iterable[uuid.UUID | str]]


class _Own:
    """The row's own UUIDs (``own_uuids``), as hex digits in lower case, read when a UUID is
    first found: given as a callable (``row_own_uuids`` of a callback's row, read in part),
    reading them may take a query, which a text holding no UUID, most, never needs."""

    def __init__(self, own_uuids: OwnUuids) -> None:
        self._given = own_uuids
        self._own: frozenset[str] | None = None

    def __contains__(self, text: object) -> bool:
        if self._own is None:
            given = self._given() if callable(self._given) else self._given
            self._own = frozenset(str(u).replace("-", "").lower() for u in given)
        return text in self._own


def free_text_masked(text: str, *, limit: int, own_uuids: OwnUuids = ()) -> str:
    """A broker's free text as it is kept (on its row and in the ledger, for good): every
    email, phone or other long number, date, VIN and mobile advertising ID in it replaced by
    ``<email>``, ``<number>``, ``<date>``, ``<vin>``, ``<maid>``; then cut to ``limit``
    characters. The whole text is read (a callback's body, an answer kept, both bounded, in
    linear time): cut first, an identifier across the cut would be kept in part.

    ``own_uuids``: the UUIDs the service issued for the row the text is kept on
    (``row_own_uuids``, or a callable giving them), kept as written, in any case; every
    other UUID may be a consumer's advertising ID and is masked. The text is kept as it is
    read (``_readable``)."""
    own = _Own(own_uuids)
    # A URL's query and credentials first (what the ledger cuts anyway): read as free text,
    # "case?email=ann%40x.com" would be one email, the path before it lost.
    readable = without_url_extras(_readable(text))
    return _identifiers_masked(readable, own)[:limit]


def row_own_uuids(row: DeletionRequest | ResolutionRequest | SaasDeletion) -> tuple[uuid.UUID, ...]:
    """The UUIDs the service issued for ``row``, which the free text kept on it (a callback's,
    an answer's, a failure's) keeps readable (``own_uuids``): its ``request_uuid`` and
    ``webhook_request_id``, both sent to the broker, and the uuid of the ISI connection it
    goes to, in the path it is sent to; a SaaS deletion's, its resolution's
    ``request_uuid``, which it sends. Migration 0068 keeps the same, read from the columns."""
    if isinstance(row, SaasDeletion):
        return (row.resolution.request_uuid,)
    own = [row.request_uuid, row.webhook_request_id]
    if row.isi_connection_id is not None and row.isi_connection is not None:
        own.append(row.isi_connection.uuid)
    return tuple(own)
