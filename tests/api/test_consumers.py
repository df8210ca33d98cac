"""POST /api/v1/drop/consumers and DELETE /api/v1/drop/consumers/{remote_identifier}."""

from __future__ import annotations

import base64
import hashlib
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections
from django.urls import reverse
from rest_framework.test import APIClient

from dropportal import local_state
from integrations.api import consumers as api_consumers
from integrations.api import json_body
from integrations.models import Broker, Consumer, ConsumerHash, Directive, LedgerEvent
from integrations.services.cycle.consumers import _REGISTRATION_LOCK
from integrations.services.locks import _MATCHING_LOCK
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import CreatedApiKey
from tests.builders import ServiceProviderFactory, WorkItemFactory
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

URL = "/api/v1/drop/consumers"
ANNA = "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="  # Anna.Smith@Domain.com
PHONE = "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="  # +1(415)555-9317


@pytest.fixture
def ingest(make_key: Callable[..., CreatedApiKey]) -> dict[str, Any]:
    return bearer(make_key("ingest").key)


def post(client: APIClient, body: Any, headers: dict[str, Any]) -> Any:
    return client.post(URL, body, format="json", **headers)


def stored(broker: Broker) -> dict[str, list[tuple[str, str]]]:
    """The broker's consumers as remote_identifier -> [(hash_type, Base64 hash)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for h in ConsumerHash.objects.filter(broker=broker).select_related("consumer"):
        out.setdefault(h.consumer.remote_identifier, []).append(
            (h.hash_type, base64.b64encode(bytes(h.hash)).decode())
        )
    return {k: sorted(v) for k, v in out.items()}


GOOD = {
    "consumers": [
        {"remote_identifier": "C-1", "email": ["Anna.Smith@Domain.com"]},
        {"remote_identifier": "C-2", "hashes": {"phone": [PHONE]}, "remote_identifier_kind": "crm"},
    ]
}


def test_registers_clear_and_hashed_identifiers(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    response = post(api_client, GOOD, ingest)
    assert response.status_code == 200
    assert response.json() == {"accepted": 2, "rejected": []}
    assert stored(broker) == {"C-1": [("email", ANNA)], "C-2": [("phone", PHONE)]}
    assert Consumer.objects.get(remote_identifier="C-2").remote_identifier_kind == "crm"
    assert Consumer.objects.get(remote_identifier="C-1").remote_identifier_kind == "external_id"
    event = LedgerEvent.objects.get(kind="consumers.registered")
    assert event.actor.startswith("apikey:dpk_")
    assert event.subject == "api"
    assert event.data["consumers_created"] == 2 and event.data["hashes_added"] == 2


def test_sending_the_same_body_again_changes_nothing(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    post(api_client, GOOD, ingest)
    before = list(ConsumerHash.objects.values_list("pk", flat=True).order_by("pk"))
    again = post(api_client, GOOD, ingest)
    assert again.status_code == 200
    assert again.json() == {"accepted": 2, "rejected": []}
    assert list(ConsumerHash.objects.values_list("pk", flat=True).order_by("pk")) == before
    second = LedgerEvent.objects.filter(kind="consumers.registered").order_by("-id").first()
    assert second is not None
    assert second.data["hashes_added"] == 0 and second.data["hashes_unchanged"] == 2


def test_bad_consumers_are_listed_and_the_good_ones_registered(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    body = {
        "consumers": [
            GOOD["consumers"][0],
            {"remote_identifier": "C-3", "email": ["x@y"], "maid": ["not-a-maid"]},
            {"remote_identifier": "C-4", "hashes": {"email": ["abc"]}},
            "C-5",
        ]
    }
    response = post(api_client, body, ingest)
    assert response.status_code == 200
    assert response.json() == {
        "accepted": 1,
        "rejected": [
            {
                "index": 1,
                "remote_identifier": "C-3",
                "errors": {"maid[0]": ["MAID must be 32 hex characters after standardizing"]},
            },
            {
                "index": 2,
                "remote_identifier": "C-4",
                "errors": {
                    "hashes.email[0]": [
                        "must be a SHA-256 hash in standard Base64 (44 characters, ending in '=')"
                    ]
                },
            },
            {
                "index": 3,
                "remote_identifier": None,
                "errors": {"non_field_errors": ["must be a JSON object"]},
            },
        ],
    }
    assert "not-a-maid" not in response.content.decode()
    assert stored(broker) == {"C-1": [("email", ANNA)]}


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ([{"remote_identifier": "C-1"}], "non_field_errors"),
        ({"consumer": []}, "consumer"),
        ({}, "consumers"),
        ({"consumers": {"remote_identifier": "C-1"}}, "consumers"),
    ],
)
def test_a_malformed_body_is_400_and_writes_nothing(
    api_client: APIClient, ingest: dict[str, Any], body: Any, key: str
) -> None:
    response = post(api_client, body, ingest)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "validation_failed"
    assert key in response.json()["errors"]
    assert not Consumer.objects.exists()
    assert not LedgerEvent.objects.filter(kind="consumers.registered").exists()


def test_bad_json_is_400_validation_failed(api_client: APIClient, ingest: dict[str, Any]) -> None:
    response = api_client.post(URL, "{not json", content_type="application/json", **ingest)
    assert response.status_code == 400
    assert response.json()["code"] == "validation_failed"


def test_a_body_sent_in_chunks_is_told_to_send_its_length(
    api_client: APIClient, ingest: dict[str, Any]
) -> None:
    # What gunicorn hands on for a chunked body: no Content-Length, so Django reads nothing.
    body = json.dumps(_many(2))
    response = api_client.post(
        URL,
        body,
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
        CONTENT_LENGTH="",
        **ingest,
    )
    assert response.status_code == 400
    assert response.json()["code"] == "validation_failed"
    assert "send it with Content-Length" in response.json()["detail"]
    assert not Consumer.objects.exists()


def _many(count: int) -> dict[str, Any]:
    return {
        "consumers": [
            {"remote_identifier": f"C-{i}", "hashes": {"email": [_b64(i)]}} for i in range(count)
        ]
    }


def _b64(i: int) -> str:
    return base64.b64encode(hashlib.sha256(str(i).encode()).digest()).decode()


def test_ten_thousand_consumers_are_accepted_and_one_more_is_refused(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    too_many = post(api_client, _many(10_001), ingest)
    assert too_many.status_code == 400
    assert too_many.json()["code"] == "validation_failed"
    assert "at most 10,000" in too_many.json()["errors"]["consumers"][0]
    assert not Consumer.objects.exists()

    response = post(api_client, _many(10_000), ingest)
    assert response.status_code == 200
    assert response.json() == {"accepted": 10_000, "rejected": []}
    assert ConsumerHash.objects.filter(broker=broker).count() == 10_000


def test_a_body_over_the_size_cap_is_413(
    api_client: APIClient, ingest: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(json_body, "MAX_BODY_BYTES", 100)
    response = post(api_client, GOOD, ingest)
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert not Consumer.objects.exists()


def test_no_key_is_401_and_a_key_without_ingest_is_403(
    api_client: APIClient, make_key: Callable[..., CreatedApiKey]
) -> None:
    assert post(api_client, GOOD, {}).status_code == 401
    assert post(api_client, GOOD, bearer("dpk_unknown")).json()["code"] == "authentication_failed"
    audit = post(api_client, GOOD, bearer(make_key("audit", "webhook_callback").key))
    assert audit.status_code == 403
    assert audit.json()["code"] == "scope_missing"
    delete = api_client.delete(f"{URL}/C-1", **bearer(make_key("audit").key))
    assert delete.status_code == 403
    assert not Consumer.objects.exists()


def test_the_keys_broker_is_the_broker(
    api_client: APIClient, make_key: Callable[..., CreatedApiKey], broker: Broker
) -> None:
    other = broker_create(broker_id="7777", name="Other", actor="test")
    post(api_client, GOOD, bearer(make_key("ingest", for_broker=other).key))
    assert stored(other) == {"C-1": [("email", ANNA)], "C-2": [("phone", PHONE)]}
    assert stored(broker) == {}


def test_delete_forgets_the_consumer_and_its_hashes(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    post(api_client, GOOD, ingest)
    response = api_client.delete(f"{URL}/C-1", **ingest)
    assert response.status_code == 204
    assert stored(broker) == {"C-2": [("phone", PHONE)]}
    event = LedgerEvent.objects.get(kind="consumer.forgotten")
    assert event.subject == "C-1"
    assert event.data["hashes_removed"] == {"email": 1}
    again = api_client.delete(f"{URL}/C-1", **ingest)
    assert again.status_code == 404
    assert again.json()["code"] == "not_found"


def test_delete_of_a_pointer_with_a_slash_and_spaces(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    body = {"consumers": [{"remote_identifier": "acct/42 b", "email": ["a@b"]}]}
    assert post(api_client, body, ingest).json()["accepted"] == 1
    assert api_client.delete(f"{URL}/acct%2F42%20b", **ingest).status_code == 204
    assert not Consumer.objects.exists()


@pytest.mark.parametrize(("pointer", "in_url"), [("C-1\n", "C-1%0A"), ("C\n1", "C%0A1")])
def test_delete_of_a_pointer_with_a_newline(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker, pointer: str, in_url: str
) -> None:
    # Registration keeps a pointer verbatim, so its DELETE route must take any character.
    body = {"consumers": [{"remote_identifier": pointer, "email": ["a@b"]}]}
    assert post(api_client, body, ingest).json()["accepted"] == 1
    assert api_client.delete(f"{URL}/{in_url}", **ingest).status_code == 204
    assert not Consumer.objects.exists()
    assert reverse("api-consumer", args=[pointer]) == f"{URL}/{in_url}"


def test_pointers_with_copy_special_characters_are_kept_exactly(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    # Backslash, tab, newline and \\N are COPY's own syntax; quotes and non-ASCII are not.
    pointers = ["a\\b", "tab\there", "two\nlines", "\\N", 'quo"te', "Zoë-ü"]
    body = {
        "consumers": [{"remote_identifier": p, "email": [f"{i}@x"]} for i, p in enumerate(pointers)]
    }
    assert post(api_client, body, ingest).json() == {"accepted": 6, "rejected": []}
    assert sorted(Consumer.objects.values_list("remote_identifier", flat=True)) == sorted(pointers)
    assert post(api_client, body, ingest).json() == {"accepted": 6, "rejected": []}
    assert Consumer.objects.count() == 6


def test_a_pointer_is_kept_verbatim_and_echoed_as_sent(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    body = {
        "consumers": [
            {"remote_identifier": " C-7 ", "email": ["a@b"]},
            {"remote_identifier": " \t ", "email": ["c@d"]},
        ]
    }
    answer = post(api_client, body, ingest).json()
    assert answer["accepted"] == 1
    assert [r["errors"] for r in answer["rejected"]] == [
        {"remote_identifier": ["must not be blank"]}
    ]
    assert list(Consumer.objects.values_list("remote_identifier", flat=True)) == [" C-7 "]
    assert api_client.delete(f"{URL}/%20C-7%20", **ingest).status_code == 204


def test_another_brokers_consumer_is_404_and_stays(
    api_client: APIClient, make_key: Callable[..., CreatedApiKey], ingest: dict[str, Any]
) -> None:
    other = broker_create(broker_id="7777", name="Other", actor="test")
    post(api_client, GOOD, bearer(make_key("ingest", for_broker=other).key))
    response = api_client.delete(f"{URL}/C-1", **ingest)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert stored(other)["C-1"] == [("email", ANNA)]


def test_nothing_clear_reaches_the_database(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    body = {
        "consumers": [
            {
                "remote_identifier": "C-1",
                "email": ["Secret.Person@Example.com"],
                "phone": ["+1 (415) 555-0123"],
                "ndz": [
                    {
                        "first_name": "Zebulon",
                        "last_name": "Quintero",
                        "dob": "1971-02-03",
                        "zip": "94110",
                    }
                ],
            }
        ]
    }
    assert post(api_client, body, ingest).json()["accepted"] == 1
    with connection.cursor() as cursor:
        for table in (
            "integrations_consumer",
            "integrations_consumerhash",
            "integrations_ledgerevent",
        ):
            cursor.execute(f"SELECT coalesce(string_agg(t::text, ' '), '') FROM {table} t")  # noqa: S608
            text = cursor.fetchone()[0].lower()
            for clear in ("secret.person", "4155550123", "zebulon", "quintero", "19710203"):
                assert clear not in text, (table, clear)


def test_both_endpoints_are_in_the_schema(api_client: APIClient) -> None:
    schema = api_client.get("/api/v1/schema", HTTP_ACCEPT="application/json").json()
    register = schema["paths"]["/api/v1/drop/consumers"]["post"]
    assert "RegistrationRequest" in str(register["requestBody"])
    assert "RegistrationResponse" in str(register["responses"]["200"])
    assert {"400", "401", "403", "413"} <= set(register["responses"])
    forget = schema["paths"]["/api/v1/drop/consumers/{remote_identifier}"]["delete"]
    assert {"204", "404"} <= set(forget["responses"])
    consumer = schema["components"]["schemas"]["Consumer"]["properties"]
    assert {
        "remote_identifier",
        "email",
        "phone",
        "ndz",
        "name_vin",
        "maid",
        "ctvid",
        "hashes",
    } <= set(consumer)


def test_a_full_call_of_several_megabytes_is_read_whole(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    # 10,000 consumers with a few identifiers each: past Django's 2.5 MB request cap.
    body = {
        "consumers": [
            {
                "remote_identifier": f"customer-account-{i:08d}",
                "email": [
                    f"first.last.{i}@a-rather-long-mail-domain.example",
                    f"another.address.{i}@a-second-mail-domain.example",
                    f"x{i}@b.example",
                ],
                "phone": [f"+1415555{i % 10_000:04d}"],
                "ndz": [
                    {
                        "first_name": "Anna",
                        "last_name": "Smith",
                        "dob": "1980-01-31",
                        "zip": "94107",
                    }
                ],
            }
            for i in range(10_000)
        ]
    }
    raw = json.dumps(body)
    assert len(raw) > 2.5 * 1024 * 1024

    response = api_client.post(URL, raw, content_type="application/json", **ingest)

    assert response.status_code == 200, response.content[:300]
    assert response.json() == {"accepted": 10_000, "rejected": []}
    assert ConsumerHash.objects.filter(broker=broker).count() == 10_000 * 5


UNSTORABLE_BODIES = {
    "nested too deeply": "[" * 20_000 + "]" * 20_000,
    "NaN": '{"consumers": [{"remote_identifier": "C-1", "maid": [NaN]}]}',
    "a NUL in remote_identifier": '{"consumers": [{"remote_identifier": "C\\u00001"}]}',
    "an unpaired surrogate": '{"consumers": [{"remote_identifier": "C-\\ud800"}]}',
    "not UTF-8": b'{"consumers": [{"remote_identifier": "C-\xff"}]}',
    "in UTF-16": '{"consumers": [{"remote_identifier": "C-1"}]}'.encode("utf-16"),
    # Python keeps the last of a key named twice: the first list would go without a word.
    "a key twice at the top": '{"consumers": [{"remote_identifier": "C-1"}], "consumers": []}',
    "a key twice in a consumer": '{"consumers": [{"remote_identifier": "C-1", '
    '"email": ["a@x.example"], "email": ["b@x.example"]}]}',
}


@pytest.mark.parametrize("case", UNSTORABLE_BODIES, ids=list(UNSTORABLE_BODIES))
def test_a_body_that_cannot_be_stored_is_a_400_problem_and_changes_nothing(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker, case: str
) -> None:
    response = api_client.post(
        URL, UNSTORABLE_BODIES[case], content_type="application/json", **ingest
    )

    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "validation_failed"
    assert not Consumer.objects.exists()


def test_a_key_named_twice_is_refused_without_naming_it(
    api_client: APIClient, ingest: dict[str, Any]
) -> None:
    body = '{"consumers": [{"remote_identifier": "C-1", "ann@x.example": 1, "ann@x.example": 2}]}'

    response = api_client.post(URL, body, content_type="application/json", **ingest)

    assert response.status_code == 400
    assert "names the same key twice" in response.json()["detail"]
    assert "ann@" not in response.content.decode()


def test_deleting_a_pointer_no_consumer_can_have_is_404(
    api_client: APIClient, ingest: dict[str, Any]
) -> None:
    response = api_client.delete(f"{URL}/C%001", **ingest)

    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_million_consumers_are_refused_without_being_built(
    api_client: APIClient, ingest: dict[str, Any], broker: Broker
) -> None:
    body = b'{"consumers": [' + b"{}," * 999_999 + b"{}]}"  # 3 MB: a million objects

    tracemalloc.start()
    try:
        response = api_client.post(URL, data=body, content_type="application/json", **ingest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert response.status_code == 400
    assert response.json()["errors"]["consumers"] == [
        "holds more than 10,000 consumers; at most 10,000 per call"
    ]
    # The body and its text (6 MB) and 10,001 objects; a million would be over 70 MB.
    assert peak < 24 << 20, f"refusing it cost {peak / (1 << 20):.0f} MiB"
    assert not Consumer.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        b'{"consumers": [1, 2,]}',
        b'{"consumers": [1 2]}',
        b'{"consumers": [1], }',
        b'{"consumers": [1]} x',
        b'{"consumers" [1]}',
        b'{"consumers": [1]',
        b"{consumers: []}",
    ],
)
def test_malformed_registration_bodies_are_invalid_json(
    api_client: APIClient, ingest: dict[str, Any], body: bytes
) -> None:
    response = api_client.post(URL, data=body, content_type="application/json", **ingest)

    assert response.status_code == 400
    assert response.json()["detail"].startswith("The body is not valid JSON")


@pytest.mark.parametrize(
    ("lock", "detail"),
    [
        (_REGISTRATION_LOCK, "another consumer registration for broker 4821 is running"),
        (_MATCHING_LOCK, "broker 4821's consumers are being matched"),
    ],
    ids=["file_import", "drop_import"],
)
def test_a_call_gives_up_with_503_while_a_file_import_or_a_drop_import_holds_the_broker(
    api_client: APIClient,
    ingest: dict[str, Any],
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    lock: int,
    detail: str,
) -> None:
    monkeypatch.setattr(api_consumers, "LOCK_WAIT_SECONDS", 0.05)
    with connection.cursor() as cursor:  # a wait with no bound fails the test, not hangs it
        cursor.execute("SET LOCAL statement_timeout = '20s'")
    other = connections.create_connection("default")  # the import's session
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [lock, broker.pk])
        response = post(api_client, GOOD, ingest)
        assert response.status_code == 503
        assert response["Content-Type"] == "application/problem+json"
        assert response["Retry-After"] == str(api_consumers.RETRY_AFTER_SECONDS)
        problem = response.json()
        assert (problem["status"], problem["code"]) == (503, "registration_busy")
        assert problem["detail"].startswith(detail) and problem["detail"].endswith("retry later.")
        assert not Consumer.objects.exists()
        assert not LedgerEvent.objects.filter(kind="consumers.registered").exists()
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [lock, broker.pk])
    finally:
        other.close()
    assert post(api_client, GOOD, ingest).status_code == 200  # the import ended: retried
    assert set(stored(broker)) == {"C-1", "C-2"}


def test_a_first_call_gives_up_with_503_while_its_partition_cannot_be_attached(
    api_client: APIClient,
    ingest: dict[str, Any],
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker's first consumers go into a partition of their own, attached at the end:
    the attach waits for whoever reads the default partition (a DROP import of another
    broker with no consumers yet, through its whole import). The call waits for it no
    longer than for the broker's own locks."""
    monkeypatch.setattr(api_consumers, "LOCK_WAIT_SECONDS", 0.05)
    with connection.cursor() as cursor:  # a wait with no bound fails the test, not hangs it
        cursor.execute("SET LOCAL statement_timeout = '20s'")
    other = connections.create_connection("default")  # the other import's session
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM integrations_consumerhash_default")
        response = post(api_client, GOOD, ingest)
        assert response.status_code == 503
        problem = response.json()
        assert (problem["status"], problem["code"]) == (503, "registration_busy")
        assert not Consumer.objects.exists()
        other.rollback()
    finally:
        other.close()
    assert post(api_client, GOOD, ingest).status_code == 200  # the import ended: retried
    assert set(stored(broker)) == {"C-1", "C-2"}


@pytest.mark.parametrize("key_file", ["generated", "unreadable", "damaged"])
def test_a_late_match_whose_directive_cannot_be_signed_is_a_503_problem_writing_nothing(
    api_client: APIClient,
    ingest: dict[str, Any],
    broker: Broker,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    key_file: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A set DROPPORTAL_EVIDENCE_KEY is checked at start; the one generated into var/ is read
    when a directive is first signed, and may have become unreadable by then. Anna matches
    a DROP work item, and the broker has a service provider to direct."""
    settings.DROPPORTAL_EVIDENCE_KEY = ""
    monkeypatch.setattr(local_state, "VAR_DIR", tmp_path)
    pem = tmp_path / "evidence_key.pem"
    if key_file == "unreadable":
        pem.mkdir()  # read as a file: an OSError, as a file without read permission
    elif key_file == "damaged":
        pem.write_text("not a PEM key\n")
    ServiceProviderFactory.create(broker=broker, name="Mailhouse")
    WorkItemFactory.create(cycle__broker=broker, hash=base64.b64decode(ANNA), status_code=5)

    response = post(api_client, GOOD, ingest)

    if key_file == "generated":
        assert response.status_code == 200, response.content
        assert Directive.objects.count() == 1
        return
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "evidence_key_refused"
    detail = response.json()["detail"]
    # The reason is the operator's, in the log: no setting's name or path goes to the caller.
    assert "DROPPORTAL_" not in detail and "evidence_key.pem" not in detail
    assert "DROPPORTAL_EVIDENCE_KEY" in caplog.text
    assert stored(broker) == {}
    assert not Directive.objects.exists()
