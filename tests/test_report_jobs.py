"""The periodic report job: one job per broker with a DROP API key, run by a real worker."""

from __future__ import annotations

import logging

import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings
from procrastinate.contrib.django.models import ProcrastinateJob

from devtools.drop_simulator import DropSimulator
from integrations import tasks
from integrations.models import Broker, ReportFile, ReportFileState
from integrations.services.staff.brokers import broker_create
from tests.builders import (
    DropCycleFactory,
    WorkItemFactory,
    run_worker,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _reporting_to(drop: DropSimulator) -> Broker:
    """Broker 4821, reporting to ``drop`` with its key."""
    return broker_create(
        broker_id="4821",
        name="Acme",
        mode="test",
        drop_api_key=drop.api_key,
        drop_base_url=drop.url,
        actor="test",
    )


def test_a_complete_cycle_is_uploaded_by_the_job(drop: DropSimulator) -> None:
    keyed = _reporting_to(drop)
    manual = broker_create(broker_id="1234", name="By hand", mode="test", actor="test")
    for broker in (keyed, manual):
        WorkItemFactory.create(
            cycle=DropCycleFactory.create(broker=broker),
            status_code=3,
            work_item_id=f"Item{broker.broker_id}0000",
        )

    assert tasks.report_due() == 1
    assert tasks.report_due() == 0  # one waiting job per broker
    run_worker()

    assert drop.uploaded == {"20260312_4821_Email.csv": b"Id,Status\r\nItem48210000,3\r\n"}
    (report_file,) = keyed_files(keyed)
    assert report_file.state == ReportFileState.ACCEPTED
    assert not keyed_files(manual)  # no key: manual mode, nothing written for it
    assert len(drop.calls("/data/upload")) == 1
    jobs = ProcrastinateJob.objects.filter(task_name="integrations.tasks.report_broker")
    assert set(jobs.values_list("status", flat=True)) == {"succeeded"}


@override_settings(DROPPORTAL_AUTO_REPORT=False)
def test_the_job_can_be_turned_off(drop: DropSimulator) -> None:
    broker_create(
        broker_id="4821", name="Acme", mode="test", drop_api_key=drop.api_key, actor="test"
    )
    assert tasks.report_due() == 0


def keyed_files(broker: Broker) -> list[ReportFile]:
    return list(ReportFile.objects.filter(broker=broker))


def test_a_stored_drop_key_the_client_refuses_is_one_warning_not_a_failing_job(
    drop: DropSimulator, caplog: pytest.LogCaptureFixture
) -> None:
    broker = _reporting_to(drop)
    # Stored before keys were checked on entry: pasted with a trailing space.
    Broker.objects.filter(pk=broker.pk).update(drop_api_key=drop.api_key + " ")
    WorkItemFactory.create(cycle=DropCycleFactory.create(broker=broker), status_code=3)
    caplog.set_level(logging.WARNING)

    tasks.report_broker(broker.pk)  # no exception: retrying every 15 minutes cannot help

    (record,) = caplog.records
    assert record.getMessage() == (
        "report for 4821 not run: broker 4821 cannot reach DROP: DROP API key must be "
        "non-empty printable ASCII without spaces; enter it again in the admin"
    )
    assert record.exc_info is None
    assert drop.calls("/data/upload") == []
    assert not keyed_files(broker)


def test_a_run_refused_for_another_reason_still_fails_the_job(
    drop: DropSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _reporting_to(drop)

    def refused(**_: object) -> None:
        raise ValidationError("cannot write a response file: the disk is full")

    # Only a stored key or URL the client refuses is a warning: a file that cannot be
    # written fails the job, where staff see it among the failed jobs.
    monkeypatch.setattr(tasks, "report_auto", refused)
    with pytest.raises(ValidationError, match="disk is full"):
        tasks.report_broker(broker.pk)
