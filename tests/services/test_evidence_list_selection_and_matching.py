"""The evidence pack's list selection and matching components, built as the export builds
them (inside its snapshot, into a pack being written), on a cycle imported through the
services: Email and Phone lists, two items matched at the import."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import zipfile
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from devtools.drop_simulator import work_items
from integrations.evidence import components as layout
from integrations.models import Broker, DropCycle
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.evidence.components import BUILDERS
from integrations.services.evidence.components.base import Builder, Component, PackContext
from integrations.services.evidence.evidence_period import Period
from integrations.services.evidence.evidence_writer import PackWriter
from integrations.services.staff.brokers import broker_lists_select
from tests.builders import ConsumerFactory, WebhookIntegrationFactory, drop_zip, write_zip

pytestmark = pytest.mark.django_db
ITEMS = list(work_items(4))


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path) -> DropCycle:
    WebhookIntegrationFactory.create(broker=broker)
    ConsumerFactory.create(broker=broker, remote_identifier="C-0", hashes={"email": ITEMS[0][1]})
    package = drop_zip(broker, {"Email": ITEMS[:2], "Phone": ITEMS[2:]})
    return drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test").cycle


def built(key: str, broker: Broker, cycle: DropCycle) -> tuple[Component, dict[str, bytes]]:
    """The component and the pack members it wrote."""
    builder: Builder = BUILDERS[key]
    out = io.BytesIO()
    writer = PackWriter(out)
    component = builder(
        PackContext(
            broker=broker,
            period=Period(broker=broker, cycle=cycle, since=None, until=None),
            writer=writer,
            exported_at=timezone.now(),
        )
    )
    writer.close()
    with zipfile.ZipFile(out) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    # What the pack's verifier checks of it: a result its tests give, its files present.
    document = {"format": layout.FORMAT, "components": {key: component.as_json()}}
    problems = layout.component_problems(document, set(members))
    assert [p for p in problems if "is missing" not in p] == []
    return component, members


def select(broker: Broker, lists: str, cycle: DropCycle, *, after: bool = False) -> None:
    moment = cycle.downloaded_at + dt.timedelta(days=1 if after else -1)
    broker_lists_select(
        broker=broker, lists=lists.split(","), reason="test", actor="test", effective_from=moment
    )


def results(component: Component) -> list[tuple[str, bool, str]]:
    return [(test.name, test.passed, test.detail) for test in component.tests]


def test_the_lists_sent_as_selected_pass(broker: Broker, cycle: DropCycle) -> None:
    select(broker, "email,phone", cycle)

    component, _ = built("list_selection", broker, cycle)

    assert component.passed
    (record,) = component.records["cycles"]
    assert (record["lists_sent"], record["lists_selected"]) == (["Email", "Phone"],) * 2


def test_a_list_never_selected_fails_and_is_named(broker: Broker, cycle: DropCycle) -> None:
    select(broker, "email,ndz", cycle)

    component, _ = built("list_selection", broker, cycle)

    assert not component.passed
    assert results(component)[1] == (
        "cycle 1: the lists DROP sent are the lists selected",
        False,
        "DROP sent Phone, which was not selected; NDZ was selected and DROP did not send it",
    )


def test_no_selection_in_force_at_the_download_fails(broker: Broker, cycle: DropCycle) -> None:
    component, _ = built("list_selection", broker, cycle)
    assert [passed for _, passed, _ in results(component)] == [False, False]
    assert "no list selection recorded for the broker" in results(component)[0][2]

    select(broker, "email,phone", cycle, after=True)  # recorded, but only from after it
    component, _ = built("list_selection", broker, cycle)
    assert [passed for _, passed, _ in results(component)] == [True, False]
    assert results(component)[1][2].startswith("no selection recorded in force at its download")


def test_matching_carries_each_cycles_rematch(broker: Broker, cycle: DropCycle) -> None:
    component, members = built("matching", broker, cycle)

    assert component.passed and component.files == ["components/matching/1.json"]
    (record,) = component.records["cycles"]
    assert (record["matched_at_import"], record["matched_now"], record["unexplained"]) == (1, 1, {})
    document = json.loads(members["components/matching/1.json"])
    assert (document["result"], document["examples"]) == ("pass", {})


def test_a_consumer_hash_registered_behind_the_services_back_fails_matching(
    broker: Broker, cycle: DropCycle
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO integrations_consumer (broker_id, remote_identifier,"
            " remote_identifier_kind) VALUES (%s, 'X-1', 'external_id') RETURNING id",
            [broker.pk],
        )
        cursor.execute(
            "INSERT INTO integrations_consumerhash (broker_id, consumer_id, hash_type, hash)"
            " VALUES (%s, %s, 'email', %s)",
            [broker.pk, cursor.fetchone()[0], base64.b64decode(ITEMS[1][1])],
        )

    component, members = built("matching", broker, cycle)

    assert not component.passed
    (test,) = component.tests
    assert test.detail == f"1 match_not_recorded (e.g. work item {ITEMS[1][0]})"
    document = json.loads(members["components/matching/1.json"])
    assert document["unexplained"] == {"match_not_recorded": 1}
    (example,) = document["examples"]["match_not_recorded"]
    assert example["work_item_id"] == ITEMS[1][0]
    assert "remote_identifier" not in example  # no consumer pointer in the pack
