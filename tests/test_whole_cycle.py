"""The whole DROP cycle, end to end over real HTTP, through the interfaces people use, for each
kind of target: a webhook integration (``BrokerSimulator``) and an ISI integration
(``IsiSimulator``), each with its own loopback broker.

``test_the_whole_cycle`` runs once per kind. Staff add the integration and a SaaS
connection; a DROP package is imported and matched, one consumer per outcome; a real worker
delivers to the broker's system, which answers every outcome (deleted, not_found, opted_out,
exempt, failed then deleted), a replay and a contradiction; the resolved identifiers go to a
loopback SaaS and are purged once it took them. The work items end with their DROP codes, the
opt-out records hold the verbatim emails, and the ledger tells it all, without a secret or a
clear identifier, and verifies.

- webhook: the deletion dispatches and the identifier retrieval notifications are signed
  with the secret the broker was given, and each is answered by a signed PUT callback to
  the running service, the identifier retrievals included (identifiers, opted_out, exempt).
- ISI: OAuth 2.0 client credentials, a broker API listing three connections, one without
  the DROP capabilities; each match gets a delete and an identifier retrieval per connection
  taking part. The deletes are acknowledged ``processing`` (after the broker dropped the
  cached token: one refresh), the identifiers come back at once; the broker completes each
  delete by a signed callback (PUT or POST). Only DROP endpoints of the broker are called.

``test_a_whole_cycle_from_registration_to_amendment`` has both kinds at once on one broker:
staff configure the broker (a DROP API key for the loopback DROP, a webhook integration and
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
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from django.core.management import call_command
from rest_framework.test import APIClient

from devtools.broker_simulator import BrokerSimulator, ReceivedRequest, sign_callback
from devtools.drop_simulator import DropSimulator, build_drop_zip, work_items
from devtools.isi_simulator import IsiSimulator
from devtools.isi_simulator import connection as isi_connection
from integrations.models import (
    Broker,
    DeletionRequest,
    LedgerEvent,
    OptOutRecord,
    ReportFile,
    RequestState,
    ResolutionRequest,
    SaasDeletion,
    WorkItem,
)
from integrations.services.cycle import drop as drop_services
from integrations.services.ledger import ledger_seal, ledger_verify
from integrations.services.staff.brokers import broker_update
from integrations.services.staff.keys import api_key_create
from tests.builders import (
    CONNECTION_A,
    CONNECTION_B,
    ConsumerFactory,
    broker_connections,
    drop_zip,
    run_worker,
    write_zip,
)
from tests.conftest import bearer

pytestmark = pytest.mark.django_db(transaction=True)

OUTCOMES = ["deleted", "not_found", "opted_out", "exempt", "failed"]
OPTED_OUT_EMAIL = " Ann.Smith+Drop@Example.COM"
# What the ISI broker resolves each consumer to; C-not_found is unknown to it.
RESOLVED = {
    f"C-{outcome}": {"email": [{"email": f"Resolved.{outcome}@Example.com"}]}
    for outcome in OUTCOMES
    if outcome != "not_found"
}
# What the webhook broker answers each identifier retrieval with.
RESOLVED_EMAIL = {"email": [{"email": "Resolved.Person@Example.com"}]}
DROP_PATHS = re.compile(
    r"/oauth/token|/api/v1/connections/list"
    rf"|/api/v1/privacy/drop/delete/({CONNECTION_A}|{CONNECTION_B})"
    rf"|/api/v2/privacy/drop/identifiers/({CONNECTION_A}|{CONNECTION_B})"
)


# ------------------------------------------------------------------ each kind's broker


class WebhookSide:
    """The broker's webhook system: a loopback receiver checking every signature, and the
    signed callbacks it sends, its API key as bearer."""

    targets = 1  # deletion requests per matched consumer

    def __init__(self, system: BrokerSimulator) -> None:
        self.system = system
        self.secret = self.key = ""

    def staff_add(self) -> dict[str, Any]:
        out = io.StringIO()
        call_command(
            "integrations", "add", "webhook", "--broker", "4821", "--name", "Acme CRM",
            "--url", self.system.url, "--json", stdout=out,
        )  # fmt: skip
        created: dict[str, Any] = json.loads(out.getvalue())
        self.secret = created["webhook_secret"]
        self.system.secrets = [self.secret]
        return created

    def put(
        self, notification: ReceivedRequest, body: dict[str, Any], method: str = "PUT"
    ) -> requests.Response:
        raw, headers = sign_callback(self.secret, body)
        headers["Authorization"] = f"Bearer {self.key}"
        url = notification.json["webhook_callback_url"]
        return requests.request(method, url, data=raw, headers=headers, timeout=10)

    def outcome(
        self, dispatch: ReceivedRequest, outcome: str, *, method: str = "PUT", **extra: Any
    ) -> requests.Response:
        body = {
            "schema_version": "1.0",
            "status": "completed",
            "request_uuid": dispatch.json["request_uuid"],
            "drop_outcome": outcome,
            **extra,
        }
        return self.put(dispatch, body, method)

    def resolved(self, notification: ReceivedRequest, **answer: Any) -> requests.Response:
        body = {"status": "completed", "results_token": notification.json["results_token"]}
        return self.put(notification, {**body, **answer})


class IsiSide:
    """The broker's ISI API, and the signed completion callbacks it sends."""

    def __init__(
        self, system: IsiSimulator, *, auth: list[str], public_url: str, targets: int
    ) -> None:
        self.system, self.auth, self.public_url = system, auth, public_url
        self.targets = targets  # deletion requests per matched consumer
        self.secret = self.key = ""

    def staff_add(self) -> dict[str, Any]:
        out = io.StringIO()
        call_command(
            "integrations", "add", "isi", "--broker", "4821", "--name", "Acme API",
            "--base-url", self.system.base_url, *self.auth, "--json", stdout=out,
        )  # fmt: skip
        created: dict[str, Any] = json.loads(out.getvalue())
        self.secret = created["webhook_secret"]
        return created

    def outcome(
        self, delete: ReceivedRequest, outcome: str, *, method: str = "PUT", **extra: Any
    ) -> requests.Response:
        return self.system.complete(
            delete,
            outcome,
            public_url=self.public_url,
            api_key=self.key,
            secret=self.secret,
            method=method,
            **extra,
        )


@pytest.fixture
def webhook_side() -> Iterator[WebhookSide]:
    with BrokerSimulator(path="/drop/webhook") as system:
        yield WebhookSide(system)


@pytest.fixture
def isi_side(live_server: Any) -> Iterator[IsiSide]:
    """OAuth 2.0 client credentials; two connections take part in DROP, a third does not."""
    with IsiSimulator(connections=broker_connections(), identifiers=RESOLVED) as system:
        auth = [
            "--token-url", system.token_url,
            "--client-id", system.client_id, "--client-secret", system.client_secret,
        ]  # fmt: skip
        yield IsiSide(system, auth=auth, public_url=live_server.url, targets=2)


@pytest.fixture
def isi_static_side(live_server: Any) -> Iterator[IsiSide]:
    """A static token; one connection."""
    connections = [isi_connection(CONNECTION_A)]
    with IsiSimulator(connections=connections, token="isi-static-token") as system:
        auth = ["--token", "isi-static-token"]
        yield IsiSide(system, auth=auth, public_url=live_server.url, targets=1)


@pytest.fixture(params=["webhook", "isi"])
def side(request: pytest.FixtureRequest) -> WebhookSide | IsiSide:
    """Each kind of target in turn, with its own broker."""
    chosen: WebhookSide | IsiSide = request.getfixturevalue(f"{request.param}_side")
    return chosen


@pytest.fixture
def saas_system() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(path="/v1/erase") as running:
        yield running


def _by_consumer(requests: list[ReceivedRequest]) -> dict[str, list[ReceivedRequest]]:
    """Each request once (a call refused 401 was made again with a new token), by consumer."""
    once = {request.json["request_uuid"]: request for request in requests}
    grouped: dict[str, list[ReceivedRequest]] = {}
    for request in once.values():
        grouped.setdefault(request.json["remote_identifier"].removeprefix("C-"), []).append(request)
    return grouped


# ------------------------------------------------------------------ every outcome, per kind


def test_the_whole_cycle(
    side: WebhookSide | IsiSide,
    broker: Broker,
    saas_system: BrokerSimulator,
    live_server: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = live_server.url

    # Staff: the integration, a SaaS connection, the broker's callback key.
    created = side.staff_add()
    if isinstance(side, IsiSide):
        assert [c["takes_part_in_drop"] for c in created["connections"]] == [True, True, False]
    call_command(
        "saas", "add", "--broker", "4821", "--name", "Mailer", "--url", saas_system.url,
        "--token", "mailer-token", "--categories", "email", stdout=io.StringIO(),
    )  # fmt: skip
    side.key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key

    # One consumer per outcome, each matched by DROP's email list.
    items = list(work_items(len(OUTCOMES)))
    for outcome, (_, email_hash) in zip(OUTCOMES, items, strict=True):
        ConsumerFactory.create(
            broker=broker, remote_identifier=f"C-{outcome}", hashes={"email": email_hash}
        )
    package = write_zip(tmp_path, drop_zip(broker, {"Email": items}))
    call_command("drop", "import", "--broker", "4821", str(package), stdout=io.StringIO())
    requested = side.targets * len(OUTCOMES)
    assert DeletionRequest.objects.count() == ResolutionRequest.objects.count() == requested

    # A real worker delivers the deletions and the identifier retrievals.
    if isinstance(side, IsiSide):
        side.system.revoke_tokens()  # the broker rotated its tokens: the cached one is stale
    run_worker(["dispatch"])

    if isinstance(side, WebhookSide):
        notifications = side.system.wait_for(2 * len(OUTCOMES))
        assert all(n.signature_ok for n in notifications), [
            n.signature_error for n in notifications
        ]
        dispatches = {
            n.json["remote_identifier"].removeprefix("C-"): n
            for n in notifications
            if n.json["topic"] == "drop.deletion:create"
        }
        resolutions = {
            n.json["identifiers"]["external_id"][0]["external_id"].removeprefix("C-"): n
            for n in notifications
            if n.json["topic"] == "drop.resolution:create"
        }
        assert set(dispatches) == set(resolutions) == set(OUTCOMES)
        assert {urlsplit(n.json["webhook_callback_url"]).path for n in notifications} == {
            "/api/v1/drop/callbacks/deletion",
            "/api/v1/drop/callbacks/resolution",
        }
        deletes = {outcome: [dispatch] for outcome, dispatch in dispatches.items()}
    else:
        api = side.system
        deletes = _by_consumer(api.on("delete"))
        retrievals = _by_consumer(api.on("identifiers"))
        for outcome in OUTCOMES:  # one per connection taking part
            assert len(deletes[outcome]) == len(retrievals[outcome]) == 2, outcome
        assert len(api.on("delete")) == 20  # each refused with the stale token, then sent
        assert api.tokens_issued == 2  # at creation, and one refresh shared by every call
        assert set(ResolutionRequest.objects.values_list("state", flat=True)) == {"completed"}
        assert all(
            r.json["identifier_categories"] == ["email"] for rs in retrievals.values() for r in rs
        )
    assert set(DeletionRequest.objects.values_list("state", flat=True)) == {"dispatched"}

    # The identifiers: a webhook broker answers each retrieval by a callback (clear
    # identifiers, or why not to delete); an ISI one gave them in its answer.
    if isinstance(side, WebhookSide):
        resolution_answers = [
            side.resolved(resolutions["deleted"], identifiers=RESOLVED_EMAIL),
            side.resolved(resolutions["not_found"], identifiers=RESOLVED_EMAIL),
            side.resolved(resolutions["failed"], identifiers=RESOLVED_EMAIL),
            side.resolved(
                resolutions["opted_out"], drop_outcome="opted_out", identifiers=RESOLVED_EMAIL
            ),
            side.resolved(
                resolutions["exempt"], drop_outcome="exempt", exemption_basis="legal_hold"
            ),
        ]
        assert [a.status_code for a in resolution_answers] == [200] * 5
        assert SaasDeletion.objects.count() == 3  # none for opted_out or exempt
        assert ResolutionRequest.objects.exclude(identifiers="").count() == 3  # kept, encrypted

    # The SaaS deletions the identifiers started.
    run_worker(["dispatch"])
    if isinstance(side, WebhookSide):
        erased = saas_system.wait_for(3)
        assert all(r.json["identifiers"] == RESOLVED_EMAIL for r in erased)
        assert set(SaasDeletion.objects.values_list("state", flat=True)) == {"completed"}
    else:
        # None for the consumer the broker does not know: nothing to delete, so cancelled.
        erased = saas_system.wait_for(8)
        assert {r.json["identifiers"]["email"][0]["email"] for r in erased} == {
            f"Resolved.{o}@Example.com" for o in OUTCOMES if o != "not_found"
        }
        assert (
            sorted(SaasDeletion.objects.values_list("state", flat=True))
            == ["cancelled"] * 2 + ["completed"] * 8
        )
    assert {r.headers["Authorization"] for r in erased} == {"Bearer mailer-token"}
    assert not ResolutionRequest.objects.exclude(identifiers="").exists()  # purged

    # The broker processes each deletion and calls back, signed (an ISI broker on the
    # delete's callback_path, by PUT or POST).
    answers = []
    for outcome in OUTCOMES:
        for index, delete in enumerate(deletes[outcome]):
            extra: dict[str, Any] = {}
            if outcome == "opted_out":
                extra["identifiers"] = {"email": [{"email": OPTED_OUT_EMAIL}]}
            if outcome == "failed":
                extra["error_message"] = "CRM locked the record"
            method = "PUT" if index == 0 else "POST"
            answers.append(side.outcome(delete, outcome, method=method, **extra))
    assert [a.status_code for a in answers] == [200] * requested, [a.content for a in answers]
    run_worker(["dispatch"])  # the work items' settlements, deferred with the outcomes
    failed = DeletionRequest.objects.filter(remote_identifier="C-failed")
    assert {(r.state, r.error_message) for r in failed} == {("failed", "CRM locked the record")}
    assert WorkItem.objects.get(deletion_requests=failed[0]).status_code is None  # not final

    # A retry on the broker's side then succeeds; a replay changes nothing; a contradiction
    # is refused.
    for delete in deletes["failed"]:
        assert side.outcome(delete, "deleted").status_code == 200
    replay = side.outcome(deletes["deleted"][0], "deleted")
    assert (replay.status_code, replay.json()["status"]) == (200, "unchanged")
    conflict = side.outcome(deletes["deleted"][0], "not_found")
    assert (conflict.status_code, conflict.json()["code"]) == (409, "outcome_conflict")
    run_worker(["dispatch"])

    expected = {"deleted": 3, "not_found": 5, "opted_out": 4, "exempt": 2, "failed": 3}
    for outcome, code in expected.items():
        requests_ = DeletionRequest.objects.filter(remote_identifier=f"C-{outcome}")
        assert len(requests_) == side.targets, outcome
        assert {r.state for r in requests_} == {RequestState.COMPLETED}, outcome
        assert {r.drop_status_code for r in requests_} == {code}, outcome
        assert WorkItem.objects.get(deletion_requests=requests_[0]).status_code == code, outcome
    if isinstance(side, WebhookSide):
        assert OptOutRecord.objects.get(deletion_request__isnull=False).email == OPTED_OUT_EMAIL
        assert OptOutRecord.objects.get(resolution_request__isnull=False).email == (
            "Resolved.Person@Example.com"
        )
    else:
        assert set(OptOutRecord.objects.values_list("email", flat=True)) == {OPTED_OUT_EMAIL}
        # Only DROP endpoints of the broker were called, never its standard DSR ones, and
        # never the connection without the DROP capabilities.
        paths = side.system.paths
        assert all(DROP_PATHS.fullmatch(path) for path in paths), paths
        assert not any("/api/v1/privacy/delete" in p or "/privacy/access" in p for p in paths)

    # The ledger tells the story, without a secret or a clear identifier, and its chain
    # verifies.
    for request in DeletionRequest.objects.all():
        kinds = list(
            LedgerEvent.objects.filter(subject=str(request.request_uuid))
            .order_by("id")
            .values_list("kind", flat=True)
        )
        assert kinds[0] == "deletion_request.delivered"
        assert "deletion_request.outcome_recorded" in kinds
    assert LedgerEvent.objects.filter(kind="callback.rejected").count() == 1  # the conflict
    purged = LedgerEvent.objects.filter(kind="resolution_request.identifiers_purged").count()
    # Webhook: the three answers with identifiers; ISI: all ten retrievals, answered at once.
    assert purged == (3 if isinstance(side, WebhookSide) else 10)
    ledger_text = json.dumps(list(LedgerEvent.objects.values_list("data", flat=True)))
    kept_out = ["Ann.Smith", "Resolved.", side.secret]
    if isinstance(side, IsiSide):
        kept_out.append(side.system.client_secret)
    for text in kept_out:
        assert text not in ledger_text
    ledger_seal()
    assert ledger_verify().ok


# ------------------------------------------------------------------ both kinds, to an amendment

DROP_KEY = "dk_test_wholeCycle_42"
PACKAGE_DATE = "20260312"
AMENDMENT_OPTED_OUT_EMAIL = "Ann.Smith@Example.com"
# Email list: A and B matched, C not matched (until a late consumer); Phone list: D.
A, B, C, D = work_items(4)
EMAIL_FILE = f"{PACKAGE_DATE}_4821_Email.csv"
PHONE_FILE = f"{PACKAGE_DATE}_4821_Phone.csv"


@pytest.fixture
def drop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[DropSimulator]:
    monkeypatch.setattr(drop_services, "wait", lambda seconds: None)
    monkeypatch.setattr(drop_services, "PACKAGES_DIR", tmp_path / "packages")
    with DropSimulator(api_key=DROP_KEY, broker_id="4821") as simulator:
        yield simulator


def csv_rows(content: bytes) -> dict[str, int]:
    lines = content.decode("ascii").split("\r\n")
    assert lines[0] == "Id,Status" and lines[-1] == ""
    return {line.split(",")[0]: int(line.split(",")[1]) for line in lines[1:-1]}


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
    webhook_side: WebhookSide,
    isi_static_side: IsiSide,
    live_server: Any,
    settings: Any,
) -> None:
    settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
    settings.DROPPORTAL_PUBLIC_URL = live_server.url
    webhook_system, isi_system = webhook_side.system, isi_static_side.system

    # Staff: the DROP key, one webhook integration, one ISI integration, the broker's keys.
    broker_update(broker=broker, actor="staff:alice", drop_api_key=DROP_KEY, drop_base_url=drop.url)
    webhook_side.staff_add()
    isi_static_side.staff_add()
    ingest = api_key_create(broker=broker, scopes=["ingest"], actor="test").key
    callback_key = api_key_create(broker=broker, scopes=["webhook_callback"], actor="test").key
    audit = api_key_create(broker=broker, scopes=["audit"], actor="test").key
    webhook_side.key = isi_static_side.key = callback_key
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
        webhook_side.outcome(dispatches["C-A"], "deleted"),
        isi_static_side.outcome(
            deletes["C-A"],
            "opted_out",
            identifiers={"email": [{"email": AMENDMENT_OPTED_OUT_EMAIL}]},
        ),
        webhook_side.outcome(dispatches["C-B"], "not_found"),
        isi_static_side.outcome(deletes["C-B"], "deleted"),
        webhook_side.outcome(dispatches["C-D"], "exempt"),
        isi_static_side.outcome(deletes["C-D"], "deleted"),
    ]
    assert [a.status_code for a in answers] == [200] * 6
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
    assert webhook_side.outcome(late_dispatch, "deleted").status_code == 200
    assert isi_static_side.outcome(late_delete[0], "deleted").status_code == 200
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
    # An amendment moves reported_at; the first status DROP took stays, for the days to respond.
    for row in late:
        assert row["first_reported_at"] and row["first_reported_at"] < row["reported_at"]
    by_consumer = {(r["remote_identifier"], r["drop_outcome"]) for r in history}
    assert ("C-A", "opted_out") in by_consumer and ("C-B", "not_found") in by_consumer
    export = io.StringIO()
    call_command("outcomes", "export", "--format", "jsonl", stdout=export)
    assert len(export.getvalue().splitlines()) == 8

    # And the ledger, every step in it, verifies.
    verified = io.StringIO()
    call_command("ledger", "verify", stdout=verified)
    assert verified.getvalue().startswith("Ledger intact")
