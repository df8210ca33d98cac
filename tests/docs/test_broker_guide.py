"""The broker guide's worked examples are right: brokers check their code against them."""

from __future__ import annotations

import re
from pathlib import Path

from integrations.dispatch import signing

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "broker-guide.md").read_text()


def _row(label: str) -> str:
    match = re.search(rf"^\| {re.escape(label)} \| `([^`]+)` \|$", GUIDE, re.MULTILINE)
    assert match, f"the worked example has no {label!r} row"
    return match.group(1)


def test_the_worked_callback_example_verifies() -> None:
    secret = _row("Webhook Secret")
    timestamp = _row("`X-Webhook-Timestamp`")
    body = _row("Callback body (exact bytes)").encode()
    signature = _row("`X-Webhook-Signature`")

    signing.verify([secret], timestamp, signature, body, now=int(timestamp))
    assert signing.sign(secret, int(timestamp), body) == signature


def test_the_example_dispatch_verifies_with_the_same_secret() -> None:
    secret = _row("Webhook Secret")
    request = re.search(
        r"X-Webhook-Timestamp: (\d+)\nX-Webhook-Signature: (\S+)\n\n(\{.*\})\n", GUIDE
    )
    assert request, "the guide shows a dispatch"
    timestamp, signature, body = request.groups()

    signing.verify([secret], timestamp, signature, body.encode(), now=int(timestamp))
    assert signature in GUIDE.split("## Worked example")[1]  # quoted there too


def test_the_drop_notification_example_verifies() -> None:
    from integrations.drop.notifications import notification_signature

    example = GUIDE.split("## DROP's notifications")[1]
    fields = dict(
        line.split(maxsplit=1)
        for line in example.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    )
    assert (
        notification_signature(
            fields["secret"], fields["timestamp"].strip(), fields["body"].strip().encode()
        )
        == fields["signature"].strip()
    )
