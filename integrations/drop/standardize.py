"""Standardize and hash DROP identifiers, the way CalPrivacy does before it sends them.

A DROP list holds SHA-256 hashes (standard Base64, 44 characters) of standardized
identifiers. A broker finds its consumers by standardizing and hashing its own records with
exactly the same rules, so this module is the only place those rules live
(docs/contracts.md §12)::

    >>> email_hash("Anna.Smith@Domain.com")
    'KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE='
    >>> list_type_hash("ndz", {"first_name": "Danielle", "last_name": "Johnson",
    ...                        "dob": "1985-07-04", "zip": "91790"})
    'PQOfn1RffEKmqMmNAzDKKaoZCwxWbQZkQzPWmQo9REA='

A value that breaks a rule raises `InvalidIdentifier`, whose `field` and `reason` name the
problem without repeating the value. Names are transliterated with the one table
`TRANSLITERATION` (module `transliteration`, its data in `transliteration.json`); adding a
mapping there is a one-line change.

Pure Python on the standard library, with no Django import, so it runs in workers,
commands and the benchmark alike.
"""

from __future__ import annotations

import binascii
import hashlib
import re
import unicodedata
from collections.abc import Callable, Mapping
from datetime import date
from functools import lru_cache
from typing import Final

from integrations.drop.transliteration import TRANSLITERATION, transliterate
from integrations.list_types import HASH_TYPES
from integrations.month_names import MONTHS

__all__ = [
    "HASH_RE",
    "LIST_TYPES",
    "TRANSLITERATION",
    "InvalidIdentifier",
    "ctvid_hash",
    "email_hash",
    "hash_is_canonical",
    "hash_value",
    "is_valid_hash",
    "list_type_hash",
    "maid_hash",
    "name_standardizer",
    "name_vin_hash",
    "ndz_hash",
    "not_utf8",
    "phone_hash",
    "standardize_ctvid",
    "standardize_dob",
    "standardize_email",
    "standardize_maid",
    "standardize_name",
    "standardize_phone",
    "standardize_vin",
    "standardize_zip",
]

LIST_TYPES: Final = HASH_TYPES  # integrations/list_types.py

# DROP's hash shape `^[A-Za-z0-9+/]{43}=$`, ended with \Z so that a trailing newline does not pass
# when a caller uses .match() instead of .fullmatch().
HASH_RE: Final = re.compile(r"^[A-Za-z0-9+/]{43}=\Z")
# 43 Base64 characters carry 258 bits, 2 more than a SHA-256: canonical Base64 (what every
# encoder writes, DROP's too) leaves them 0, so the last character is one of these. Another
# one decodes to the same digest as its canonical twin: not a hash anyone sent.
_CANONICAL_LAST: Final = frozenset("AEIMQUYcgkosw048")

PHONE_DIGITS: Final = 10
ZIP_LENGTH: Final = 5
VIN_LENGTH: Final = 17
MAID_LENGTH: Final = 32
CTVID_MIN_LENGTH: Final = 8
CTVID_MAX_LENGTH: Final = 32


class InvalidIdentifier(ValueError):
    """A value that cannot be standardized into a DROP identifier.

    `field` names the identifier part (`email`, `first_name`, `dob`, ...); `reason` says
    which rule failed, in words fit for a rejected-row report. Neither ever contains the
    clear value, so the exception can be logged as it is.
    """

    def __init__(self, field: str, reason: str) -> None:
        # Both go to args so the exception survives pickling (job queues, multiprocessing).
        super().__init__(field, reason)
        self.field = field
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


# ---------------------------------------------------------------------------------------
# Hashing
# ---------------------------------------------------------------------------------------

_sha256 = hashlib.sha256
# binascii is what base64.b64encode calls underneath; calling it directly saves a Python
# frame per hash on the hot path.
_b2a_base64 = binascii.b2a_base64


def hash_value(standardized: str) -> str:
    """Return SHA-256 over the UTF-8 bytes of `standardized`, as padded standard Base64.

    The value must already be standardized; the result is always 44 characters.
    """
    return _b2a_base64(_sha256(standardized.encode()).digest(), newline=False).decode()


def is_valid_hash(s: object) -> bool:
    """Tell whether `s` is a DROP hash: 44 characters of standard Base64, canonical."""
    return isinstance(s, str) and HASH_RE.fullmatch(s) is not None and hash_is_canonical(s)


def hash_is_canonical(s: str) -> bool:
    """Whether `s`, of a DROP hash's shape (`HASH_RE`), is canonical Base64: no bit set
    past the digest's 256 in its last character."""
    return s[42] in _CANONICAL_LAST


def not_utf8(text: str) -> bool:
    """Whether ``text``, read from a file with ``errors="surrogateescape"``, holds bytes that
    were not UTF-8. Such text has no UTF-8 form to hash, and standardizing would drop those
    bytes as not letters or digits ("Jos\\xe9" hashed as "jos"): refuse it before."""
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


# ---------------------------------------------------------------------------------------
# Email and phone: the hot paths, kept to a few C-level string calls each
# ---------------------------------------------------------------------------------------


def standardize_email(v: str) -> str:
    """Remove all whitespace, then lowercase; dots, plus signs and the rest are kept.

    No address syntax is checked: DROP hashes what the consumer typed, so must we.
    """
    try:
        s = "".join(v.split()).lower()
    except (AttributeError, TypeError):
        raise InvalidIdentifier("email", "email must be text") from None
    if not s:
        raise InvalidIdentifier("email", "email is empty after removing whitespace")
    return s


_NOT_ASCII_DIGIT: Final = re.compile(r"[^0-9]+")
_UNICODE_DIGIT: Final = re.compile(r"\d")
_UNICODE_DASH: Final = re.compile(r"[\u2010-\u2015\u2212]")  # NFKC already maps the full-width one


def _to_ascii(v: str) -> str:
    """Fold compatibility forms (full-width letters and digits) and any script's decimal
    digits to ASCII, for the fields whose rules keep only ASCII letters and digits.

    Without this, a phone typed with full-width or Arabic-Indic digits would lose its
    digits and hash as a different number.
    """
    s = unicodedata.normalize("NFKC", v)
    if s.isascii():
        return s
    return _UNICODE_DIGIT.sub(lambda m: str(unicodedata.decimal(m[0])), s)


def standardize_phone(v: str) -> str:
    """Keep digits only, then the last 10 of them (all of them when there are fewer)."""
    if not isinstance(v, str):
        raise InvalidIdentifier("phone", "phone must be text")
    if not v.isascii():
        v = _to_ascii(v)
    s = _NOT_ASCII_DIGIT.sub("", v)[-PHONE_DIGITS:]
    if not s:
        raise InvalidIdentifier("phone", "phone has no digits")
    return s


# ---------------------------------------------------------------------------------------
# ZIP, VIN, MAID, CTVID: ASCII letters and digits with a length rule
# ---------------------------------------------------------------------------------------

_NOT_ASCII_ALNUM: Final = re.compile(r"[^a-z0-9]+")
_NOT_HEX: Final = re.compile(r"[^0-9a-f]+")


def _ascii_text(v: object, field: str, label: str) -> str:
    if not isinstance(v, str):
        raise InvalidIdentifier(field, f"{label} must be text")
    return v if v.isascii() else _to_ascii(v)


# A US ZIP+4 written with whitespace (spaces, tabs, any number of them) or with nothing
# between its parts. Without this, `021341234` or `02134  1234` would lose its leading zero
# first and hash as `21341`, not as `2134` like `02134-1234`: one person, two hashes.
_US_ZIP_PLUS_4: Final = re.compile(r"\s*(\d{5})\s*\d{4}\s*")


def standardize_zip(v: str) -> str:
    """Drop a ZIP+4 extension (everything from the hyphen, or the last 4 of 9 digits
    written together or after whitespace), keep letters and digits, lowercase, strip
    leading zeros, keep the first 5 characters.

    `91790-3771`, `917903771`, `91790 3771` and `91790  3771` give `91790`, `M1B 1A1` gives
    `m1b1a`, `00712345` (8 digits, not a ZIP+4) gives `71234`.
    """
    s = _ascii_text(v, "zip", "ZIP")
    if not s.isascii():
        s = _UNICODE_DASH.sub("-", s)
    if m := _US_ZIP_PLUS_4.fullmatch(s):
        s = m[1]
    s = _NOT_ASCII_ALNUM.sub("", s.partition("-")[0].lower()).lstrip("0")[:ZIP_LENGTH]
    if not s:
        raise InvalidIdentifier("zip", "ZIP has no letters or digits besides leading zeros")
    return s


def standardize_vin(v: str) -> str:
    """Keep letters and digits, lowercase; the result must be 17 characters."""
    s = _NOT_ASCII_ALNUM.sub("", _ascii_text(v, "vin", "VIN").lower())
    if len(s) != VIN_LENGTH:
        raise InvalidIdentifier("vin", "VIN must be 17 letters or digits after standardizing")
    return s


def standardize_maid(v: str) -> str:
    """Lowercase, keep only `0-9a-f`; the result must be 32 characters."""
    s = _NOT_HEX.sub("", _ascii_text(v, "maid", "MAID").lower())
    if len(s) != MAID_LENGTH:
        raise InvalidIdentifier("maid", "MAID must be 32 hex characters after standardizing")
    return s


def standardize_ctvid(v: str) -> str:
    """Keep letters and digits, lowercase; the result must be 8 to 32 characters."""
    s = _NOT_ASCII_ALNUM.sub("", _ascii_text(v, "ctvid", "CTVID").lower())
    if not CTVID_MIN_LENGTH <= len(s) <= CTVID_MAX_LENGTH:
        raise InvalidIdentifier(
            "ctvid", "CTVID must be 8 to 32 letters or digits after standardizing"
        )
    return s


# ---------------------------------------------------------------------------------------
# Date of birth
# ---------------------------------------------------------------------------------------

_DOB_ISO: Final = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})")
_DOB_COMPACT: Final = re.compile(r"(\d{4})(\d{2})(\d{2})")
_DOB_US: Final = re.compile(r"(\d{1,2})/(\d{1,2})/(\d{4})")
_DOB_WORDS: Final = re.compile(r"([a-z]+)\.? ?(\d{1,2})(?:, ?| )(\d{4})")

_DOB_FORMATS: Final = "YYYY-MM-DD, YYYYMMDD, MM/DD/YYYY or Month D, YYYY"


def standardize_dob(v: str | date) -> str:
    """Return a date of birth as `YYYYMMDD`.

    Accepts a `datetime.date`, or text as `YYYY-MM-DD`, `YYYYMMDD`, `MM/DD/YYYY` or
    `Month D, YYYY` (English month name, full or abbreviated: DROP's own example is
    `July 4, 1776`). The date must exist in the calendar: `2023-02-30` is rejected.
    """
    if isinstance(v, date):
        year, month, day = v.year, v.month, v.day
    elif isinstance(v, str):
        s = " ".join(_ascii_text(v, "dob", "date of birth").split()).lower()
        if not s:
            raise InvalidIdentifier("dob", "date of birth is empty")
        if m := _DOB_ISO.fullmatch(s) or _DOB_COMPACT.fullmatch(s):
            year, month, day = int(m[1]), int(m[2]), int(m[3])
        elif m := _DOB_US.fullmatch(s):
            year, month, day = int(m[3]), int(m[1]), int(m[2])
        elif (m := _DOB_WORDS.fullmatch(s)) and m[1] in MONTHS:
            year, month, day = int(m[3]), MONTHS[m[1]], int(m[2])
        else:
            raise InvalidIdentifier(
                "dob", f"date of birth is not in a known format ({_DOB_FORMATS})"
            )
    else:
        raise InvalidIdentifier("dob", "date of birth must be text or a date")
    try:
        date(year, month, day)
    except ValueError:
        raise InvalidIdentifier("dob", "date of birth is not a real calendar date") from None
    return f"{year:04d}{month:02d}{day:02d}"


# ---------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------


def _marks_fold_away(base: str) -> bool:
    """Tell whether accents on `base` are dropped: Latin, Greek and Cyrillic letters.

    Marks on other scripts (kana voicing, Indic vowel signs, Hebrew points) are part of
    the letter and stay, as DROP keeps those scripts as they are.
    """
    cp = ord(base)
    return (
        cp < 0x0530  # Latin, IPA, spacing modifiers, Greek, Cyrillic
        or 0x1C80 <= cp < 0x1C90  # Cyrillic Extended-C
        or 0x1E00 <= cp < 0x2000  # Latin Extended Additional, Greek Extended
        or 0x2DE0 <= cp < 0x2E00  # Cyrillic Extended-A
        or 0xA640 <= cp < 0xA6A0  # Cyrillic Extended-B
        or 0xA720 <= cp < 0xA800  # Latin Extended-D
    )


def _standardize_name_unicode(v: str) -> str:
    # 1. Compatibility forms (full-width, ligatures) to their plain letters, then lowercase.
    #    lower(), not casefold(): casefold would turn ß into ss before the table sees it.
    s = unicodedata.normalize("NFKC", v).lower()
    # 2. Transliterate on composed text, so ё, й and the accented Greek digraphs are whole.
    s = transliterate(s)
    # 3. Decompose and drop the accents of Latin, Greek and Cyrillic letters; marks of other
    #    scripts stay with their letter.
    kept: list[str] = []
    fold = True
    for ch in unicodedata.normalize("NFKD", s):
        if unicodedata.category(ch)[0] == "M":
            if not fold:
                kept.append(ch)
        else:
            fold = _marks_fold_away(ch)
            kept.append(ch)
    # 4. Transliterate again: a letter whose accent is not in the table (polytonic ἀ,
    #    Moldovan ӂ) is only now the bare letter the table knows.
    s = transliterate("".join(kept))
    # 5. Keep letters, digits and the marks that survived step 3; recompose (kana, Hangul).
    s = "".join(ch for ch in s if ch.isalnum() or unicodedata.category(ch)[0] == "M")
    return unicodedata.normalize("NFC", s)


def standardize_name(v: str, field: str = "name") -> str:
    """Standardize a first or last name (each is standardized on its own).

    Unicode is normalized and lowercased, Greek (ELOT 743) and Cyrillic (passport
    romanization) are transliterated with `TRANSLITERATION`, accented Latin is folded to
    ASCII, and only letters and digits are kept; letters of other scripts (CJK, Arabic,
    Hebrew, ...) stay as they are. `José` -> `jose`, `Иван` -> `ivan`,
    `  van  der  Berg ` -> `vanderberg`.

    `field` is the name reported in `InvalidIdentifier` (`first_name`, `last_name`).
    """
    return _standardize_name(v, field, _standardize_name_unicode)


def name_standardizer() -> Callable[[str, str], str]:
    """`standardize_name` with a cache of its own, for the rows of one bulk import.

    Names repeat from row to row and the Unicode path is slow, so a file's parser keeps
    one. The cache holds clear names: it goes when the returned function does, and nothing
    module-level keeps one (a clear identifier is never stored).
    """
    cached = lru_cache(maxsize=1 << 16)(_standardize_name_unicode)

    def standardize(v: str, field: str) -> str:
        return _standardize_name(v, field, cached)

    return standardize


def _standardize_name(v: str, field: str, unicode: Callable[[str], str]) -> str:
    if not isinstance(v, str):
        raise InvalidIdentifier(field, f"{field} must be text")
    # Plain ASCII (most names) has nothing to normalize or transliterate.
    s = _NOT_ASCII_ALNUM.sub("", v.lower()) if v.isascii() else unicode(v)
    if not s:
        raise InvalidIdentifier(field, f"{field} has no letters or digits")
    return s


# ---------------------------------------------------------------------------------------
# Per list type
# ---------------------------------------------------------------------------------------


def email_hash(email: str) -> str:
    """Hash of a standardized email address (the `email` list)."""
    s = standardize_email(email)
    try:
        return _b2a_base64(_sha256(s.encode()).digest(), newline=False).decode()
    except UnicodeEncodeError:
        # Only text decoded with surrogateescape gets here; it has no UTF-8 form to hash.
        raise InvalidIdentifier("email", "email contains characters that are not Unicode") from None


def phone_hash(phone: str) -> str:
    """Hash of a standardized phone number (the `phone` list)."""
    return _b2a_base64(_sha256(standardize_phone(phone).encode()).digest(), newline=False).decode()


def maid_hash(v: str) -> str:
    """Hash of a standardized mobile advertising ID (the `maid` list)."""
    return hash_value(standardize_maid(v))


def ctvid_hash(v: str) -> str:
    """Hash of a standardized connected-TV ID (the `ctvid` list)."""
    return hash_value(standardize_ctvid(v))


def ndz_hash(
    first_name: str,
    last_name: str,
    dob: str | date,
    zip: str,
    *,
    names: Callable[[str, str], str] = standardize_name,
) -> str:
    """NDZ hash: hash(hash(first) + hash(last) + hash(dob) + hash(zip)).

    `+` joins the 44-character Base64 strings with no separator. `names` standardizes the
    names (a bulk import's `name_standardizer()`).
    """
    return hash_value(
        hash_value(names(first_name, "first_name"))
        + hash_value(names(last_name, "last_name"))
        + hash_value(standardize_dob(dob))
        + hash_value(standardize_zip(zip))
    )


def name_vin_hash(
    first_name: str,
    last_name: str,
    vin: str,
    *,
    names: Callable[[str, str], str] = standardize_name,
) -> str:
    """NameVIN hash: hash(hash(first) + hash(last) + hash(vin)), Base64 strings joined."""
    return hash_value(
        hash_value(names(first_name, "first_name"))
        + hash_value(names(last_name, "last_name"))
        + hash_value(standardize_vin(vin))
    )


_SIMPLE_HASHERS: Final[dict[str, Callable[[str], str]]] = {
    "email": email_hash,
    "phone": phone_hash,
    "maid": maid_hash,
    "ctvid": ctvid_hash,
}
_COMPOSITE_FIELDS: Final = {
    "ndz": ("first_name", "last_name", "dob", "zip"),
    "name_vin": ("first_name", "last_name", "vin"),
}


def list_type_hash(list_type: str, value: str | Mapping[str, str | date]) -> str:
    """Hash `value` for a DROP list type (one of `LIST_TYPES`).

    `value` is the text for `email`, `phone`, `maid` and `ctvid`; for `ndz` a mapping with
    `first_name`, `last_name`, `dob` and `zip`; for `name_vin` one with `first_name`,
    `last_name` and `vin`. Raises `InvalidIdentifier` naming the field at fault.
    """
    simple = _SIMPLE_HASHERS.get(list_type)
    if simple is not None:
        if not isinstance(value, str):
            raise InvalidIdentifier(list_type, f"{list_type} must be text")
        return simple(value)
    fields = _COMPOSITE_FIELDS.get(list_type)
    if fields is None:
        raise InvalidIdentifier(
            "list_type", f"unknown list type; expected one of {', '.join(LIST_TYPES)}"
        )
    if not isinstance(value, Mapping):
        raise InvalidIdentifier(list_type, f"{list_type} needs {', '.join(fields)}")
    parts: list[str | date] = []
    for name in fields:
        part = value.get(name)
        if part is None:
            raise InvalidIdentifier(name, f"{name} is required for {list_type}")
        parts.append(part)
    if list_type == "ndz":
        first, last, dob, zip_code = parts
        return ndz_hash(
            _text(first, "first_name"), _text(last, "last_name"), dob, _text(zip_code, "zip")
        )
    first, last, vin = parts
    return name_vin_hash(_text(first, "first_name"), _text(last, "last_name"), _text(vin, "vin"))


def _text(v: str | date, field: str) -> str:
    if not isinstance(v, str):
        raise InvalidIdentifier(field, f"{field} must be text")
    return v
