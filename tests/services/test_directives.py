"""Directives to service providers and contractors: a match issues one per provider, signed
with the evidence key; one with an S3 prefix is written there (a real S3-compatible server
on loopback, moto's); an acknowledgement is recorded once; one overdue alerts."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import io
import json
import socket
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from cryptography.exceptions import InvalidSignature
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from procrastinate.contrib.django.models import ProcrastinateJob
from psycopg import sql

from devtools.databases import database_drop
from devtools.drop_simulator import work_items
from integrations import enqueue, tasks
from integrations.consumers.sources import SourceError
from integrations.drop.calendar import drop_moment, drop_today
from integrations.evidence import components, pack
from integrations.evidence.directives import directive_verify
from integrations.ledger_kinds import LedgerKind
from integrations.models import (
    Broker,
    Directive,
    DirectiveReason,
    LedgerEvent,
    ServiceProvider,
    WorkItem,
    WorkItemState,
)
from integrations.services.cycle.drop_import import drop_zip_import
from integrations.services.cycle.matching import consumer_hashes_match_late, late_added_create
from integrations.services.providers import directives as directives_service
from integrations.services.providers.directives import directive_acknowledge, directives_issue
from integrations.services.providers.providers import service_provider_add
from integrations.services.staff.alerts import alerts_evaluate
from tests.builders import BrokerFactory, ConsumerFactory, DirectiveFactory, drop_zip, write_zip
from tests.conftest import s3_reached_at

pytestmark = pytest.mark.django_db

ITEMS = list(work_items(6))
EMAIL, PHONE = ITEMS[:4], ITEMS[4:]


def evidence_public_key() -> Any:
    """The key ``evidence public-key`` prints: what a provider is given to verify with."""
    out = io.StringIO()
    call_command("evidence", "public-key", stdout=out)
    return pack.load_public_key(out.getvalue())


def import_package(broker: Broker, directory: Path) -> None:
    path = write_zip(directory, drop_zip(broker, {"Email": EMAIL, "Phone": PHONE}))
    drop_zip_import(broker=broker, path=path, actor="test")


@pytest.fixture
def provider(broker: Broker) -> ServiceProvider:
    return service_provider_add(
        broker=broker, name="Mailhouse", contact="ops@mailhouse.example", actor="test"
    )


@pytest.fixture
def matched(broker: Broker, provider: ServiceProvider, tmp_path: Path) -> Directive:
    """A DROP cycle whose first email and first phone match a consumer each."""
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    ConsumerFactory.create(broker=broker, remote_identifier="C-2", hashes={"phone": PHONE[0][1]})
    import_package(broker, tmp_path)
    return Directive.objects.get(provider=provider)


def test_a_match_directs_each_provider_with_a_signed_csv_of_the_matched_hashes(
    broker: Broker, provider: ServiceProvider, matched: Directive
) -> None:
    content = bytes(matched.content)
    assert content.decode() == (
        "hash_type,hash\n" + "".join(sorted([f"email,{EMAIL[0][1]}\n", f"phone,{PHONE[0][1]}\n"]))
    )
    assert matched.reason == DirectiveReason.MATCH
    assert (matched.rows, matched.rows_by_hash_type) == (2, {"email": 1, "phone": 1})
    assert matched.sha256 == hashlib.sha256(content).hexdigest()
    public_key = evidence_public_key()
    directive_verify(public_key, content, f"{matched.signature}\n".encode())
    assert matched.key_fingerprint == pack.key_fingerprint(public_key)
    # One byte changed and the signature no longer holds.
    with pytest.raises(InvalidSignature):
        directive_verify(public_key, content + b"\n", f"{matched.signature}\n".encode())
    event = LedgerEvent.objects.get(kind=LedgerKind.DIRECTIVE_ISSUED)
    assert event.subject == str(matched.pk)
    assert event.data["sha256"] == matched.sha256
    assert event.data["rows_by_hash_type"] == {"email": 1, "phone": 1}
    assert event.data["delivery"] == "download"
    # A download provider needs no job.
    assert not ProcrastinateJob.objects.filter(task_name=enqueue.DELIVER_DIRECTIVE).exists()


def test_no_match_or_no_provider_issues_nothing(
    broker: Broker, tmp_path: Path, provider: ServiceProvider
) -> None:
    import_package(broker, tmp_path)  # no consumer registered: nothing matched
    assert not Directive.objects.exists()
    other = BrokerFactory.create(broker_id="4822", name="Other")
    assert directives_issue(broker=other, work_items=[1], reason=DirectiveReason.MATCH) == []


def test_a_late_match_issues_its_own_directive_of_the_new_matches_only(
    broker: Broker, provider: ServiceProvider, matched: Directive
) -> None:
    with transaction.atomic():
        late = ConsumerFactory.create(
            broker=broker, remote_identifier="C-3", hashes={"email": EMAIL[1][1]}
        )
        added = late_added_create()
        with connection.cursor() as cursor:
            cursor.execute(
                sql.SQL(
                    "INSERT INTO {added} (consumer_id, hash_type, hash)"
                    " SELECT consumer_id, hash_type, hash"
                    " FROM integrations_consumerhash WHERE consumer_id = %s"
                ).format(added=added),
                [late.pk],
            )
        consumer_hashes_match_late(broker=broker, actor="test")
    newest = Directive.objects.exclude(pk=matched.pk).get()
    assert newest.reason == DirectiveReason.LATE_MATCH
    assert bytes(newest.content).decode() == f"hash_type,hash\nemail,{EMAIL[1][1]}\n"


def test_a_match_leaves_out_what_the_same_packages_removed_file_names(
    broker: Broker, provider: ServiceProvider, tmp_path: Path
) -> None:
    """DROP's Removed file may name an identifier of the same download: the import closes
    its work item and cancels its requests, so its directive must not name it either."""
    for n, (_, email_hash) in enumerate(EMAIL[:2]):
        ConsumerFactory.create(
            broker=broker, remote_identifier=f"C-{n}", hashes={"email": email_hash}
        )
    removed = [(EMAIL[0][0], EMAIL[0][1], "Email")]
    path = write_zip(tmp_path, drop_zip(broker, {"Email": EMAIL, "Phone": PHONE}, removed))
    drop_zip_import(broker=broker, path=path, actor="test")
    assert WorkItem.objects.get(work_item_id=EMAIL[0][0]).state == WorkItemState.REMOVED
    directive = Directive.objects.get(provider=provider)
    assert bytes(directive.content).decode() == f"hash_type,hash\nemail,{EMAIL[1][1]}\n"
    assert (directive.rows, directive.rows_by_hash_type) == (1, {"email": 1})


def test_directives_issue_for_a_round_leaves_out_what_drop_removed(
    broker: Broker, provider: ServiceProvider, matched: Directive
) -> None:
    """The call a recurring round makes: work item ids, its reason."""
    items = list(WorkItem.objects.filter(hash_type="email").order_by("pk")[:2])
    WorkItem.objects.filter(pk=items[1].pk).update(state=WorkItemState.REMOVED)
    (directive,) = directives_issue(
        broker=broker,
        work_items=[item.pk for item in items],
        reason=DirectiveReason.RECURRING,
        actor="system:recurring",
    )
    expected = base64.b64encode(bytes(items[0].hash)).decode()
    assert bytes(directive.content).decode() == f"hash_type,hash\nemail,{expected}\n"
    assert directive.reason == DirectiveReason.RECURRING


def test_an_acknowledgement_is_recorded_once(matched: Directive) -> None:
    done = directive_acknowledge(directive=matched, reference="ticket 4410", actor="cli:alice")
    assert (done.acknowledged_by, done.acknowledgement_reference) == ("cli:alice", "ticket 4410")
    again = directive_acknowledge(directive=matched, reference="another", actor="cli:bob")
    assert (again.acknowledged_by, again.acknowledgement_reference) == (
        "cli:alice",
        "ticket 4410",
    )
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_ACKNOWLEDGED).count() == 1


def test_a_directive_not_acknowledged_in_time_alerts_until_it_is(
    matched: Directive, settings: Any
) -> None:
    settings.DROPPORTAL_DIRECTIVE_ACK_DAYS = 10
    assert not _directive_alerts(
        alerts_evaluate(conditions=ACK, now=timezone.now() + dt.timedelta(days=9))
    )
    later = timezone.now() + dt.timedelta(days=11)
    (raised,) = _directive_alerts(alerts_evaluate(conditions=ACK, now=later))
    assert raised.key == f"directive_not_acknowledged:directive:{matched.pk}"
    assert "Mailhouse" in raised.text
    assert f"providers acknowledge {matched.pk}" in raised.text
    directive_acknowledge(directive=matched, reference="letter of May 2", actor="staff:alice")
    (cleared,) = _directive_alerts(alerts_evaluate(conditions=ACK, now=later), cleared=True)
    assert cleared.key == raised.key


# The conditions these tests read the alerts of: only they are evaluated.
ACK = ["directive_not_acknowledged"]
NOT_WRITTEN = ["directive_not_written"]


def _directive_alerts(result: Any, *, cleared: bool = False) -> list[Any]:
    states = result.cleared if cleared else result.raised
    return [s for s in states if s.condition == "directive_not_acknowledged"]


# ---------------------------------------------------------------- S3, on loopback


@pytest.fixture
def provider_bucket(s3_server: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A bucket ``mailhouse`` reached as a deployment reaches it: boto3's credential chain
    and DROPPORTAL_S3_ENDPOINT_URL."""
    s3_reached_at(s3_server, settings=settings, monkeypatch=monkeypatch)
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="mailhouse")
    yield s3
    for item in s3.list_objects_v2(Bucket="mailhouse").get("Contents", []):
        s3.delete_object(Bucket="mailhouse", Key=item["Key"])
    s3.delete_bucket(Bucket="mailhouse")


def test_a_provider_with_an_s3_prefix_gets_the_csv_and_its_signature_there(
    broker: Broker, provider_bucket: Any, tmp_path: Path
) -> None:
    s3_provider = service_provider_add(
        broker=broker, name="Warehouse", s3_prefix="s3://mailhouse/drop/", actor="test"
    )
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    import_package(broker, tmp_path)
    directive = Directive.objects.get(provider=s3_provider)
    (job,) = ProcrastinateJob.objects.filter(task_name=enqueue.DELIVER_DIRECTIVE)
    assert job.args == {"directive_id": directive.pk}

    tasks.deliver_directive(directive_id=directive.pk)

    key = f"drop/directive-4821-{directive.pk}.csv"
    csv_bytes = provider_bucket.get_object(Bucket="mailhouse", Key=key)["Body"].read()
    signature = provider_bucket.get_object(Bucket="mailhouse", Key=f"{key}.sig")["Body"].read()
    assert csv_bytes == bytes(directive.content)
    directive_verify(evidence_public_key(), csv_bytes, signature)
    directive.refresh_from_db()
    assert directive.s3_uri == f"s3://mailhouse/{key}"
    assert directive.delivered_at is not None
    assert LedgerEvent.objects.get(kind=LedgerKind.DIRECTIVE_DELIVERED).data["s3_uri"] == (
        f"s3://mailhouse/{key}"
    )


def test_an_s3_write_that_fails_is_recorded_retried_and_written_again_by_an_operator(
    broker: Broker, provider_bucket: Any, tmp_path: Path
) -> None:
    s3_provider = service_provider_add(
        broker=broker, name="Warehouse", s3_prefix="s3://no-such-bucket/drop/", actor="test"
    )
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    import_package(broker, tmp_path)
    directive = Directive.objects.get(provider=s3_provider)

    with pytest.raises(tasks.DirectiveNotDelivered):
        tasks.deliver_directive(directive_id=directive.pk)

    directive.refresh_from_db()
    assert directive.delivered_at is None
    assert "NoSuchBucket" in directive.delivery_error
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DELIVERY_FAILED).count() == 1

    # The store fixed after the job's retries are spent, an Operator writes it again.
    provider_bucket.create_bucket(Bucket="no-such-bucket")
    ProcrastinateJob.objects.all().delete()
    operator = User.objects.create_user("ops", password="pw-123-role", is_staff=True)
    operator.groups.add(Group.objects.get(name="Operators"))
    client = Client()
    client.force_login(operator)
    client.post(
        reverse("admin:integrations_directive_changelist"),
        {"action": "write_directives_again", "_selected_action": [directive.pk]},
    )
    (job,) = ProcrastinateJob.objects.filter(task_name=enqueue.DELIVER_DIRECTIVE)
    assert job.args == {"directive_id": directive.pk}
    tasks.deliver_directive(directive_id=directive.pk)
    directive.refresh_from_db()
    assert directive.s3_uri == f"s3://no-such-bucket/drop/directive-4821-{directive.pk}.csv"
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DELIVERED).count() == 1
    provider_bucket.delete_object(
        Bucket="no-such-bucket", Key=f"drop/directive-4821-{directive.pk}.csv"
    )
    provider_bucket.delete_object(
        Bucket="no-such-bucket", Key=f"drop/directive-4821-{directive.pk}.csv.sig"
    )
    provider_bucket.delete_bucket(Bucket="no-such-bucket")

    # Written, it is not queued again.
    ProcrastinateJob.objects.all().delete()
    client.post(
        reverse("admin:integrations_directive_changelist"),
        {"action": "write_directives_again", "_selected_action": [directive.pk]},
    )
    assert not ProcrastinateJob.objects.filter(task_name=enqueue.DELIVER_DIRECTIVE).exists()


def test_a_retry_after_another_job_wrote_the_directive_writes_and_records_nothing(
    broker: Broker, provider_bucket: Any, tmp_path: Path
) -> None:
    """The first job failed and waits for its retry; an Operator queued a second one, which
    wrote it; the provider took the files. The first job's retry must not write them again
    (the provider would act on them twice) nor record a second delivery."""
    s3_provider = service_provider_add(
        broker=broker, name="Warehouse", s3_prefix="s3://mailhouse/drop/", actor="test"
    )
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    import_package(broker, tmp_path)
    directive = Directive.objects.get(provider=s3_provider)
    tasks.deliver_directive(directive_id=directive.pk)  # the second job
    directive.refresh_from_db()
    written_at = directive.delivered_at
    key = f"drop/directive-4821-{directive.pk}.csv"
    for name in (key, f"{key}.sig"):  # the provider takes them
        provider_bucket.delete_object(Bucket="mailhouse", Key=name)

    tasks.deliver_directive(directive_id=directive.pk)  # the first job's retry

    assert "Contents" not in provider_bucket.list_objects_v2(Bucket="mailhouse")
    directive.refresh_from_db()
    assert directive.delivered_at == written_at
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DELIVERED).count() == 1


def test_a_write_that_fails_while_another_run_writes_it_records_no_failure(
    broker: Broker, provider_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs at once (a retry and an Operator's): one writes the directive while the
    other's write fails. The directive stays written, with no error, and the failing run
    ends as done rather than retrying (and writing it again) for a day."""
    s3_provider = service_provider_add(
        broker=broker, name="Warehouse", s3_prefix="s3://mailhouse/drop/", actor="test"
    )
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    import_package(broker, tmp_path)
    directive = Directive.objects.get(provider=s3_provider)
    put = directives_service.s3_object_put

    def the_other_run_writes_it_then_this_put_fails(uri: str, content: bytes, **kw: Any) -> None:
        monkeypatch.setattr(directives_service, "s3_object_put", put)
        assert directives_service.directive_deliver(directive_id=directive.pk)
        raise SourceError(f"{uri}: RequestTimeout: the store did not answer in time")

    monkeypatch.setattr(
        directives_service, "s3_object_put", the_other_run_writes_it_then_this_put_fails
    )
    tasks.deliver_directive(directive_id=directive.pk)  # ends without DirectiveNotDelivered

    directive.refresh_from_db()
    assert directive.s3_uri == f"s3://mailhouse/drop/directive-4821-{directive.pk}.csv"
    assert directive.delivery_error == ""
    assert not LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DELIVERY_FAILED).exists()
    assert LedgerEvent.objects.filter(kind=LedgerKind.DIRECTIVE_DELIVERED).count() == 1


def test_a_store_no_client_can_be_made_for_is_a_failed_write_recorded(
    broker: Broker, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3 refuses to make the client (AWS_PROFILE names no profile): the directive says
    why and the ledger has the failure, as for any other refusal of the store."""
    s3_reached_at("http://127.0.0.1:9", settings=settings, monkeypatch=monkeypatch)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "drop-directives")
    s3_provider = service_provider_add(
        broker=broker, name="Warehouse", s3_prefix="s3://mailhouse/drop/", actor="test"
    )
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    import_package(broker, tmp_path)
    directive = Directive.objects.get(provider=s3_provider)

    with pytest.raises(tasks.DirectiveNotDelivered):
        tasks.deliver_directive(directive_id=directive.pk)

    directive.refresh_from_db()
    assert "drop-directives" in directive.delivery_error
    failed = LedgerEvent.objects.get(kind=LedgerKind.DIRECTIVE_DELIVERY_FAILED)
    assert "could not be found" in failed.data["error"]


def test_an_endpoints_password_is_kept_nowhere_when_a_write_fails(
    broker: Broker, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint URL that carries ``user:password@`` and cannot be reached: boto3's error
    names the URL whole; what the directive keeps and shows has no password."""
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s3_reached_at(
        f"http://minio:hunter2@127.0.0.1:{port}", settings=settings, monkeypatch=monkeypatch
    )
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3_provider = service_provider_add(
        broker=broker, name="Warehouse", s3_prefix="s3://mailhouse/drop/", actor="test"
    )
    ConsumerFactory.create(broker=broker, remote_identifier="C-1", hashes={"email": EMAIL[0][1]})
    import_package(broker, tmp_path)
    directive = Directive.objects.get(provider=s3_provider)

    with pytest.raises(tasks.DirectiveNotDelivered):
        tasks.deliver_directive(directive_id=directive.pk)

    directive.refresh_from_db()
    assert f"127.0.0.1:{port}" in directive.delivery_error
    assert "hunter2" not in directive.delivery_error
    assert "hunter2" not in str(LedgerEvent.objects.values_list("data", flat=True)[::1])
    out = io.StringIO()
    call_command("drop", "directives", "--broker", "4821", "--json", stdout=out)
    assert "hunter2" not in out.getvalue()


def test_the_evidence_pack_finds_a_directive_altered_with_its_digest(
    matched: Directive, tmp_path: Path
) -> None:
    """A directive's CSV rewritten in the database (a hash left out) with its SHA-256 made to
    match: its signature no longer holds, and the audit's test must say so."""
    today = drop_today().isoformat()

    def service_providers() -> dict[str, Any]:
        out = tmp_path / "pack.zip"
        call_command(
            "evidence", "export", "--broker", "4821", "--since", today, "--until", today,
            "--out", str(out), stdout=io.StringIO(),
        )  # fmt: skip
        with zipfile.ZipFile(out) as archive:
            document = json.loads(archive.read(components.FILE))
        return dict(document["components"]["service_providers"])

    def signed_test(component: dict[str, Any]) -> dict[str, Any]:
        (test,) = [t for t in component["tests"] if "still the one signed" in t["name"]]
        return dict(test)

    before = service_providers()
    assert before["records"]["directives"] == 1
    assert signed_test(before)["result"] == "pass"
    altered = bytes(matched.content).decode().splitlines(keepends=True)[:-1]
    content = "".join(altered).encode()
    Directive.objects.filter(pk=matched.pk).update(
        content=content, sha256=hashlib.sha256(content).hexdigest(), rows=len(altered) - 1
    )
    with pytest.raises(InvalidSignature):
        directive_verify(evidence_public_key(), content, f"{matched.signature}\n".encode())

    component = service_providers()
    assert signed_test(component)["result"] == "fail"
    assert component["records"]["providers"][0]["not_as_signed"] == 1


@pytest.mark.parametrize(
    ("acknowledged", "late"), [("2026-11-04 23:50", 0), ("2026-11-05 00:10", 1)]
)
def test_the_evidence_pack_counts_acknowledgement_days_in_drops_calendar(
    matched: Directive, tmp_path: Path, acknowledged: str, late: int
) -> None:
    """Issued on October 25: acknowledged on November 4, the tenth day after in California,
    is on time, though more than ten times 24 hours later (the clocks went back on November
    1); on November 5, just after midnight there, it is late."""
    Directive.objects.filter(pk=matched.pk).update(
        created_at=drop_moment("2026-10-25 00:30"),
        acknowledged_at=drop_moment(acknowledged),
        acknowledged_by="cli",
        acknowledgement_reference="ticket 4410",
    )
    out = tmp_path / "pack.zip"
    call_command(
        "evidence", "export", "--broker", "4821", "--since", "2026-10-01",
        "--until", "2026-11-30", "--out", str(out), stdout=io.StringIO(),
    )  # fmt: skip
    with zipfile.ZipFile(out) as archive:
        component = json.loads(archive.read(components.FILE))["components"]["service_providers"]

    (provider,) = component["records"]["providers"]
    assert (provider["acknowledged"], provider["acknowledged_late"]) == (1, late)
    (test,) = [t for t in component["tests"] if "acknowledged within" in t["name"]]
    assert test["result"] == ("fail" if late else "pass"), test


def test_an_altered_directive_cannot_pass_as_signed_by_another_key(
    matched: Directive, tmp_path: Path
) -> None:
    """Rewriting the CSV with its digest and naming some other key as the signer must not
    turn "does not verify" into "signed by an earlier key, its digest checked": the digest
    and the key are checked against the directive's directive.issued event, which is in the
    sealed chain."""
    today = drop_today().isoformat()
    altered = bytes(matched.content).decode().splitlines(keepends=True)[:-1]
    content = "".join(altered).encode()
    Directive.objects.filter(pk=matched.pk).update(
        content=content,
        sha256=hashlib.sha256(content).hexdigest(),
        rows=len(altered) - 1,
        key_fingerprint="0" * 64,
    )
    out = tmp_path / "pack.zip"
    call_command(
        "evidence", "export", "--broker", "4821", "--since", today, "--until", today,
        "--out", str(out), stdout=io.StringIO(),
    )  # fmt: skip
    with zipfile.ZipFile(out) as archive:
        component = json.loads(archive.read(components.FILE))["components"]["service_providers"]

    (signed,) = [t for t in component["tests"] if "still the one signed" in t["name"]]
    assert signed["result"] == "fail", signed
    assert component["records"]["providers"][0]["not_as_signed"] == 1
    assert component["records"]["providers"][0]["signed_by_another_key"] == 0


def test_a_match_no_directive_names_fails_the_pack(matched: Directive, tmp_path: Path) -> None:
    """Each match directs every provider registered by then: a directive that is gone (or
    was never issued) leaves a provider holding deleted people, and fewer directives must
    not read as a pass."""
    today = drop_today().isoformat()

    def service_providers(name: str) -> dict[str, Any]:
        out = tmp_path / name
        call_command(
            "evidence", "export", "--broker", "4821", "--since", today, "--until", today,
            "--out", str(out), stdout=io.StringIO(),
        )  # fmt: skip
        with zipfile.ZipFile(out) as archive:
            document = json.loads(archive.read(components.FILE))
        return dict(document["components"]["service_providers"])

    def directed_test(component: dict[str, Any]) -> dict[str, Any]:
        (test,) = [t for t in component["tests"] if "directed" in t["name"]]
        return dict(test)

    assert directed_test(service_providers("before.zip"))["result"] == "pass"
    Directive.objects.filter(pk=matched.pk).delete()

    component = service_providers("after.zip")

    test = directed_test(component)
    assert test["result"] == "fail"
    assert test["detail"] == "Mailhouse: 2 matched work item(s) in no directive to it"
    assert component["records"]["providers"][0]["matched_not_directed"] == 2


@pytest.fixture
def icu_database() -> Iterator[psycopg.Connection[Any]]:
    """A scratch database on the same server whose default collation is ICU's en-US, as a
    server initialized in an American locale gives every database (C and C.UTF-8 sort
    bytes; en-US sorts letters without case first)."""
    name = f"{connection.settings_dict['NAME']}_icu"
    with connection._nodb_cursor() as cursor:
        database_drop(cursor, name)
        try:
            cursor.execute(
                f'CREATE DATABASE "{name}" TEMPLATE template0 LOCALE_PROVIDER icu'
                " ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
            )
        except DatabaseError:
            pytest.skip(
                "SKIPPED LOUDLY: this PostgreSQL server has no ICU (the embedded one is built"
                " without it); the byte order is checked where a server has it, as in CI"
            )
    params = {**connection.get_connection_params(), "dbname": name}
    params.pop("cursor_factory", None)
    params.pop("context", None)
    try:
        with psycopg.connect(**params, autocommit=True) as scratch:
            yield scratch
    finally:
        with connection._nodb_cursor() as cursor:
            database_drop(cursor, name)


def test_a_directives_rows_are_in_byte_order_whatever_the_databases_collation(
    icu_database: psycopg.Connection[Any],
) -> None:
    """The contract sorts by list type, then hash: one order of the bytes, so one set of
    hashes is one CSV (and one digest) on every deployment. Under en-US, "a..." sorts before
    "B..." and "+" is no letter: the query must not follow the database's collation."""
    hashes = [bytes([0x68]) + bytes(31), bytes([0x04]) + bytes(31), bytes([0xF8]) + bytes(31)]
    with icu_database.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE integrations_workitem"
            " (id bigint, broker_id bigint, state text, hash_type text, hash bytea)"
        )
        for n, digest in enumerate(hashes):
            for hash_type in ("name_vin", "email", "ndz"):
                cursor.execute(
                    "INSERT INTO integrations_workitem VALUES (%s, 1, 'open', %s, %s)",
                    [n * 3 + len(hash_type), hash_type, digest],
                )
        cursor.execute(
            directives_service._HASHES.format(named=sql.SQL("true")),
            {"broker": 1, "removed": WorkItemState.REMOVED},
        )
        rows = [(str(h), str(v)) for h, v in cursor.fetchall()]
    assert len(rows) == 9
    assert rows == sorted(rows, key=lambda row: (row[0].encode(), row[1].encode()))


def test_a_directive_whose_write_keeps_failing_alerts_until_it_is_written(broker: Broker) -> None:
    provider = service_provider_add(
        broker=broker, name="Warehouse", s3_prefix="s3://no-such-bucket/drop/", actor="test"
    )
    failing = DirectiveFactory.create(provider=provider, delivery_error="NoSuchBucket")
    DirectiveFactory.create(provider=provider)  # not tried yet: its job is queued
    issued = failing.created_at

    def not_written(result: Any, *, cleared: bool = False) -> list[Any]:
        states = result.cleared if cleared else result.raised
        return [s for s in states if s.condition == "directive_not_written"]

    # The job's first tries come within the hour: a passing failure alerts no one.
    assert not not_written(
        alerts_evaluate(conditions=NOT_WRITTEN, now=issued + dt.timedelta(minutes=30))
    )
    later = issued + dt.timedelta(hours=2)
    (raised,) = not_written(alerts_evaluate(conditions=NOT_WRITTEN, now=later))
    assert raised.key == f"directive_not_written:directive:{failing.pk}"
    assert "NoSuchBucket" in raised.text
    assert f"drop directive {failing.pk} --out" in raised.text

    Directive.objects.filter(pk=failing.pk).update(
        s3_uri=f"s3://no-such-bucket/drop/directive-4821-{failing.pk}.csv", delivery_error=""
    )
    (cleared,) = not_written(alerts_evaluate(conditions=NOT_WRITTEN, now=later), cleared=True)
    assert cleared.key == raised.key
