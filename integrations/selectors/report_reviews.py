"""What an approver reviews before a response file goes to DROP (a broker's "approve
uploads"): the file's list and how many rows carry each status::

    review = report_file_review(report_file)
    review.list_type, review.by_status        # "Email", {2: 0, 3: 120, 4: 8, 5: 31}
    report_files_awaiting_approval(broker=broker)   # oldest first
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from integrations.drop.files import parse_file_name
from integrations.drop.reporting import response_status_counts
from integrations.drop_statuses import DropStatus
from integrations.models import Broker, ReportFile, ReportFileState


@dataclass(frozen=True)
class ReportFileReview:
    file_name: str
    kind: str
    list_type: str  # the DROP list the file answers (Email, Phone, ...)
    rows: int
    by_status: dict[int, int]  # every DROP status code, 0 when none

    def as_json(self) -> dict[str, Any]:
        return {
            "file_name": self.file_name,
            "kind": self.kind,
            "list": self.list_type,
            "rows": self.rows,
            "statuses": {str(code): n for code, n in self.by_status.items()},
        }

    @property
    def text(self) -> str:
        """``Email upload, 159 rows: 3 deleted 120, 4 opted out 8, 5 not found 31``."""
        counts = ", ".join(
            f"{code} {DropStatus(code).label.lower()} {n}"
            for code, n in self.by_status.items()
            if n
        )
        return f"{self.list_type} {self.kind}, {self.rows} rows: {counts or 'none'}"


def report_file_review(report_file: ReportFile) -> ReportFileReview:
    """The counts of ``report_file``, read from the very bytes DROP would get."""
    content = bytes(
        ReportFile.objects.filter(pk=report_file.pk).values_list("content", flat=True).get()
    )
    return ReportFileReview(
        file_name=report_file.file_name,
        kind=report_file.kind,
        list_type=parse_file_name(report_file.file_name).data_type,
        rows=report_file.rows,
        by_status=response_status_counts(content),
    )


def report_files_awaiting_approval(*, broker: Broker | None = None) -> QuerySet[ReportFile]:
    """Files waiting for a second person, oldest first (without their bytes)."""
    files = ReportFile.objects.filter(state=ReportFileState.AWAITING_APPROVAL)
    if broker is not None:
        files = files.filter(broker=broker)
    return files.select_related("broker", "cycle").defer("content").order_by("created_at", "pk")
