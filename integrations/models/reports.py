"""Response files sent to DROP (uploads and amendments), kept with DROP's answer."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from integrations.models.fields import ACTOR_MAX_LENGTH


class ReportKind(models.TextChoices):
    UPLOAD = "upload", "Upload (new statuses)"
    AMEND = "amend", "Amendment"


class ReportFileState(models.TextChoices):
    # The broker's "approve uploads" is on: a second person approves it before it is sent.
    AWAITING_APPROVAL = "awaiting_approval", "Waiting for approval"
    WRITTEN = "written", "Written, not uploaded"
    ACCEPTED = "accepted", "Accepted by DROP"
    REJECTED = "rejected", "Rejected by DROP"
    MANUAL = "manual", "Marked uploaded by hand"
    # DROP refused the call for this file alone (a 409, a 400 without a per-file answer):
    # sent again by every run until DROP takes it, or staff discard it (an amendment).
    REFUSED = "refused", "Refused by DROP, sent again each run"
    DISCARDED = "discarded", "Discarded by staff"
    # The approver said no: never sent; its rows went back to owed, for a new file.
    NOT_APPROVED = "not_approved", "Not approved, not uploaded"


# The states of a file DROP has not answered for good: sent again until it does.
AWAITING_DROP = (ReportFileState.WRITTEN, ReportFileState.REFUSED)
# The states of a file whose rows are taken by it and not yet held by DROP: waiting for
# approval, or for DROP's answer.
NOT_YET_TAKEN = (ReportFileState.AWAITING_APPROVAL, *AWAITING_DROP)


class ReportFile(models.Model):
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    cycle = models.ForeignKey(
        "integrations.DropCycle", on_delete=models.PROTECT, related_name="report_files"
    )
    kind = models.CharField(max_length=8, choices=ReportKind.choices)
    file_name = models.CharField(max_length=255)
    rows = models.PositiveIntegerField()
    sha256 = models.CharField("SHA-256", max_length=64)  # digest of the exact bytes
    content = models.BinaryField()
    state = models.CharField(
        max_length=20, choices=ReportFileState.choices, default=ReportFileState.WRITTEN
    )
    # Who wrote it (the ledger's actor): its approver must be someone else.
    written_by = models.CharField(max_length=ACTOR_MAX_LENGTH, blank=True, default="")
    drop_response = models.JSONField("DROP's answer", default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    uploaded_at = models.DateTimeField(null=True, blank=True)
    # Handed to DROP (committed before the call) and DROP's answer not recorded yet: DROP may
    # already be notifying about it, so its notifications wait (``DropNotification
    # .awaiting_report_file``). Cleared with the answer; kept when the call failed, since
    # DROP may hold the file all the same.
    sending_since = models.DateTimeField("being sent since", null=True, blank=True)
    # Staff gave up an amendment DROP refuses or rejected (``report_file_discard``).
    discard_reason = models.TextField(blank=True, default="")
    discarded_by = models.CharField(max_length=ACTOR_MAX_LENGTH, blank=True, default="")
    discarded_at = models.DateTimeField(null=True, blank=True)
    # The second person's decision (``report_file_approve``/``report_file_reject``).
    reviewed_by = models.CharField(max_length=ACTOR_MAX_LENGTH, blank=True, default="")
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("approve_reportfile", "Can approve or reject a response file before its upload")
        ]
        constraints = [
            models.UniqueConstraint(fields=["cycle", "file_name"], name="report_file_name_unique")
        ]

    def __str__(self) -> str:
        return self.file_name
