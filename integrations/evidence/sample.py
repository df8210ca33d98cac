"""An evidence pack's sample, as its writer draws it and its verifier draws it again. No
Django and no database, like ``pack``::

    drawn = redraw(population_rows, seed="auditor-2028", size=20)   # [(cycle, work item id)]
    names = page_names(drawn)                                        # sample/<id>.html each

The population is every work item of the pack's cycles, ``sample_population.csv``: the
columns ``cycle,work_item_id`` (DROP's session and work item ids, no consumer identifier).
The draw orders it by the SHA-256 (hex) of ``<seed>:<cycle>:<work item id>`` in UTF-8 and
takes the first ``size``.
"""

from __future__ import annotations

import hashlib
import heapq
import re
from collections.abc import Iterable

DIRECTORY = "sample/"
POPULATION = "sample_population.csv"
POPULATION_COLUMNS = ("cycle", "work_item_id")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def draw_key(seed: str, cycle: str, work_item_id: str) -> str:
    return hashlib.sha256(f"{seed}:{cycle}:{work_item_id}".encode()).hexdigest()


def redraw(population: Iterable[tuple[str, str]], *, seed: str, size: int) -> list[tuple[str, str]]:
    """The first ``size`` of ``population`` by the draw's order (only ``size`` kept while
    reading)."""
    return heapq.nsmallest(size, population, key=lambda item: draw_key(seed, *item))


def page_names(items: Iterable[tuple[str, str]]) -> list[str]:
    """Each drawn item's page: ``sample/<work item id>.html``, and for the same id in a
    second cycle of the period ``sample/<id>-cycle-<cycle>.html``. A work item id is DROP's
    (letters and digits); anything else cannot reach a path."""
    names: list[str] = []
    seen: set[str] = set()
    for cycle, work_item_id in items:
        stem = _UNSAFE.sub("_", work_item_id)
        name = f"{DIRECTORY}{stem}.html"
        if name in seen:
            name = f"{DIRECTORY}{stem}-cycle-{_UNSAFE.sub('_', cycle)}.html"
        seen.add(name)
        names.append(name)
    return names
