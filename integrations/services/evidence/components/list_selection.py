"""The list selection component: the lists DROP sent in each cycle of the pack, against the
selection staff recorded as in force at its download (``brokers lists-selected``)::

    component = build(context)
    component.records["cycles"]  # per cycle: the lists sent, the lists selected
"""

from __future__ import annotations

from typing import Any

from integrations.list_types import DATA_TYPE_OF
from integrations.selectors.list_selection import (
    cycle_lists_sent,
    list_selections,
    selection_in_force,
)
from integrations.services.evidence.components.base import Component, PackContext

PROVES = (
    "For each DROP cycle of the pack, the lists DROP's package held (every list file, empty "
    "ones too) against the lists staff recorded the broker selected in DROP's portal, as in "
    "force at the cycle's download, each selection with its reason, actor and ledger event "
    "(broker.lists_selected). A list DROP sent that was not selected, or a selected list "
    "DROP did not send, fails the cycle's test and is named."
)
CANNOT_PROVE = (
    "What DROP's portal itself holds: dropportal cannot read the selection there, so the "
    "selection is what staff recorded; the auditor compares it with the portal (or DROP's "
    "records). Nor that the selection suits the data the broker holds: the reason says "
    "why, in staff's words."
)


def build(context: PackContext) -> Component:
    component = Component(key="list_selection", proves=PROVES, cannot_prove=CANNOT_PROVE)
    selections = list(list_selections(context.broker))
    component.records["selections"] = [
        {
            "lists": [DATA_TYPE_OF[t] for t in selection.lists],
            "reason": selection.reason,
            "actor": selection.actor,
            "effective_from": selection.effective_from.isoformat(),
            "recorded_at": selection.recorded_at.isoformat(),
        }
        for selection in selections
    ]
    component.test(
        "a list selection is recorded",
        passed=bool(selections),
        detail=(
            f"{len(selections)} selection(s) recorded"
            if selections
            else "no list selection recorded for the broker: record it with `manage.py brokers "
            f"lists-selected {context.broker.broker_id} --lists ... --reason ...`"
        ),
    )
    cycles: list[dict[str, Any]] = []
    for cycle in context.period.cycles().order_by("downloaded_at"):
        sent = cycle_lists_sent(cycle)
        selection = selection_in_force(selections, cycle.downloaded_at)
        selected = [DATA_TYPE_OF[t] for t in selection.lists] if selection else []
        cycles.append(
            {
                "cycle": cycle.drop_session_id,
                "downloaded_at": cycle.downloaded_at.isoformat(),
                "lists_sent": sent,
                "lists_selected": selected if selection else None,
                "selection_in_force_from": (
                    selection.effective_from.isoformat() if selection else None
                ),
            }
        )
        name = f"cycle {cycle.drop_session_id}: the lists DROP sent are the lists selected"
        if selection is None:
            component.test(
                name,
                passed=False,
                detail=f"no selection recorded in force at its download "
                f"({cycle.downloaded_at.isoformat()}); DROP sent {', '.join(sent) or 'no list'}",
            )
            continue
        not_selected = [t for t in sent if t not in selected]
        not_sent = [t for t in selected if t not in sent]
        problems = [
            *(f"DROP sent {t}, which was not selected" for t in not_selected),
            *(f"{t} was selected and DROP did not send it" for t in not_sent),
        ]
        component.test(
            name,
            passed=not problems,
            detail="; ".join(problems) or f"{', '.join(sent)} sent, as selected",
        )
    component.records["cycles"] = cycles
    return component
