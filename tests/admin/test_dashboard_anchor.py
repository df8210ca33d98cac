"""The dashboard says where the ledger's chain is anchored outside: the last RFC 3161 token
(when, which position, which authority), or plainly that it is anchored nowhere."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from devtools.tsa_simulator import TsaSimulator
from integrations.drop.calendar import drop_timezone
from integrations.ledger_kinds import LedgerKind
from integrations.services.ledger import ledger_event_append
from integrations.services.ledger_anchors import AnchorFailed, ledger_anchor

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-a-123"))
    return client


def anchor_section(client: Client) -> str:
    page = client.get("/admin/").content.decode()
    found = re.search(
        r'<section class="dp-broker dp-anchor" id="ledger-anchor".*?</section>', page, re.S
    )
    assert found, "no ledger anchor section on the dashboard"
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", found.group(0))).split())


def test_without_an_authority_the_dashboard_says_the_chain_is_anchored_nowhere(
    client: Client, settings: Any
) -> None:
    settings.DROPPORTAL_TSA_URL = ""
    assert "The ledger's chain is anchored nowhere outside this service." in anchor_section(client)


def test_the_dashboard_shows_the_last_anchor_and_a_failure_since(
    client: Client, settings: Any
) -> None:
    with transaction.atomic():
        ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id="4821")
    with TsaSimulator() as tsa:
        settings.DROPPORTAL_TSA_URL = tsa.url
        settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS = True
        assert "Not anchored yet" in anchor_section(client)
        anchor = ledger_anchor()
        section = anchor_section(client)
        assert "anchored nowhere" not in section
        assert f"chain position {anchor.position} (event {anchor.event_id})" in section
        assert f"timestamped by {tsa.url}" in section
        shown = anchor.gen_time.astimezone(drop_timezone())  # staff read DROP's calendar
        assert f"Last anchored {shown:%b %-d, %Y, %H:%M} {shown.tzname()}" in section
        tsa.refuse_next(503)
        with pytest.raises(AnchorFailed):
            ledger_anchor()
        assert "The last attempt failed: HTTP 503. The worker tries again." in anchor_section(
            client
        )
