"""Guided configuration: a secret is shown once on its own page, next to the guide section."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from integrations.models import Broker, Integration

pytestmark = pytest.mark.django_db

SECRET_RE = re.compile(r'value="(whsec_[A-Za-z0-9_-]{43})"')


def logged_in(username: str) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser(username, f"{username}@example.com", "pw-9x"))
    return client


def add_webhook(client: Client, broker: Broker) -> tuple[str, str]:
    """(the page's URL, its HTML) after adding a webhook integration."""
    response = client.post(
        "/admin/integrations/integration/add/",
        {"broker": broker.pk, "name": "Acme deletions", "url": "https://hooks.example.com/drop"},
        follow=True,
    )
    url, status = response.redirect_chain[-1]
    assert status == 302
    return url, response.content.decode()


def test_a_new_webhook_secret_is_shown_once_with_where_it_goes(broker: Broker) -> None:
    alice = logged_in("alice")
    url, page = add_webhook(alice, broker)
    integration = Integration.objects.get()
    match = SECRET_RE.search(page)
    assert match and match.group(1) == integration.webhook_secret
    assert "only time this Webhook Secret is shown" in page
    assert str(integration.uuid) in page
    assert "/api/v1/drop/callbacks/deletion" in page
    assert 'href="/admin/guide/#webhook-secret"' in page

    again = alice.get(url)
    assert again.status_code == 410
    assert integration.webhook_secret not in again.content.decode()
    assert "This secret was already shown" in again.content.decode()


def test_the_secret_page_is_never_cached_nor_shown_to_another_session(broker: Broker) -> None:
    alice = logged_in("alice")
    response = alice.post(
        "/admin/integrations/integration/add/",
        {"broker": broker.pk, "name": "Acme deletions", "url": "https://hooks.example.com/drop"},
    )
    url = response["Location"]
    assert logged_in("bob").get(url).status_code == 410  # the secret lives in alice's session
    page = alice.get(url)
    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"]


def test_the_broker_guide_is_served_to_staff_with_section_anchors(client: Client) -> None:
    assert client.get("/admin/guide/").status_code == 302  # to the login page
    page = logged_in("alice").get("/admin/guide/").content.decode()
    assert 'id="webhook-secret"' in page
    assert 'id="api-keys"' in page
    assert '<a href="#verifying-a-dispatch">' in page  # the table of contents
