"""English month names, full and abbreviated, and the month each names: the one home of the
names a date of birth may be written with, read by the standardizer (``July 4, 1776``) and
by the free-text masking (which must mask every date the standardizer reads)::

    MONTHS["sept"]   # 9
"""

from __future__ import annotations

from typing import Final

# Spelt out here rather than read with strptime("%B"), whose month names follow the process
# locale.
MONTHS: Final = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
