"""Stored credentials are write-only in the admin, for every role, superusers included.

No admin page holds a stored credential: the DROP API key, ISI tokens, OAuth client secrets,
SaaS tokens, Webhook Secrets (current and previous), a cached access token, or a staff
member's TOTP seed and recovery codes. The walk that proves it for each role is the role
table's (``tests/admin/test_role_table.py``), over the world built by ``credentials_stored``:
every page a role opens there is read for every credential, and Auditors, Operators and
superusers also open ``credential_pages`` (the dashboard, every registered model's list, the
change and history pages of every row of a model that holds a credential and of the first
row of the others). The tests here read the broker's page alone.
"""

from __future__ import annotations

import datetime as dt
from base64 import b32encode

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_otp.oath import TOTP

from integrations.models import (
    Broker,
    Integration,
    IsiAuth,
    SaasConnection,
)
from integrations.services.staff.brokers import broker_update
from integrations.services.staff.staff_mfa import staff_mfa_enrol, staff_mfa_pending_device
from tests.builders import IsiIntegrationFactory

pytestmark = pytest.mark.django_db

DROP_KEY = "drop-key-4f1c2a9e7b"
ISI_TOKEN = "isi-static-token-8d3e"
CLIENT_SECRET = "oauth-client-secret-6a2f"
ACCESS_TOKEN = "oauth-access-token-1b7c"
SAAS_TOKEN = "saas-token-9e4d"
PREVIOUS_SECRET = "whsec_" + "P" * 43

CREDENTIAL_MODELS = {Broker, Integration, SaasConnection}


def credentials_stored(broker: Broker, integration: Integration, api_key: str) -> list[str]:
    """Every kind of stored credential, added to a world that holds a sample cycle (its
    ``integration`` gets a previous Webhook Secret); ``api_key`` is a key the world minted."""
    broker_update(broker=broker, actor="test", drop_api_key=DROP_KEY)
    Integration.objects.filter(pk=integration.pk).update(
        previous_webhook_secret=PREVIOUS_SECRET,
        previous_secret_expires_at=timezone.now() + dt.timedelta(hours=1),
    )
    token_isi = IsiIntegrationFactory.create(
        broker=broker,
        name="Token API",
        base_url="https://api.acme.example",
        token=ISI_TOKEN,
        webhook_secret="whsec_" + "T" * 43,
    )
    oauth_isi = IsiIntegrationFactory.create(
        broker=broker,
        name="OAuth API",
        base_url="https://api2.acme.example",
        auth=IsiAuth.OAUTH,
        token="",
        token_url="https://auth.acme.example/token",
        client_id="dropportal",
        client_secret=CLIENT_SECRET,
        access_token=ACCESS_TOKEN,
        webhook_secret="whsec_" + "O" * 43,
    )
    SaasConnection.objects.update(token=SAAS_TOKEN)
    stored = [DROP_KEY, ISI_TOKEN, CLIENT_SECRET, ACCESS_TOKEN, SAAS_TOKEN, PREVIOUS_SECRET]
    stored += [i.webhook_secret for i in (integration, token_isi, oauth_isi)]
    # A staff member's TOTP seed and recovery codes are credentials too.
    enrolled = User.objects.create_user("enrolled", password="pw-123-enrolled", is_staff=True)
    device = staff_mfa_pending_device(user=enrolled, session_key="enrolling")
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    codes = staff_mfa_enrol(
        user=enrolled,
        session_key="enrolling",
        token=f"{totp.token():06d}",
        password="pw-123-enrolled",
        actor="test",
    )
    return [*stored, api_key, device.seed, b32encode(device.bin_key).decode(), *codes]


def _login(client: Client, role: str) -> Client:
    if role == "superuser":
        user = User.objects.create_superuser("root", "root@example.com", "pw-123-root")
    else:
        user = User.objects.create_user(role.lower(), password="pw-123-role", is_staff=True)
        user.groups.add(Group.objects.get(name=role))
    client.force_login(user)
    return client


def credential_pages() -> list[str]:
    """Every admin page of every registered model with data present."""
    urls = [reverse("admin:index")]
    for model, _ in admin.site._registry.items():
        meta = model._meta
        prefix = f"admin:{meta.app_label}_{meta.model_name}"
        urls.append(reverse(f"{prefix}_changelist"))
        rows = model._default_manager.all()
        # Every row of a model that holds a credential, through each kind's pages too.
        holds_credentials = model._meta.concrete_model in CREDENTIAL_MODELS
        for obj in rows if holds_credentials else rows[:1]:
            urls.append(reverse(f"{prefix}_change", args=[obj.pk]))
            urls.append(reverse(f"{prefix}_history", args=[obj.pk]))
    return urls


# These two read the broker's page alone: a broker is all it needs, not every credential.
def test_a_credential_not_set_says_so(broker: Broker, client: Client) -> None:
    Broker.objects.update(drop_api_key="")
    staff = _login(client, "Auditors")
    page = staff.get(reverse("admin:integrations_broker_change", args=[broker.pk])).content
    assert b"not set" in page


def test_a_manager_enters_a_new_value_into_an_empty_input(broker: Broker, client: Client) -> None:
    broker_update(broker=broker, actor="test", drop_api_key=DROP_KEY)
    staff = _login(client, "superuser")
    page = staff.get(reverse("admin:integrations_broker_change", args=[broker.pk])).content
    assert b'type="password" name="drop_api_key"' in page
    assert DROP_KEY.encode() not in page


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_saving_a_page_without_a_new_credential_records_no_change_of_it(
    broker: Broker, client: Client
) -> None:
    # Django's history of the row (every role that may view it reads it) said "Changed DROP
    # API key" at every save: the form's initial value was the stored key, the input empty.
    broker_update(broker=broker, actor="test", drop_api_key=DROP_KEY)
    staff = _login(client, "Connections managers")
    url = reverse("admin:integrations_broker_change", args=[broker.pk])
    page = staff.get(url)
    assert DROP_KEY not in page.context["adminform"].form.initial.values()
    saved = staff.post(url, {"name": "Acme Data 2", "mode": broker.mode, "pull_interval_days": 30})
    assert saved.status_code == 302
    (entry,) = LogEntry.objects.filter(object_id=str(broker.pk))
    assert "DROP API key" not in entry.change_message
    assert "Name" in entry.change_message
    assert Broker.objects.get().drop_api_key == DROP_KEY
    history = staff.get(reverse("admin:integrations_broker_history", args=[broker.pk]))
    assert "DROP API key" not in history.content.decode()
