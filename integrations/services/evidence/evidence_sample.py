"""A sample of an evidence pack's work items, as an auditor samples: drawn by a seed, each with
its whole story as one page of the pack::

    sample = sample_draw(period=period, size=20, seed="auditor-2028")
    sample_population_write(writer, period)                 # what it was drawn from
    sample_pages_write(writer, sample, exported_at=now)     # sample/<work item id>.html

The draw does not depend on the database's order: the period's work items are ordered by
the SHA-256 of ``<seed>:<cycle>:<work item id>`` (UTF-8, hex) and the first ``size`` taken.
Anyone holding DROP's lists recomputes it; the same seed gives the same items, and the pack
carries the population (``sample_population.csv``, ids only) so that the verifier draws it
again. Only the drawn items are read (PostgreSQL keeps the top ``size`` while it scans).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.template.loader import render_to_string
from django.utils import timezone

from integrations import exports
from integrations.evidence import sample as layout
from integrations.models import WorkItem
from integrations.selectors.story import work_item_story
from integrations.services.evidence.evidence_period import Period
from integrations.services.evidence.evidence_writer import CsvRecordCounter, PackWriter

DIRECTORY = layout.DIRECTORY
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
_POPULATION_CSV = """
COPY (SELECT c.drop_session_id, w.work_item_id
      FROM integrations_workitem w JOIN integrations_dropcycle c ON c.id = w.cycle_id
      WHERE w.cycle_id = ANY(%(cycles)s) ORDER BY w.cycle_id, w.id) TO STDOUT WITH (FORMAT csv)
"""
# The most work items a sample draws. An auditor reads a sample page by page, and a
# statistical sample of any population is hundreds of items at most; the whole population is
# already in the pack (sample_population.csv). Each drawn item is a page with its story read and
# rendered, so a size without bound would also hold an export (the admin's, within one web
# request) for as long as the period has work items, and one past a bigint fails in
# PostgreSQL's LIMIT.
SAMPLE_MAX = 10_000


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
            "population_file": layout.POPULATION,
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
    names = layout.page_names((cycle, work_item_id) for _, cycle, work_item_id in rows)
    items = [
        SampledItem(pk=pk, cycle=cycle, work_item_id=work_item_id, file=name)
        for (pk, cycle, work_item_id), name in zip(rows, names, strict=True)
    ]
    return Sample(seed=seed, size=size, population=population, items=items)


def sample_population_write(writer: PackWriter, period: Period) -> None:
    """Every work item the sample is drawn from, by its cycle and DROP's id (no consumer
    identifier): the verifier draws the sample again from it. Streamed by ``COPY``."""
    cycles = list(period.cycles().values_list("pk", flat=True))
    writer.write(
        layout.POPULATION,
        _population_chunks(cycles),
        rows=CsvRecordCounter(),
        description="the work items the sample is drawn from, by cycle and work item id (CSV)",
    )


def _population_chunks(cycles: list[int]) -> Iterator[bytes]:
    yield (",".join(layout.POPULATION_COLUMNS) + "\n").encode()
    with connection.cursor() as cursor, cursor.copy(_POPULATION_CSV, {"cycles": cycles}) as copy:
        yield from exports.rechunk(copy)


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
