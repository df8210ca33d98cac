"""The broker guide's ISI section is right: its signed callback verifies, its bodies are the
ones dropportal sends and accepts, and the admin's links land on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import markdown

from integrations.api.isi_callbacks import IsiCallbackSerializer
from integrations.dispatch import signing

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "broker-guide.md").read_text()
ISI = GUIDE.split("## ISI: your REST API", 1)[1]


def _row(label: str) -> str:
    match = re.search(rf"^\| {re.escape(label)} \| `([^`]+)` \|$", GUIDE, re.MULTILINE)
    assert match, f"the guide has no {label!r} row"
    return match.group(1)


def test_the_isi_callback_example_verifies_and_is_a_valid_completion() -> None:
    secret = _row("Webhook Secret")
    timestamp = _row("`X-Webhook-Timestamp`")
    body = _row("ISI callback body (exact bytes)")

    signing.verify(
        [secret], timestamp, _row("ISI `X-Webhook-Signature`"), body.encode(), now=int(timestamp)
    )
    assert IsiCallbackSerializer(data=json.loads(body)).is_valid()
    assert f"BODY='{body}'" in ISI  # the curl example sends the same bytes


def test_the_delete_example_has_exactly_the_fields_of_2_6() -> None:
    example = re.search(r"^(\{\"request_uuid\".*\})$", ISI, re.MULTILINE)
    assert example
    sent = json.loads(example.group(1))
    assert list(sent) == [
        "request_uuid", "results_token", "callback_path", "drop_context",
        "remote_identifier", "remote_identifier_kind",
    ]  # fmt: skip
    assert list(sent["drop_context"]) == ["broker_id", "drop_session_id", "hash_type", "match_date"]
    assert sent["callback_path"] == "/api/v1/drop/callbacks/isi"


def test_the_section_the_admin_links_to_exists() -> None:
    rendered = markdown.markdown(GUIDE, extensions=["toc"])

    for anchor in ("isi-your-rest-api", "completion-callback"):
        assert f'id="{anchor}"' in rendered
