"""What an admin list's search may put in its URL, and so in the web server's access log
and a Referer: one of the list's own ids as typed, a clear email or phone as its DROP hash,
nothing else (a name, a date of birth, a ZIP code, a VIN, words)::

    search_token(" Consumer.0113@Example.com ")  # its hash
    search_token("WIEMAIL00113")                 # a work item id, as typed
    search_token("Smith,Ann,1985-07-04,91790")   # None: refused, never sent

The ids every list may be searched by:

- a UUID in lower case with dashes, a DROP hash (44 characters of Base64), a hex digest (a
  file's SHA-256, a ``results_token``), an API key's prefix (``dpk_…``); 32 hex digits
  otherwise (upper case, no dashes) read as a mobile advertising ID and are not sent;
- a work item id (12 ASCII letters and digits) and a broker id (4 digits); twelve letters
  alone pass but as a name is typed (``Christiansen``, ``christiansen``): a random id is
  written so about once in twenty thousand; in capitals they pass (test data's
  ``AAAAAAAAAAAC``; a name is seldom typed so);
- a pointer (a broker's ``remote_identifier``, a DROP session id): one word of ASCII letters,
  digits and ``- _ . : / #`` holding a digit, neither a number of 5 digits or more (a ZIP
  code; from 7 a phone, hashed) nor holding what reads as a date (even inside a word:
  ``born1985-07-04``), a VIN or an email.

A list searched by names of its own (brokers, integrations, providers, files, staff) takes
``named_search_token`` (the admin site lists them); the ledger adds its kinds and actors
(``ledger_search_token``). The admin site applies ``search_token`` to every other list.
"""

from __future__ import annotations

import re

from integrations.dispatch import masking
from integrations.ledger_kinds import LedgerKind
from integrations.selectors.work_item_search import clear_identifier_hash

_IDS = re.compile(
    # A UUID as ours are written (in lower case, with dashes): 32 hex digits otherwise read
    # as a mobile advertising ID, as the free-text masking reads them.
    r"(?-i:[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})"
    r"|[A-Za-z0-9+/]{43}="  # a DROP hash
    r"|[0-9a-f]{64,128}"  # a hex digest (a file's SHA-256), a results_token
    r"|dpk_[A-Za-z0-9_-]{1,32}"  # an API key's prefix
    r"|(?-i:(?![a-z]{12}|[A-Z][a-z]{11}))[A-Za-z0-9]{12}"  # a work item id, not a name
    r"|\d{1,4}",  # a broker id, a DROP session id
    re.IGNORECASE,
)
_POINTER = re.compile(r"[A-Za-z0-9\-_.:/#]{1,255}")
_ZIP_OR_LONGER = re.compile(r"\d{5,}")
# A date anywhere in a pointer, as the free-text masking reads one (there, only between
# words): "ref4-Jul-1985" too.
_DATE_INSIDE = re.compile(masking.DATE, re.IGNORECASE)
# What the ledger names who acted by (services/ledger.py, admin/actors.py, the command line,
# the API's keys, DROP's notifications): a staff member's or an OS user's name is not a
# consumer's.
_ACTOR = re.compile(
    r"system(?::[a-z0-9-]{1,64})?"
    r"|(?:staff|oidc|cli):[!-~]{1,150}"
    r"|cli:uid \d{1,10}"
    r"|apikey:dpk_[A-Za-z0-9_-]{1,32}"
    r"|drop:notification"
)
_LEDGER_KINDS = frozenset(LedgerKind)


def search_token(term: str) -> str | None:
    """``term`` as a list's search may put it in a URL, or None: it may not (see above)."""
    term = term.strip()
    hashed = clear_identifier_hash(term)
    if hashed is not None:
        return hashed
    if not term or _IDS.fullmatch(term) or _is_pointer(term):
        return term
    return None


def _is_pointer(term: str) -> bool:
    return (
        bool(_POINTER.fullmatch(term))
        and any(ch.isdigit() for ch in term)
        and not _ZIP_OR_LONGER.fullmatch(term)
        and not _DATE_INSIDE.search(term)
        and not masking.identifiers_in(term) - {"number"}
    )


def named_search_token(term: str) -> str:
    """For a list searched by names of its own, none a consumer's: any term, a clear email
    or phone as its hash all the same."""
    return clear_identifier_hash(term) or term.strip()


def ledger_search_token(term: str) -> str | None:
    """The ledger's: an id as any list's, or one of its kinds or actors."""
    stripped = term.strip()
    if stripped in _LEDGER_KINDS or _ACTOR.fullmatch(stripped):
        return stripped
    return search_token(term)
