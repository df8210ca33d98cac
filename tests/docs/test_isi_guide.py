"""The broker guide's ISI section is right: its signed callback verifies, its bodies are the
ones dropportal sends and accepts, and the admin's links land on it."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path

import markdown
from django.utils import timezone

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


def _body_of(script: str, **env: str) -> str:
    """``$BODY`` as the guide's shell lines ``script`` set it."""
    return subprocess.run(  # noqa: S603 (the guide's own lines)
        ["bash", "-c", f'{script}\nprintf "%s" "$BODY"'],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    ).stdout


def test_the_isi_curl_example_sends_the_table_body_completed_now() -> None:
    # The curl's body is the table's, but completed now: a fixed time long past is refused.
    lines = re.search(r"^(NOW=.*)\n(BODY=.*)$", ISI, re.MULTILINE)
    assert lines, "the curl example sets NOW, then BODY"
    now_line, body_line = lines.groups()
    table = _row("ISI callback body (exact bytes)")

    # With the table's time, the very bytes the table signs.
    assert _body_of(body_line, NOW=json.loads(table)["completed_at"]) == table
    # As run, the current time, which dropportal takes as a completion time.
    completed = IsiCallbackSerializer(data=json.loads(_body_of(f"{now_line}\n{body_line}")))
    assert completed.is_valid(), completed.errors
    assert abs(completed.validated_data["completed_at"] - timezone.now()) < dt.timedelta(minutes=1)


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
