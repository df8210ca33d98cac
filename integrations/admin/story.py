"""A work item's page tells its story: a vertical timeline above the item's fields.

``WorkItemAdmin`` passes ``story_context(work_item)`` to its page; each step links to its
record and to its ledger event (``templates/admin/integrations/workitem/story.html``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model
from django.urls import NoReverseMatch, reverse

from integrations.models import DeliveryAttempt, WorkItem
from integrations.selectors.story import work_item_story


def _record_url(record: Model | None) -> str:
    if record is None:
        return ""
    if isinstance(record, DeliveryAttempt):  # shown on its request's page
        record = record.deletion_request or record.resolution_request or record.saas_deletion
        if record is None:
            return ""
    opts = record._meta
    try:
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[record.pk])
    except NoReverseMatch:
        return ""


def story_context(work_item: WorkItem) -> dict[str, Any]:
    ledger = reverse("admin:integrations_ledgerevent_changelist")
    steps = [
        {
            "at": step.at,
            "title": step.title,
            "detail": step.detail,
            "tone": step.tone,
            "record_url": _record_url(step.record),
            "record_name": step.record._meta.verbose_name if step.record is not None else "",
            "ledger_url": (
                reverse("admin:integrations_ledgerevent_change", args=[step.ledger_event_id])
                if step.ledger_event_id
                else ""
            ),
        }
        for step in work_item_story(work_item=work_item)
    ]
    return {"story": steps, "story_ledger_url": f"{ledger}?q={work_item.work_item_id}"}
