"""The work handed to the broker's systems, and every attempt to hand it over.

- ``DeletionRequest``: one per matched consumer and deletion target (webhook integration,
  or ISI connection with both DROP capabilities). Carries every field of the dispatch body.
- ``ResolutionRequest``: asks the broker for clear identifiers (only when the broker has
  an enabled SaaS connection); its answer feeds one ``SaasDeletion`` per SaaS connection.
- ``DeliveryAttempt``: one per HTTP attempt of any of the three.
- ``OptOutRecord``: the verbatim email of an ``opted_out`` outcome.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models.functions import Now

from integrations.drop_statuses import DropStatus
from integrations.models.drop import HASH_TYPE_CHOICES
from integrations.models.fields import EncryptedTextField


class RequestState(models.TextChoices):
    PENDING = "pending", "Pending (no target yet)"
    QUEUED = "queued", "Queued for delivery"
    DISPATCHED = "dispatched", "Dispatched, awaiting callback"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed (needs attention)"
    UNDELIVERABLE = "undeliverable", "Undeliverable (needs attention)"
    CANCELLED = "cancelled", "Cancelled"


def _with_code(status: DropStatus) -> str:
    return f"{status.label} ({status.value})"


class DropOutcome(models.TextChoices):
    """A broker's answer to a deletion request ("" while there is none)."""

    DELETED = "deleted", _with_code(DropStatus.DELETED)
    NOT_FOUND = "not_found", _with_code(DropStatus.NOT_FOUND)
    OPTED_OUT = "opted_out", _with_code(DropStatus.OPTED_OUT)
    EXEMPT = "exempt", _with_code(DropStatus.EXEMPT)
    FAILED = "failed", "Failed"


# The rules of outcomes and statuses, each defined here once. The SQL functions that apply
# them (integrations/sql/) take them as arguments: services/cycle/work_items.py (settle_rules()) and
# services/dispatch/outcomes.py pass them in.

# The DROP status each final outcome gives its work item. ``failed`` gives none: it is not
# final (the broker may answer again), nor is "" (no answer yet). Plain values: they go into
# ledger data and SQL parameters as they are.
DROP_STATUS_CODES: dict[str, int] = {
    DropOutcome.EXEMPT.value: DropStatus.EXEMPT.value,
    DropOutcome.DELETED.value: DropStatus.DELETED.value,
    DropOutcome.OPTED_OUT.value: DropStatus.OPTED_OUT.value,
    DropOutcome.NOT_FOUND.value: DropStatus.NOT_FOUND.value,
}
# A deletion request's outcomes that are not final.
OUTCOMES_NOT_FINAL = ("", DropOutcome.FAILED.value)

# Which status wins when a work item's requests have different final outcomes, strongest
# first (applied by work_item_settle.sql): opted_out (4) over deleted (3) over exempt (2)
# over not_found (5). A resolution's opted_out or exempt counts as a deletion's does.
DROP_STATUS_PRECEDENCE = (
    DropStatus.OPTED_OUT,
    DropStatus.DELETED,
    DropStatus.EXEMPT,
    DropStatus.NOT_FOUND,
)
# What a work item settles to when every one of its requests was cancelled: no match remains.
DROP_STATUS_ALL_CANCELLED = DropStatus.NOT_FOUND


# Which broker outcomes are taken (the callbacks): a request takes a new outcome unless it is
# in one of these states or already has a final outcome. A deletion's outcome is final unless
# it is in OUTCOMES_NOT_FINAL (deletion_outcome_record.sql takes both as arguments, and takes
# a repeat of the same failure as a repeat, not a new outcome); a resolution's answer is
# final once given (its completed_at, services/dispatch/resolutions.py).
OUTCOME_REFUSING_STATES = (RequestState.CANCELLED.value,)


class DeliveryFields(models.Model):
    """What every delivered thing has: a state, a delivery schedule, and its attempts count."""

    state = models.CharField(max_length=16, choices=RequestState.choices)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    dispatched_at = models.DateTimeField(null=True, blank=True)  # 2xx acknowledgement
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class DeletionRequest(DeliveryFields):
    request_uuid = models.UUIDField("request UUID", default=uuid.uuid4, unique=True, editable=False)
    webhook_request_id = models.UUIDField("webhook request ID", default=uuid.uuid4, editable=False)
    # ISI only: unique where set (a partial index: most requests are a webhook's, with none;
    # NULL rather than "", which the unique index would count).
    results_token = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    # A DROP work item's request, or a canary round's (``models.canaries``): one of the two.
    work_item = models.ForeignKey(
        "integrations.WorkItem",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="deletion_requests",
    )
    canary_round = models.ForeignKey(
        "integrations.CanaryRound",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="deletion_requests",
    )
    consumer = models.ForeignKey(
        "integrations.Consumer", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    integration = models.ForeignKey(
        "integrations.Integration",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="deletion_requests",
    )
    isi_connection = models.ForeignKey(
        "integrations.IsiConnection",
        verbose_name="ISI connection",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    # The dispatch body's fields, fixed at match time.
    identifier_hash = models.CharField(max_length=44)
    hash_type = models.CharField(max_length=8, choices=HASH_TYPE_CHOICES)
    drop_session_id = models.CharField("DROP session ID", max_length=20)
    match_date = models.DateField()
    broker_id_code = models.CharField("Broker ID", max_length=4)
    mode = models.CharField(max_length=10)
    remote_identifier = models.CharField(max_length=255, blank=True, default="")
    remote_identifier_kind = models.CharField(max_length=64, blank=True, default="")
    late_match = models.BooleanField(default=False)
    # 0: the match's own request, whose outcome settles the work item's DROP status. 1, 2...:
    # a recurring deletion round (services/cycle/recurring.py), which never does.
    round = models.PositiveSmallIntegerField(default=0, db_default=0)
    matched_at = models.DateTimeField(db_default=Now())
    drop_outcome = models.CharField(
        "DROP outcome", max_length=12, choices=DropOutcome.choices, blank=True, default=""
    )
    drop_status_code = models.PositiveSmallIntegerField("DROP status code", null=True, blank=True)
    error_message = models.TextField(blank=True, default="")
    # When a redispatch last queued it again, if that was its last requeue: a redelivery
    # empties it. With no attempt since (attempts 0), a failed callback answers the dispatch
    # before the redispatch (deletion_outcome_record.sql, docs/contracts.md §5.3).
    redispatched_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When it was last redispatched; empty when never, or redelivered since.",
    )
    # Sent again by staff or the automatic policy (a redelivery or a redispatch), which starts
    # its attempts count afresh: its first send is then its first attempt's, never its
    # latest acknowledgement (the outcome history's dispatched_at).
    requeued = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Whether it was ever redelivered or redispatched.",
    )

    class Meta:
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="deletion_request_due"),
            # The outcome history's pages (selectors.outcomes): one broker's requests by id.
            # Through the primary key alone a page read past every other broker's requests.
            models.Index(fields=["broker_id_code", "id"], name="deletion_request_broker_pages"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(work_item__isnull=False, canary_round__isnull=True)
                | models.Q(work_item__isnull=True, canary_round__isnull=False),
                name="deletion_request_of_work_item_or_canary",
            ),
            # Looked up by equality only (an ISI callback's correlation), never by prefix.
            models.UniqueConstraint(
                fields=["results_token"],
                condition=models.Q(results_token__isnull=False),
                name="deletion_request_results_token",
            ),
        ]

    def __str__(self) -> str:
        return str(self.request_uuid)


class ResolutionRequest(DeliveryFields):
    request_uuid = models.UUIDField("request UUID", default=uuid.uuid4, unique=True, editable=False)
    webhook_request_id = models.UUIDField("webhook request ID", default=uuid.uuid4, editable=False)
    results_token = models.CharField(max_length=64, unique=True)
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    work_item = models.ForeignKey(
        "integrations.WorkItem", on_delete=models.PROTECT, related_name="resolution_requests"
    )
    consumer = models.ForeignKey(
        "integrations.Consumer", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    integration = models.ForeignKey(
        "integrations.Integration", on_delete=models.PROTECT, related_name="resolution_requests"
    )
    isi_connection = models.ForeignKey(
        "integrations.IsiConnection",
        verbose_name="ISI connection",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    # The notification's fields, fixed when it is made, as a deletion request's are: every
    # retry of one webhook_request_id carries the same body, whatever the broker's mode is
    # by then (docs/contracts.md §2.3).
    drop_session_id = models.CharField("DROP session ID", max_length=20)
    match_date = models.DateField()
    broker_id_code = models.CharField("Broker ID", max_length=4)
    mode = models.CharField(max_length=10)
    remote_identifier = models.CharField(max_length=255, blank=True, default="")
    remote_identifier_kind = models.CharField(max_length=64, blank=True, default="")
    round = models.PositiveSmallIntegerField(default=0, db_default=0)  # as DeletionRequest's
    # opted_out / exempt
    drop_outcome = models.CharField("DROP outcome", max_length=12, blank=True, default="")
    exemption_basis = models.CharField(max_length=100, blank=True, default="")
    # The broker's verbatim answer, encrypted; emptied once every SaaS deletion is final.
    identifiers = EncryptedTextField(blank=True, default="")
    identifiers_purged_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return str(self.request_uuid)


class SaasDeletion(DeliveryFields):
    resolution = models.ForeignKey(
        ResolutionRequest, on_delete=models.PROTECT, related_name="saas_deletions"
    )
    saas_connection = models.ForeignKey(
        "integrations.SaasConnection",
        on_delete=models.PROTECT,
        related_name="deletions",
        verbose_name="SaaS connection",
    )

    class Meta:
        verbose_name = "SaaS deletion"
        constraints = [
            models.UniqueConstraint(
                fields=["resolution", "saas_connection"], name="saas_deletion_unique"
            )
        ]

    def __str__(self) -> str:
        return f"SaaS deletion {self.pk}"


class DeliveryAttempt(models.Model):
    """One HTTP attempt: what was sent (signature included) and what came back."""

    deletion_request = models.ForeignKey(
        DeletionRequest,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="delivery_attempts",
    )
    resolution_request = models.ForeignKey(
        ResolutionRequest,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="delivery_attempts",
    )
    saas_deletion = models.ForeignKey(
        SaasDeletion,
        verbose_name="SaaS deletion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="delivery_attempts",
    )
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    url = models.URLField(max_length=1000)
    request_headers = models.JSONField(default=dict)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    response_body = models.TextField(blank=True, default="")  # first 4 KiB
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["started_at"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(
                        deletion_request__isnull=False,
                        resolution_request__isnull=True,
                        saas_deletion__isnull=True,
                    )
                    | models.Q(
                        deletion_request__isnull=True,
                        resolution_request__isnull=False,
                        saas_deletion__isnull=True,
                    )
                    | models.Q(
                        deletion_request__isnull=True,
                        resolution_request__isnull=True,
                        saas_deletion__isnull=False,
                    )
                ),
                name="delivery_attempt_has_one_subject",
            )
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} → {self.status or self.error}"


class OptOutRecord(models.Model):
    """An ``opted_out`` answer's resolved email, kept exactly as the broker stores it: from a
    deletion outcome (body §2.2, or the ISI callback) or an identifier retrieval (body §2.4)."""

    deletion_request = models.OneToOneField(
        DeletionRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="opt_out"
    )
    resolution_request = models.OneToOneField(
        ResolutionRequest,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="opt_out",
    )
    broker = models.ForeignKey("integrations.Broker", on_delete=models.PROTECT, related_name="+")
    email = EncryptedTextField()  # verbatim: no trimming, no case change
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name = "opt-out record"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(deletion_request__isnull=False, resolution_request__isnull=True)
                | models.Q(deletion_request__isnull=True, resolution_request__isnull=False),
                name="opt_out_record_has_one_request",
            ),
        ]

    def __str__(self) -> str:
        return f"opt-out for {self.request_uuid}"

    @property
    def request_uuid(self) -> uuid.UUID:
        request = self.deletion_request or self.resolution_request
        assert request is not None  # the check constraint
        return request.request_uuid
