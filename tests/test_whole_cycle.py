"""A whole DROP cycle, end to end over real HTTP, through the interfaces people use.

Staff configure the broker (a DROP API key for the loopback DROP, a webhook integration and
an ISI integration); the broker registers its consumers through the API; ``drop pull``
downloads DROP's ZIP, imports and matches it; a real worker dispatches each match to both of
the broker's systems, which call back every outcome; ``drop report --upload`` sends DROP one
file per list with the codes the outcomes decide. Then a consumer registered later matches a
hash already reported as 5: it is dispatched, called back, and the status goes to DROP as an
amendment. The outcome export holds every step of every request and ``ledger verify`` passes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.management import call_command
from rest_framework.test import APIClient

from devtools.broker_simulator import BrokerSimulator, ReceivedRequest, sign_callback
from devtools.drop_simulator import DropSimulator, build_drop_zip, work_items
from devtools.isi_simulator import IsiSimulator
from devtools.isi_simulator import connection as isi_connection
from integrations.models import Broker, DeletionRequest, ReportFile, WorkItem
from integrations.services import drop as drop_services
from integrations.services.brokers import broker_update
from integrations.services.keys import api_key_create
from tests.builders import run_worker, worker_jobs_emptied
from tests.conftest import bearer

pytestmark = pytest.mark.django_db(transaction=True)

DROP_KEY = "dk_test_wholeCycle_42"
PACKAGE_DATE = "20260312"
CONNECTION = "7d2c0f43-1f1e-4f27-9d5e-2b8f3a3f0c11"
OPTED_OUT_EMAIL = "Ann.Smith@Example.com"
# Email list: A and B matched, C not matched (until a late consumer); Phone list: D.
A, B, C, D = work_items(4)
EMAIL_FILE = f"{PACKAGE_DATE}_4821_Email.csv"
PHONE_FILE = f"{PACKAGE_DATE}_4821_Phone.csv"


@pytest.fixture(autouse=True)
def empty_job_tables() -> Iterator[None]:
    yield from worker_jobs_emptied()


@pytest.fixture
def drop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[DropSimulator]:
    monkeypatch.setattr(drop_services, "wait", lambda seconds: None)
    monkeypatch.setattr(drop_services, "PACKAGES_DIR", tmp_path / "packages")
    with DropSimulator(api_key=DROP_KEY, broker_id="4821") as simulator:
        yield simulator


@pytest.fixture
def webhook_system() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/drop/webhook") as running:
        yield running


@pytest.fixture
def isi_system() -> Iterator[IsiSimulator]:
    with IsiSimulator(connections=[isi_connection(CONNECTION)], token="isi-static-token") as api:
        yield api


def csv_rows(content: bytes) -> dict[str, int]:
    lines = content.decode("ascii").split("\r\n")
    assert lines[0] == "Id,Status" and lines[-1] == ""
    return {line.split(",")[0]: int(line.split(",")[1]) for line in lines[1:-1]}


class BrokerSystems:
    """The broker's two systems answering, signed with the secrets staff gave them."""

    def __init__(self, *, key: str, webhook_secret: str, isi_secret: str, public_url: str):
        self.key, self.webhook_secret, self.isi_secret = key, webhook_secret, isi_secret
        self.public_url = public_url

    def webhook(self, dispatch: ReceivedRequest, outcome: str, **extra: Any) -> int:
        body = {
            "schema_version": "1.0",
            "status": "completed",
            "request_uuid": dispatch.json["request_uuid"],
            "drop_outcome": outcome,
            **extra,
        }
        raw, headers = sign_callback(self.webhook_secret, body)
        headers["Authorization"] = f"Bearer {self.key}"
        url = dispatch.json["webhook_callback_url"]
        return requests.put(url, data=raw, headers=headers, timeout=10).status_code

    def isi(self, api: IsiSimulator, delete: ReceivedRequest, outcome: str, **extra: Any) -> int:
        return api.complete(
            delete,
            outcome,
            public_url=self.public_url,
            api_key=self.key,
            secret=self.isi_secret,
            **extra,
        ).status_code


def register(client: APIClient, key: str, remote_identifier: str, hashes: dict[str, str]) -> None:
    consumer = {
        "remote_identifier": remote_identifier,
        "hashes": {t: [h] for t, h in hashes.items()},
    }
    response = client.post(
        "/api/v1/drop/consumers", {"consumers": [consumer]}, format="json", **bearer(key)
    )
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == 1, response.json()


def test_a_whole_cycle_from_registration_to_amendment(
    broker: Broker,
    drop: DropSimulator,
    webhook_system: BrokerSimulator,
    isi_system: IsiSimulator,
    live_server: Any,
    settings: Any,
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = live_server.url

    # Staff: the DROP key, one webhook integration, one ISI integration, the broker's keys.
    broker_update(broker=broker, actor="staff:alice", drop_api_key=DROP_KEY, drop_base_url=drop.url)
    out = io.StringIO()
    call_command(
        "integrations", "add", "webhook", "--broker", "4821", "--name", "Acme CRM",
        "--url", webhook_system.url, "--json", stdout=out,
    )  # fmt: skip
    webhook_secret = json.loads(out.getvalue())["webhook_secret"]
    webhook_system.secrets = [webhook_secret]
    out = io.StringIO()
    call_command(
        "integrations", "add", "isi", "--broker", "4821", "--name", "Acme API",
        "--base-url", isi_system.base_url, "--token", "isi-static-token", "--json", stdout=out,
    )  # fmt: skip
    isi_secret = json.loads(out.getvalue())["webhook_secret"]
    ingest = api_key_create(broker=broker, scopes=["ingest"], actor="test").key
    callback_key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    audit = api_key_create(broker=broker, scopes=["audit"], actor="test").key
    broker_side = BrokerSystems(
        key=callback_key,
        webhook_secret=webhook_secret,
        isi_secret=isi_secret,
        public_url=live_server.url,
    )
    api = APIClient()

    # The broker registers its consumers (hashes of A, B and D; nobody for C yet).
    register(api, ingest, "C-A", {"email": A[1]})
    register(api, ingest, "C-B", {"email": B[1]})
    register(api, ingest, "C-D", {"phone": D[1]})

    # DROP's package: pulled, imported, matched.
    drop.queue_package(build_drop_zip("4821", PACKAGE_DATE, {"Email": [A, B, C], "Phone": [D]}))
    call_command("drop", "pull", "--broker", "4821", stdout=io.StringIO())
    assert DeletionRequest.objects.count() == 6  # three consumers, two targets each

    # Dispatched to both systems; each answers every request.
    run_worker(["dispatch"])
    dispatches = {n.json["remote_identifier"]: n for n in webhook_system.wait_for(3)}
    deletes = {r.json["remote_identifier"]: r for r in isi_system.on("delete")}
    assert set(dispatches) == set(deletes) == {"C-A", "C-B", "C-D"}
    answers = [
        broker_side.webhook(dispatches["C-A"], "deleted"),
        broker_side.isi(
            isi_system,
            deletes["C-A"],
            "opted_out",
            identifiers={"email": [{"email": OPTED_OUT_EMAIL}]},
        ),
        broker_side.webhook(dispatches["C-B"], "not_found"),
        broker_side.isi(isi_system, deletes["C-B"], "deleted"),
        broker_side.webhook(dispatches["C-D"], "exempt"),
        broker_side.isi(isi_system, deletes["C-D"], "deleted"),
    ]
    assert answers == [200] * 6
    run_worker(["dispatch"])

    # The statuses go to DROP: opted_out beats deleted, deleted beats not_found and exempt,
    # no match is 5.
    call_command("drop", "report", "--broker", "4821", "--upload", stdout=io.StringIO())
    assert csv_rows(drop.uploaded[EMAIL_FILE]) == {A[0]: 4, B[0]: 3, C[0]: 5}
    assert csv_rows(drop.uploaded[PHONE_FILE]) == {D[0]: 3}

    # A consumer registered later matches C, which DROP already has as 5.
    register(api, ingest, "C-late", {"email": C[1]})
    run_worker(["dispatch"])
    late_dispatch = webhook_system.wait_for(4)[-1]
    late_delete = [r for r in isi_system.on("delete") if r.json["remote_identifier"] == "C-late"]
    assert late_dispatch.json["remote_identifier"] == "C-late"
    assert broker_side.webhook(late_dispatch, "deleted") == 200
    assert broker_side.isi(isi_system, late_delete[0], "deleted") == 200
    run_worker(["dispatch"])
    call_command("drop", "report", "--broker", "4821", "--upload", stdout=io.StringIO())

    amendment = f"{PACKAGE_DATE}_4821_Email_amend01.csv"
    assert csv_rows(drop.amended[amendment]) == {C[0]: 3}
    assert set(drop.uploaded) == {EMAIL_FILE, PHONE_FILE}  # nothing sent twice
    assert set(ReportFile.objects.values_list("state", flat=True)) == {"accepted"}
    item_c = WorkItem.objects.get(work_item_id=C[0])
    assert (item_c.state, item_c.reported_status_code, item_c.needs_amendment) == (
        "reported",
        3,
        False,
    )

    # The auditors' history holds every request, each step and where its status went.
    history = api.get("/api/v1/drop/outcomes", {"limit": 100}, **bearer(audit)).json()["results"]
    assert len(history) == 8
    for row in history:
        assert row["state"] == "completed"
        assert row["matched_at"] and row["dispatched_at"] and row["acknowledged_at"]
        assert row["completed_at"] and row["reported_at"]
    late = [row for row in history if row["remote_identifier"] == "C-late"]
    assert {(r["late_match"], r["amended"], r["report_file"]) for r in late} == {
        (True, True, amendment)
    }
    by_consumer = {(r["remote_identifier"], r["drop_outcome"]) for r in history}
    assert ("C-A", "opted_out") in by_consumer and ("C-B", "not_found") in by_consumer
    export = io.StringIO()
    call_command("outcomes", "export", "--format", "jsonl", stdout=export)
    assert len(export.getvalue().splitlines()) == 8

    # And the ledger, every step in it, verifies.
    verified = io.StringIO()
    call_command("ledger", "verify", stdout=verified)
    assert verified.getvalue().startswith("Ledger intact")
