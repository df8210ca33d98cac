"""A broker's "approve uploads" in the admin: the file's counts, and Approve / Reject (with
a reason), for Operators other than whoever wrote it; refused to Auditors server-side."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory

from integrations.admin.reports import ReportFileAdmin
from integrations.models import Broker, DropCycle, LedgerEvent, ReportFile, ReportFileState
from integrations.services.reporting.report_files import report_files_write
from integrations.services.staff.brokers import broker_update
from tests.builders import DropCycleFactory, WorkItemFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/integrations/reportfile/"
EMAIL = "20260312_4821_Email.csv"


def member(name: str, group: str, client: Client) -> Client:
    user = User.objects.create_user(name, f"{name}@example.com", f"pw-{name}-123", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    client.force_login(user)
    return client


@pytest.fixture
def waiting(broker: Broker) -> ReportFile:
    """An Email file with two statuses, written by the Operator alice, waiting."""
    broker_update(broker=broker, approve_uploads=True, actor="staff:carol")
    cycle: DropCycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    WorkItemFactory.create(cycle=cycle, status_code=4, work_item_id="EmailOptOut1")
    (email,) = report_files_write(broker=broker, actor="staff:alice")
    return email


def chosen(action: str, report_file: ReportFile, **form: str) -> dict[str, object]:
    return {"action": action, "_selected_action": [report_file.pk], **form}


def test_the_broker_form_sets_approve_uploads(client: Client, broker: Broker) -> None:
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw-root-123"))
    page = client.get(f"/admin/integrations/broker/{broker.pk}/change/")
    assert b'name="approve_uploads"' in page.content

    client.post(
        f"/admin/integrations/broker/{broker.pk}/change/",
        {
            "name": broker.name,
            "mode": broker.mode,
            "drop_base_url": "",
            "auto_pull": "",
            "pull_interval_days": "30",
            "approve_uploads": "on",
        },
    )

    broker.refresh_from_db()
    assert broker.approve_uploads is True
    event = LedgerEvent.objects.filter(kind="broker.updated").latest("id")
    assert event.actor == "staff:root"
    assert event.data["changes"]["approve_uploads"] == {"from": False, "to": True}


def test_generated_files_wait_and_say_so(client: Client, broker: Broker) -> None:
    broker_update(broker=broker, approve_uploads=True, actor="staff:carol")
    cycle: DropCycle = DropCycleFactory.create(broker=broker)
    WorkItemFactory.create(cycle=cycle, status_code=3, work_item_id="EmailDeleted")
    alice = member("alice", "Operators", client)

    done = alice.post(CHANGELIST + "generate/", {"cycle": cycle.pk}, follow=True)

    assert b"They wait for approval by another Operator" in done.content
    email = ReportFile.objects.get(file_name=EMAIL)
    assert (email.state, email.written_by) == (ReportFileState.AWAITING_APPROVAL, "staff:alice")


def test_an_operator_reviews_the_counts_and_approves(client: Client, waiting: ReportFile) -> None:
    bob = member("bob", "Operators", client)

    page = bob.get(f"{CHANGELIST}{waiting.pk}/change/").content.decode()
    assert "Email upload, 2 rows: 3 deleted 1, 4 opted out 1" in page
    review = bob.post(CHANGELIST, chosen("approve_files", waiting)).content.decode()
    assert "Email upload, 2 rows: 3 deleted 1, 4 opted out 1" in review
    assert "staff:alice" in review  # who wrote it

    done = bob.post(CHANGELIST, chosen("approve_files", waiting, apply="1", reason=""), follow=True)

    assert b"Approved 1 file(s)" in done.content
    waiting.refresh_from_db()
    assert (waiting.state, waiting.reviewed_by) == (ReportFileState.WRITTEN, "staff:bob")
    assert LedgerEvent.objects.get(kind="report_file.approved").actor == "staff:bob"


def test_whoever_wrote_it_cannot_approve_it(client: Client, waiting: ReportFile) -> None:
    alice = member("alice", "Operators", client)

    done = alice.post(CHANGELIST, chosen("approve_files", waiting, apply="1"), follow=True)

    assert b"a second person must approve it" in done.content
    assert ReportFile.objects.get(pk=waiting.pk).state == ReportFileState.AWAITING_APPROVAL


def test_reject_asks_for_a_reason(client: Client, waiting: ReportFile) -> None:
    bob = member("bob", "Operators", client)

    no_reason = bob.post(CHANGELIST, chosen("reject_files", waiting, apply="1", reason=""))
    assert b"This field is required" in no_reason.content
    assert ReportFile.objects.get(pk=waiting.pk).state == ReportFileState.AWAITING_APPROVAL

    bob.post(CHANGELIST, chosen("reject_files", waiting, apply="1", reason="partial export"))

    waiting.refresh_from_db()
    assert (waiting.state, waiting.review_reason) == (
        ReportFileState.NOT_APPROVED,
        "partial export",
    )
    event = LedgerEvent.objects.get(kind="report_file.approval_rejected")
    assert (event.actor, event.data["reason"]) == ("staff:bob", "partial export")


def test_an_auditor_is_refused_even_when_posting_the_actions(
    client: Client, waiting: ReportFile
) -> None:
    auditor = member("dora", "Auditors", client)
    listing = auditor.get(CHANGELIST).content
    assert b"approve_files" not in listing and b"reject_files" not in listing

    for action, form in (("approve_files", {}), ("reject_files", {"reason": "no"})):
        auditor.post(CHANGELIST, chosen(action, waiting, apply="1", **form))

    assert ReportFile.objects.get(pk=waiting.pk).state == ReportFileState.AWAITING_APPROVAL
    assert not LedgerEvent.objects.filter(kind__startswith="report_file.appro").exists()


def test_the_review_step_itself_checks_the_permission(waiting: ReportFile) -> None:
    """Called past the action's own check, as a crafted request could: still refused."""
    auditor = User.objects.create_user("erin", password="pw-erin-123", is_staff=True)
    auditor.groups.add(Group.objects.get(name="Auditors"))
    request = RequestFactory().post(CHANGELIST, {"apply": "1", "reason": "x"})
    request.user = auditor
    model_admin = admin.site._registry[ReportFile]
    assert isinstance(model_admin, ReportFileAdmin)

    for action in (model_admin.approve_files, model_admin.reject_files):
        with pytest.raises(PermissionDenied):
            action(request, ReportFile.objects.filter(pk=waiting.pk))
    assert ReportFile.objects.get(pk=waiting.pk).state == ReportFileState.AWAITING_APPROVAL
