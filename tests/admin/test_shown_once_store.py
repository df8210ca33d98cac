"""A secret shown once waits encrypted in a short-lived store, never in the session table,
for this session only, at most 10 minutes, and is gone once shown."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from integrations.models import AdminSession, Broker, ShownOnceSecret
from integrations.tasks import purge_shown_once

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client: Client) -> Client:
    user = User.objects.create_superuser("alice", "alice@example.com", "pw-alice-123")
    client.force_login(user)
    return client


def _create_key(staff: Client, broker: Broker) -> str:
    """Adds an API key; returns the shown-once page's URL (not yet opened)."""
    response = staff.post(
        "/admin/integrations/apikey/add/",
        {"broker": broker.pk, "name": "cb", "scopes": ["webhook_callback"]},
    )
    assert response.status_code == 302
    return response["Location"]


def _key_on(page: str) -> str:
    match = re.search(r"(dpk_[A-Za-z0-9_-]{40,})", page)
    assert match, "the new key is shown"
    return match.group(1)


def test_the_secret_waits_encrypted_outside_the_session(staff: Client, broker: Broker) -> None:
    url = _create_key(staff, broker)

    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM integrations_shownoncesecret")
        (stored,) = cursor.fetchone()  # type: ignore[misc]
    sessions = [s.get_decoded() for s in AdminSession.objects.all()]

    key = _key_on(staff.get(url).content.decode())
    assert key not in stored, "kept in clear"
    assert all(key not in str(session) for session in sessions), "kept in the session table"
    assert not ShownOnceSecret.objects.exists(), "still kept after it was shown"
    assert staff.get(url).status_code == 410


def test_the_secret_is_gone_after_ten_minutes(staff: Client, broker: Broker) -> None:
    before = timezone.now()
    url = _create_key(staff, broker)
    waiting = ShownOnceSecret.objects.get()
    ten = dt.timedelta(minutes=10)
    assert before + ten <= waiting.expires_at <= timezone.now() + ten
    ShownOnceSecret.objects.update(expires_at=waiting.expires_at - dt.timedelta(minutes=10))

    response = staff.get(url)
    assert response.status_code == 410
    assert b"dpk_" not in response.content


def test_another_session_cannot_see_it(staff: Client, broker: Broker) -> None:
    url = _create_key(staff, broker)
    other = Client()
    other.force_login(User.objects.create_superuser("bob", "bob@example.com", "pw-bob-123"))

    assert other.get(url).status_code == 410
    assert staff.get(url).status_code == 200  # the other session's try did not consume it


def test_a_secret_nobody_came_to_see_is_deleted_by_the_periodic_job(
    staff: Client, broker: Broker
) -> None:
    _create_key(staff, broker)
    assert purge_shown_once() == 0  # still within its 10 minutes
    ShownOnceSecret.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))

    assert purge_shown_once() == 1
    assert not ShownOnceSecret.objects.exists()


def test_its_name_says_when_it_ends_in_drops_zone() -> None:
    # The admin's times are DROP's (California's); a bare 16:30 read as UTC is 8:30 there.
    secret = ShownOnceSecret(expires_at=dt.datetime(2026, 12, 3, 16, 30, tzinfo=dt.UTC))

    assert str(secret) == "secret shown once, until 2026-12-03 08:30 PST"
