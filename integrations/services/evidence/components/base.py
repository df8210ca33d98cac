"""What a component builder makes: a ``Component`` with its tests, from a ``PackContext``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from integrations.drop.calendar import drop_date
from integrations.evidence import components as layout
from integrations.models import Broker, DropCycle
from integrations.services.evidence.evidence_period import Period
from integrations.services.evidence.evidence_writer import PackWriter


@dataclass
class PackContext:
    """What a builder reads and writes: the period (inside the export's snapshot) and the
    pack being written."""

    broker: Broker
    period: Period
    writer: PackWriter
    exported_at: dt.datetime

    @cached_property
    def cycle_summaries(self) -> list[dict[str, Any]]:
        """``Period.cycle_summaries`` read once for the summary and every builder, judged
        on the export's day."""
        return self.period.cycle_summaries(today=drop_date(self.exported_at))

    @cached_property
    def window(self) -> tuple[dt.datetime, dt.datetime]:
        """The time the pack covers, for what happens in time rather than to a cycle's
        records (pulls, checks, directives): a period's ``since``..``until``, or a cycle's
        download up to the next cycle's; never past the export."""
        cycle = self.period.cycle
        if cycle is None:
            assert self.period.since is not None and self.period.until is not None
            return self.period.since, min(self.period.until, self.exported_at)
        following = (
            DropCycle.objects.filter(broker=self.broker, downloaded_at__gt=cycle.downloaded_at)
            .order_by("downloaded_at")
            .values_list("downloaded_at", flat=True)
            .first()
        )
        end = min(following, self.exported_at) if following else self.exported_at
        return cycle.downloaded_at, end


@dataclass
class ComponentTest:
    name: str
    passed: bool
    detail: str = ""

    def as_json(self) -> dict[str, str]:
        return {
            "name": self.name,
            "result": layout.PASS if self.passed else layout.FAIL,
            "detail": self.detail,
        }


@dataclass
class Component:
    key: str
    proves: str
    cannot_prove: str
    records: dict[str, Any] = field(default_factory=dict)
    tests: list[ComponentTest] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def test(self, name: str, *, passed: bool, detail: str = "") -> None:
        self.tests.append(ComponentTest(name=name, passed=passed, detail=detail))

    @property
    def title(self) -> str:
        return layout.TITLES[self.key]

    @property
    def passed(self) -> bool:
        return bool(self.tests) and all(test.passed for test in self.tests)

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "result": layout.PASS if self.passed else layout.FAIL,
            "records": self.records,
            "files": self.files,
            "tests": [test.as_json() for test in self.tests],
            "proves": self.proves,
            "cannot_prove": self.cannot_prove,
        }


Builder = Callable[[PackContext], Component]
