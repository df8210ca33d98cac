"""The whole ISI cycle over real HTTP.

Staff add an ISI integration (OAuth 2.0 client credentials) whose loopback API lists three
connections, one without the DROP capabilities, and a SaaS connection. A DROP package is
imported and matched: each match gets a delete and an identifier retrieval per connection
taking part. A real worker calls the broker's API: the deletes are acknowledged
``processing`` (after the broker dropped the cached token: one refresh), the identifiers come
back at once and go to the loopback SaaS. The broker completes each delete by a signed
callback (PUT or POST, every outcome, a failure then a success); the work items end with
their DROP codes, only DROP endpoints of the broker were ever called, and the ledger verifies.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from devtools.broker_simulator import BrokerSimulator
from devtools.drop_simulator import work_items
from devtools.isi_simulator import IsiSimulator, ReceivedRequest
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    OptOutRecord,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
)
from integrations.services.keys import api_key_create
from integrations.services.ledger import ledger_seal, ledger_verify
from tests.builders import (
    CONNECTION_A,
    CONNECTION_B,
    broker_connections,
    consumer,
    drop_zip,
    run_worker,
    worker_jobs_emptied,
    write_zip,
)

pytestmark = pytest.mark.django_db(transaction=True)

OUTCOMES = ["deleted", "not_found", "opted_out", "exempt", "failed"]
OPTED_OUT_EMAIL = " Ann.Smith+Drop@Example.COM"
# What the broker resolves each consumer to; C-not_found is unknown to it.
RESOLVED = {
    f"C-{outcome}": {"email": [{"email": f"Resolved.{outcome}@Example.com"}]}
    for outcome in OUTCOMES
    if outcome != "not_found"
}
DROP_PATHS = re.compile(
    r"/oauth/token|/api/v1/connections/list"
    rf"|/api/v1/privacy/drop/delete/({CONNECTION_A}|{CONNECTION_B})"
    rf"|/api/v2/privacy/drop/identifiers/({CONNECTION_A}|{CONNECTION_B})"
)


@pytest.fixture(autouse=True)
def empty_job_tables() -> Iterator[None]:
    yield from worker_jobs_emptied()


@pytest.fixture
def broker_api() -> Iterator[IsiSimulator]:
    with IsiSimulator(connections=broker_connections(), identifiers=RESOLVED) as running:
        yield running


@pytest.fixture
def saas_system() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/v1/erase") as running:
        yield running


def _staff_set_up(broker: Broker, api: IsiSimulator, saas_url: str) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    call_command(
        "integrations", "add", "isi", "--broker", "4821", "--name", "Acme API",
        "--base-url", api.base_url, "--token-url", api.token_url,
        "--client-id", api.client_id, "--client-secret", api.client_secret, "--json",
        stdout=out,
    )  # fmt: skip
    created = json.loads(out.getvalue())
    call_command(
        "saas", "add", "--broker", "4821", "--name", "Mailer", "--url", saas_url,
        "--token", "mailer-token", "--categories", "email", stdout=io.StringIO(),
    )  # fmt: skip
    key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    return created, key


def _by_consumer(requests: list[ReceivedRequest]) -> dict[str, list[ReceivedRequest]]:
    """Each request once (a call refused 401 was made again with a new token), by consumer."""
    once = {request.json["request_uuid"]: request for request in requests}
    grouped: dict[str, list[ReceivedRequest]] = {}
    for request in once.values():
        grouped.setdefault(request.json["remote_identifier"].removeprefix("C-"), []).append(request)
    return grouped


def test_the_whole_isi_cycle(
    broker: Broker,
    broker_api: IsiSimulator,
    saas_system: BrokerSimulator,
    live_server: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = live_server.url
    created, key = _staff_set_up(broker, broker_api, saas_system.url)
    secret = created["webhook_secret"]
    assert [c["takes_part_in_drop"] for c in created["connections"]] == [True, True, False]

    # One consumer per outcome, each matched by DROP's email list.
    items = list(work_items(len(OUTCOMES)))
    for outcome, (_, email_hash) in zip(OUTCOMES, items, strict=True):
        consumer(broker, f"C-{outcome}", email=email_hash)
    package = write_zip(tmp_path, drop_zip(broker, {"Email": items}))
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())
    assert DeletionRequest.objects.count() == ResolutionRequest.objects.count() == 10

    broker_api.revoke_tokens()  # the broker rotated its tokens: the cached one is stale
    run_worker(["dispatch"])

    deletes = _by_consumer(broker_api.on("delete"))
    retrievals = _by_consumer(broker_api.on("identifiers"))
    for outcome in OUTCOMES:  # one per connection taking part
        assert len(deletes[outcome]) == len(retrievals[outcome]) == 2, outcome
    assert len(broker_api.on("delete")) == 20  # each refused with the stale token, then sent
    assert broker_api.tokens_issued == 2  # at creation, and one refresh shared by every call
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {"dispatched"}
    assert set(ResolutionRequest.objects.values_list("state", flat=True)) == {"completed"}
    assert all(
        r.json["identifier_categories"] == ["email"] for rs in retrievals.values() for r in rs
    )

    # The SaaS deletions the identifiers started (none for the consumer the broker does not
    # know: nothing to delete, so cancelled).
    run_worker(["dispatch"])
    erased = saas_system.wait_for(8)
    assert {r.headers["Authorization"] for r in erased} == {"Bearer mailer-token"}
    assert {r.json["identifiers"]["email"][0]["email"] for r in erased} == {
        f"Resolved.{o}@Example.com" for o in OUTCOMES if o != "not_found"
    }
    assert (
        sorted(SaasDeletion.objects.values_list("state", flat=True))
        == ["cancelled"] * 2 + ["completed"] * 8
    )
    assert not ResolutionRequest.objects.exclude(identifiers="").exists()  # purged

    # The broker completes each delete by calling back on callback_path, signed.
    by_consumer = deletes
    answers = []
    for outcome in OUTCOMES:
        for index, delete in enumerate(by_consumer[outcome]):
            method = "PUT" if index == 0 else "POST"
            extra: dict[str, Any] = {}
            if outcome == "opted_out":
                extra["identifiers"] = {"email": [{"email": OPTED_OUT_EMAIL}]}
            if outcome == "failed":
                extra["error_message"] = "CRM locked the record"
            answers.append(
                broker_api.complete(
                    delete,
                    outcome,
                    public_url=live_server.url,
                    api_key=key,
                    secret=secret,
                    method=method,
                    **extra,
                )
            )
    assert [a.status_code for a in answers] == [200] * 10, [a.content for a in answers]
    run_worker(["dispatch"])  # the work items' settlements, deferred with the outcomes
    failed_item = DeletionRequest.objects.filter(remote_identifier="C-failed").first()
    assert failed_item is not None
    assert WorkItem.objects.get(pk=failed_item.work_item_id).status_code is None  # not final
    for delete in by_consumer["failed"]:  # the broker retries on its side and succeeds
        again = broker_api.complete(
            delete, "deleted", public_url=live_server.url, api_key=key, secret=secret
        )
        assert again.status_code == 200
    replay = broker_api.complete(
        by_consumer["deleted"][0], "deleted", public_url=live_server.url, api_key=key, secret=secret
    )
    assert (replay.status_code, replay.json()["status"]) == (200, "unchanged")

    run_worker(["dispatch"])

    expected = {"deleted": 3, "not_found": 5, "opted_out": 4, "exempt": 2, "failed": 3}
    for outcome, code in expected.items():
        requests = DeletionRequest.objects.filter(remote_identifier=f"C-{outcome}")
        assert {r.state for r in requests} == {RequestState.COMPLETED}, outcome
        assert {r.drop_status_code for r in requests} == {code}, outcome
        item = WorkItem.objects.get(pk=requests[0].work_item_id)
        assert item.status_code == code, outcome
    assert set(OptOutRecord.objects.values_list("email", flat=True)) == {OPTED_OUT_EMAIL}

    # Only DROP endpoints of the broker were called, never its standard DSR ones, and
    # never the connection without the DROP capabilities.
    assert all(DROP_PATHS.fullmatch(path) for path in broker_api.paths), broker_api.paths
    assert not any(
        "/api/v1/privacy/delete" in p or "/privacy/access" in p for p in broker_api.paths
    )

    # The ledger tells the story, without a secret or a clear identifier, and verifies.
    ledger_text = json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))
    for kept_out in ("Ann.Smith", "Resolved.", secret, broker_api.client_secret):
        assert kept_out not in ledger_text
    assert not LedgerEvent.objects.filter(kind="callback.rejected").exists()
    ledger_seal()
    assert ledger_verify().ok
