"""The lists a broker selected in DROP's portal (as staff recorded them) and the lists each
DROP cycle sent, for the evidence pack's list selection component and ``brokers list``::

    selection = lists_selected_at(broker, cycle.downloaded_at)   # None: none recorded by then
    cycle_lists_sent(cycle)                                      # ["Email", "Phone"]
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from django.db.models import QuerySet
from django.utils import timezone

from integrations.drop.files import REMOVED, DropFileError, parse_file_name
from integrations.list_types import DATA_TYPE_OF
from integrations.models import Broker, DropCycle, ListSelection


def lists_selected_at(broker: Broker, at: dt.datetime | None = None) -> ListSelection | None:
    """The selection in force at ``at`` (now when not given): the latest in force by then,
    read alone (``selection_in_force`` picks the same from rows already read)."""
    return (
        ListSelection.objects.filter(broker=broker, effective_from__lte=at or timezone.now())
        .order_by("-effective_from", "-id")
        .first()
    )


def selection_in_force(
    selections: Sequence[ListSelection] | QuerySet[ListSelection], at: dt.datetime | None = None
) -> ListSelection | None:
    """Of a broker's selections as ``list_selections`` orders them, the one in force at ``at``
    (now when not given): the latest in force by then. A page that shows them all reads the
    one in force from the same rows."""
    moment = at or timezone.now()
    in_force = None
    for selection in selections:
        if selection.effective_from > moment:
            break
        in_force = selection
    return in_force


def list_selections(broker: Broker) -> QuerySet[ListSelection]:
    """Every selection recorded for the broker, the earliest in force first."""
    return ListSelection.objects.filter(broker=broker).order_by("effective_from", "id")


def cycle_lists_sent(cycle: DropCycle) -> list[str]:
    """The DROP lists the cycle's package held, by DROP's names, in the order of
    ``list_types`` (lists this version does not know last, by the name DROP gave them):
    every list file the import read or set aside, empty ones too, not the Removed file."""
    sent: set[str] = set()
    for name in [*cycle.files, *cycle.unread_files]:
        try:
            data_type = parse_file_name(name).data_type
        except DropFileError:
            # A list set aside for its unknown type: its name's third part is the type.
            parts = name.removesuffix(".csv").split("_")
            data_type = parts[2] if len(parts) >= 3 else name
        if data_type != REMOVED:
            sent.add(data_type)
    known = [data_type for data_type in DATA_TYPE_OF.values() if data_type in sent]
    return known + sorted(sent - set(known))
