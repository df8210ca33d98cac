"""A sample of an evidence pack's work items, as an auditor samples: drawn by a seed, each with
its whole story as one page of the pack::

    sample = sample_draw(period=period, size=20, seed="auditor-2028")
    sample_pages_write(writer, sample, exported_at=now)     # sample/<work item id>.html

The draw does not depend on the database's order: the period's work items are ordered by
the SHA-256 of ``<seed>:<cycle>:<work item id>`` (UTF-8, hex) and the first ``size`` taken.
Anyone holding DROP's lists recomputes it; the same seed gives the same items. Only the
drawn items are read (PostgreSQL keeps the top ``size`` while it scans).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.template.loader import render_to_string
from django.utils import timezone

from integrations.models import WorkItem
from integrations.selectors.story import work_item_story
from integrations.services.evidence.evidence_period import Period
from integrations.services.evidence.evidence_writer import PackWriter

DIRECTORY = "sample/"
METHOD = (
    "the work items of the period's cycles ordered by the SHA-256 (hex) of "
    "'<seed>:<cycle>:<work item id>' in UTF-8, the first <size> of them"
)

_DRAW = """
SELECT w.id, c.drop_session_id, w.work_item_id
FROM integrations_workitem w JOIN integrations_dropcycle c ON c.id = w.cycle_id
WHERE w.cycle_id = ANY(%(cycles)s)
ORDER BY encode(sha256(convert_to(%(seed)s || ':' || c.drop_session_id || ':' || w.work_item_id,
                                  'UTF8')), 'hex')
LIMIT %(size)s
"""
_POPULATION = "SELECT count(*) FROM integrations_workitem WHERE cycle_id = ANY(%(cycles)s)"
# The most work items a sample draws. An auditor reads a sample page by page, and a
# statistical sample of any population is hundreds of items at most; the whole population is
# already in the pack (outcomes.csv). Each drawn item is a page with its story read and
# rendered, so a size without bound would also hold an export (the admin's, within one web
# request) for as long as the period has work items, and one past a bigint fails in
# PostgreSQL's LIMIT.
SAMPLE_MAX = 10_000
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class SampledItem:
    pk: int
    cycle: str
    work_item_id: str
    file: str


@dataclass(frozen=True)
class Sample:
    seed: str
    size: int
    population: int
    items: list[SampledItem]

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "size": self.size,
            "drawn": len(self.items),
            "population": self.population,
            "method": METHOD,
            "work_items": [
                {"cycle": item.cycle, "work_item_id": item.work_item_id, "file": item.file}
                for item in self.items
            ],
        }


def sample_draw(*, period: Period, size: int, seed: str) -> Sample:
    """``size`` work items of ``period`` (all of them when it has fewer), by ``seed``."""
    cycles = list(period.cycles().values_list("pk", flat=True))
    params: dict[str, Any] = {"cycles": cycles, "seed": seed, "size": size}
    with connection.cursor() as cursor:
        cursor.execute(_POPULATION, params)
        population = int(cursor.fetchone()[0])
        cursor.execute(_DRAW, params)
        rows = cursor.fetchall()
    items: list[SampledItem] = []
    names: set[str] = set()
    for pk, cycle, work_item_id in rows:
        # A work item id is DROP's (letters and digits); anything else cannot reach a path.
        stem = _UNSAFE.sub("_", work_item_id)
        name = f"{DIRECTORY}{stem}.html"
        if name in names:  # the same id in two cycles of a period
            name = f"{DIRECTORY}{stem}-cycle-{_UNSAFE.sub('_', cycle)}.html"
        names.add(name)
        items.append(SampledItem(pk=pk, cycle=cycle, work_item_id=work_item_id, file=name))
    return Sample(seed=seed, size=size, population=population, items=items)


def sample_pages_write(writer: PackWriter, sample: Sample, *, exported_at: dt.datetime) -> None:
    """One HTML page per sampled work item: its story, each step with its ledger event's id
    (to find in ``ledger.jsonl``). The pages name consumers by the broker's pointer only."""
    for item in sample.items:
        work_item = WorkItem.objects.select_related("cycle", "broker", "report_file").get(
            pk=item.pk
        )
        steps = work_item_story(work_item=work_item)
        with timezone.override(dt.UTC):
            page = render_to_string(
                "evidence/sample.html",
                {
                    "work_item": work_item,
                    "item": item,
                    "sample": sample,
                    "steps": steps,
                    "exported_at": exported_at,
                },
            )
        writer.write(
            item.file,
            [page.encode()],
            rows=len(steps),
            description=f"the story of work item {item.work_item_id} of cycle {item.cycle}, "
            f"drawn with seed {sample.seed!r}",
        )
