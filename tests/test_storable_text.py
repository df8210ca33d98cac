"""What PostgreSQL can store of a text: refused in what is taken in, replaced in what is kept
of an answer, by one rule."""

from __future__ import annotations

import json

import pytest

from integrations.storable_text import storable, unstorable_reason
from tests.builders import DeletionRequestFactory, DeliveryAttemptFactory

LONE_SURROGATE = json.loads('"a\\ud800b"')


def test_ordinary_text_is_kept_as_it_is() -> None:
    text = "Ann Smith, é, 👩‍💻"

    assert storable(text) is text
    assert unstorable_reason({"email": [{"email": text}]}) is None


@pytest.mark.parametrize(
    ("text", "kept", "reason"),
    [
        ("ok\x00 binary", "ok\ufffd binary", "NUL character"),
        (LONE_SURROGATE, "a\ufffdb", "unpaired surrogate"),
    ],
)
def test_what_postgresql_refuses_is_replaced_or_named(text: str, kept: str, reason: str) -> None:
    assert storable(text) == kept
    problem = unstorable_reason({"identifiers": {"email": [{text: "x"}]}})  # a key too
    assert problem is not None and reason in problem


@pytest.mark.django_db
def test_what_storable_keeps_is_stored_as_text_and_as_jsonb() -> None:
    kept = storable("\x00" + LONE_SURROGATE)
    attempt = DeliveryAttemptFactory.create(
        deletion_request=DeletionRequestFactory.create(),
        url="https://crm.example/drop",
        request_headers={"X-Echo": kept},
        duration_ms=1,
        response_body=kept,
    )

    attempt.refresh_from_db()
    assert attempt.response_body == attempt.request_headers["X-Echo"] == "\ufffda\ufffdb"
