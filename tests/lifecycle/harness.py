"""What the lifecycle model (``test_lifecycle_model.py``) runs on: the loopback DROP, the
tables emptied between examples, Procrastinate's queue taken as a worker would, and what
outlives one example."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection

from devtools.broker_simulator import BrokerSimulator
from devtools.drop_simulator import ALREADY_UPLOADED_MESSAGE, DropSimulator
from tests.lifecycle.oracle import BROKER_ID


class ModelDrop(DropSimulator):
    """DROP, which can also reject every file or say each was uploaded before; it keeps the
    status it holds per work item id, and notes an amendment of an id it never accepted."""

    def __init__(self) -> None:
        super().__init__(api_key="sim-key", broker_id=BROKER_ID, active_download=True)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.uploaded.clear()
            self.amended.clear()
            self._script.clear()
            self._names_this_download.clear()
            self._ever_uploaded = False
        self.mode = "accept"
        self.held: dict[str, int] = {}
        self.amended_unheld: list[str] = []

    def answer_as(self, mode: str) -> None:
        """How DROP answers the next report: accept, reject (every file), reject uploads
        (amendments are accepted), refuse amendments (409 to each, uploads accepted),
        already (uploaded before), down (503)."""
        self.mode = mode
        if mode == "refuse amendments":
            self.queue_response(409, body={"message": "Not now."}, times=50, path="/data/amend")
        if mode == "down":
            self.queue_response(503, body={"message": "Service unavailable."}, times=50)

    def back_up(self) -> None:
        with self._lock:
            self._script.clear()
        self.mode = "accept"

    def _check_file(self, name: str, content: bytes, *, amend: bool) -> str | None:
        if self.mode == "reject" or (self.mode == "reject uploads" and not amend):
            return "Invalid file content."
        reason = super()._check_file(name, content, amend=amend)
        if reason is None and self.mode == "already" and not amend:
            reason = ALREADY_UPLOADED_MESSAGE  # a retried upload that got through before
            self._ever_uploaded = True
        if reason is None or reason == ALREADY_UPLOADED_MESSAGE:
            self._hold(content, amend=amend)
        return reason

    def _hold(self, content: bytes, *, amend: bool) -> None:
        for work_item_id, code in report_rows(content):
            if amend and work_item_id not in self.held:
                self.amended_unheld.append(work_item_id)
            self.held[work_item_id] = code


def report_rows(content: bytes) -> list[tuple[str, int]]:
    rows = list(csv.reader(io.StringIO(content.decode())))
    assert rows[0] == ["Id", "Status"], rows[:1]
    return [(row[0], int(row[1])) for row in rows[1:] if row]


def take_due_jobs() -> list[tuple[str, dict[str, Any]]]:
    """Take the jobs that are due off Procrastinate's queue, as a worker would fetch them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM procrastinate_jobs WHERE id IN ("
            "  SELECT id FROM procrastinate_jobs WHERE status = 'todo'"
            "     AND (scheduled_at IS NULL OR scheduled_at <= now()))"
            " RETURNING id, task_name, args"
        )
        return [(name, json_value(args)) for _, name, args in sorted(cursor.fetchall())]


# The waiting delivery jobs' arguments (each one's ``request_ids``: deletion requests).
QUEUED_DELIVERIES = (
    "SELECT args FROM procrastinate_jobs WHERE status = 'todo' AND task_name = %s",
    ["integrations.tasks.deliver_deletion_requests"],
)


def json_value(value: Any) -> Any:
    """A jsonb column's value as read by a raw cursor: Django's hands it over as text (its
    JSONField decodes it)."""
    return json.loads(value) if isinstance(value, str) else value


@dataclass
class World:
    """What outlives one example: the loopback servers, the tmp folder."""

    broker_side: BrokerSimulator
    drop: ModelDrop
    tmp: Path
    steps: int = 0
    examples: int = 0
    seen: Counter[str] = field(default_factory=Counter)  # what the examples went through
