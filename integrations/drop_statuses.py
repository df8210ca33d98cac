"""The status codes DROP takes for a work item, defined once::

    from integrations.drop_statuses import STATUS_CODES, DropStatus
    DropStatus.NOT_FOUND.label  # "Not found"
    3 in STATUS_CODES  # True: a code a response file or a status column may hold

Which outcome gives which code, and which code wins, are in ``models.requests``
(``DROP_STATUS_CODES``, ``DROP_STATUS_PRECEDENCE``).

A leaf module (standard library only): the protocol code (``drop/files.py``, which writes
the codes into response files), the models, the services and the admin all import it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class DropStatus(IntEnum):
    EXEMPT = 2
    DELETED = 3
    OPTED_OUT = 4
    NOT_FOUND = 5  # also: no match once the matching process is complete

    @property
    def label(self) -> str:
        """What staff read: ``"Opted out"``."""
        return _LABELS[self]

    @property
    def short_label(self) -> str:
        """``"2: exempt"``, as staff pick a code by hand."""
        return f"{self.value}: {self.label.lower()}"


_LABELS: Final[dict[DropStatus, str]] = {
    DropStatus.EXEMPT: "Exempt",
    DropStatus.DELETED: "Deleted",
    DropStatus.OPTED_OUT: "Opted out",
    DropStatus.NOT_FOUND: "Not found",
}
# The codes as plain integers, in order: what a response file or a status column may hold.
STATUS_CODES: Final[tuple[int, ...]] = tuple(status.value for status in DropStatus)
# As an error message lists them: "2, 3, 4 or 5".
STATUS_CODES_TEXT: Final[str] = (
    ", ".join(str(code) for code in STATUS_CODES[:-1]) + f" or {STATUS_CODES[-1]}"
)
