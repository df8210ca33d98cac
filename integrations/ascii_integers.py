"""A whole number written in ASCII digits only: the one home of that rule.

``str.isdigit()`` also holds for characters ``int()`` refuses (a superscript "²", a circled
"①"), and ``int()`` reads what no query string, header or id of ours holds (Arabic-Indic or
full-width digits, spaces, a sign, underscores). A number we are sent is read here::

    ascii_integer("2027")   # 2027
    ascii_integer("²")      # None
    ascii_integer(" 12")    # None
"""

from __future__ import annotations


def ascii_integer(text: str) -> int | None:
    """The number ``text`` spells in ASCII digits (at least one, nothing else), or None."""
    if text.isascii() and text.isdigit():
        try:
            return int(text)
        except ValueError:  # more digits than int() reads (4,300): no number of ours
            return None
    return None
