"""Transliteration for the names rule (``standardize.standardize_name``): Greek by ELOT 743,
Cyrillic by passport romanization, and the Latin letters that do not decompose::

    transliterate("ευθυμίου")   # "efthymiou"

The table is data, ``transliteration.json`` beside this module (one mapping a line, in groups
that say where they come from), read and checked once at import. Pure Python, no Django.
"""

from __future__ import annotations

import json
import re
import unicodedata
from importlib import resources
from typing import Any, Final

__all__ = ["TRANSLITERATION", "transliterate", "transliteration_table"]

# ELOT 743's two context rules are not mappings and sit below the table: `_WORD_EDGE_ONLY`
# (μπ) and `_ELOT_UPSILON_AS_F` (αυ, ευ, ηυ before a voiceless consonant).
_TRANSLITERATION_FILE: Final = "transliteration.json"


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{_TRANSLITERATION_FILE}: a key is given twice in one group")
    return dict(pairs)


def transliteration_table(text: str) -> dict[str, str]:
    """The table of ``transliteration.json``'s ``text``, checked: keys lowercase and composed
    (NFC), values ASCII, no key twice (a mistake there must not pass silently)."""
    table: dict[str, str] = {}
    for group in json.loads(text, object_pairs_hook=_refuse_repeated_keys)["groups"]:
        for key, value in group["map"].items():
            if key in table:
                raise ValueError(f"{_TRANSLITERATION_FILE}: {key!r} is in two groups")
            if key != unicodedata.normalize("NFC", key).lower() or not value.isascii():
                raise ValueError(
                    f"{_TRANSLITERATION_FILE}: {key!r} must be lowercase and composed (NFC), "
                    "its value ASCII"
                )
            table[key] = value
    return table


TRANSLITERATION: Final[dict[str, str]] = transliteration_table(
    resources.files(__package__).joinpath(_TRANSLITERATION_FILE).read_text("utf-8")
)

_GREEK_LETTER: Final = "\u0390\u03ac-\u03ce"  # lowercase monotonic Greek, with ς and accents
_WORD_EDGE_ONLY: Final = frozenset({"μπ"})


def _key_pattern(key: str) -> str:
    escaped = re.escape(key)
    if key in _WORD_EDGE_ONLY:
        return f"(?<![{_GREEK_LETTER}]){escaped}|{escaped}(?![{_GREEK_LETTER}])"
    return escaped


_TRANSLITERATION_RE: Final = re.compile(
    "|".join(
        [_key_pattern(k) for k in sorted(TRANSLITERATION, key=len, reverse=True) if len(k) > 1]
        + ["[" + "".join(re.escape(k) for k in TRANSLITERATION if len(k) == 1) + "]"]
    )
)

# ELOT 743: the υ of αυ, ευ, ηυ sounds as f, and is written f, before a voiceless consonant
# and at the end of a word (αυτός -> aftos, Ευθυμίου -> efthymiou); elsewhere v (Παύλος ->
# pavlos). Rewriting that υ as φ lets the table give the letters.
_ELOT_UPSILON_AS_F: Final = re.compile(f"(?<=[αεη])[υύ](?=[θκξπστφχψς]|(?![{_GREEK_LETTER}]))")


def transliterate(s: str) -> str:
    return _TRANSLITERATION_RE.sub(lambda m: TRANSLITERATION[m[0]], _ELOT_UPSILON_AS_F.sub("φ", s))
