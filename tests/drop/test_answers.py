"""DROP's answers read defensively: JSON nested deeper than Python's parser follows is no
answer, not an exception out of the pull, the upload or the notification endpoint."""

from __future__ import annotations

import io

import requests

from integrations.drop.answers import error_text, json_body
from integrations.drop.notifications import notification_message

DEEP = b"[" * 100_000 + b"]" * 100_000


def response(body: bytes, status: int = 500) -> requests.Response:
    answer = requests.Response()
    answer.status_code = status
    answer.reason = "Internal Server Error"
    answer._content = False  # type: ignore[assignment]  # read from the stream, as sent
    answer.raw = io.BytesIO(body)
    return answer


def test_a_json_answer_nested_too_deeply_is_no_body() -> None:
    assert json_body(response(DEEP, 200)) is None


def test_an_error_nested_too_deeply_is_told_as_its_text() -> None:
    deep_object = b'{"message":' + DEEP + b"}"
    text = error_text(response(deep_object), redact=lambda s: s)
    assert text.startswith('{"message":[[[')
    assert len(text) <= 503


def test_a_notification_nested_too_deeply_has_no_message() -> None:
    assert notification_message(b'{"message":' + DEEP + b"}") == ""
