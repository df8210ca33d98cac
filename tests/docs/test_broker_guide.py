"""The broker guide's worked examples are right: brokers check their code against them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from django.utils.datastructures import CaseInsensitiveMapping

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


def _guide_verify_dispatch() -> Callable[[list[str], Mapping[str, str], bytes], bool]:
    """The guide's ``verify_dispatch``, run as a broker would copy it."""
    (source,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", GUIDE, re.DOTALL)
        if "def verify_dispatch" in block
    ]
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 (the guide's own sample)
    return namespace["verify_dispatch"]  # type: ignore[no-any-return]


def test_the_guides_verify_dispatch_accepts_a_dispatch_in_any_header_case() -> None:
    verify_dispatch = _guide_verify_dispatch()
    secret, previous = _row("Webhook Secret"), signing.generate_webhook_secret()
    body = b'{"topic":"drop.test"}'
    signed = signing.signed_headers(secret, body)

    assert verify_dispatch([secret], CaseInsensitiveMapping(signed), body)
    lower = CaseInsensitiveMapping({name.lower(): value for name, value in signed.items()})
    assert verify_dispatch([previous, secret], lower, body)  # during a rotation
    assert not verify_dispatch([previous], lower, body)
    assert not verify_dispatch([secret], lower, body + b" ")


@pytest.mark.parametrize(
    ("timestamp", "signature"),
    [
        ("\u00b2", None),  # "²".isdigit() is True; int() refuses it
        ("\u0661\u0667\u0666\u0667", None),  # Arabic-Indic digits: isdigit() and int() take them
        ("1" * 5000, None),  # past the digits int() converts
        ("", None),
        (" 1767225600", None),
        (None, "\u00e9" * 44),  # compare_digest refuses a non-ASCII str
        (None, ""),
        (None, "not base64"),
    ],
    ids=[
        "superscript two",
        "arabic-indic digits",
        "5000 digits",
        "empty timestamp",
        "leading space",
        "non-ascii signature",
        "empty signature",
        "not base64",
    ],
)
def test_the_guides_verify_dispatch_says_false_to_hostile_headers(
    timestamp: str | None, signature: str | None
) -> None:
    verify_dispatch = _guide_verify_dispatch()
    secret = _row("Webhook Secret")
    body = b"{}"
    headers = signing.signed_headers(secret, body)
    if timestamp is not None:
        headers[signing.TIMESTAMP_HEADER] = timestamp
    if signature is not None:
        headers[signing.SIGNATURE_HEADER] = signature

    assert verify_dispatch([secret], CaseInsensitiveMapping(headers), body) is False
    assert verify_dispatch([secret], CaseInsensitiveMapping({}), body) is False


@pytest.mark.parametrize(
    ("skew", "accepted"),
    [(-300, True), (300, True), (-301, False), (301, False)],
    ids=["300 s ahead", "300 s old", "301 s ahead", "301 s old"],
)
def test_the_guides_verify_dispatch_keeps_the_window_alike_both_ways(
    monkeypatch: pytest.MonkeyPatch, skew: int, accepted: bool
) -> None:
    verify_dispatch = _guide_verify_dispatch()
    secret = _row("Webhook Secret")
    body = b'{"topic":"drop.test"}'
    timestamp = int(_row("`X-Webhook-Timestamp`"))
    headers = {
        signing.TIMESTAMP_HEADER: str(timestamp),
        signing.SIGNATURE_HEADER: signing.sign(secret, timestamp, body),
    }
    # Half a second past the server's whole second, as a clock mostly is.
    monkeypatch.setattr(time, "time", lambda: timestamp + skew + 0.5)

    assert verify_dispatch([secret], CaseInsensitiveMapping(headers), body) is accepted
