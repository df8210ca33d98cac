"""Helpers shared by the admin tests: one of each kind of stored credential, and the pages
that must never show one (``test_credentials_write_only`` and the role table's walk)."""

from __future__ import annotations

import datetime as dt
from base64 import b32encode

from django.contrib import admin
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from django_otp.oath import TOTP

from integrations.models import Broker, Integration, IsiAuth, SaasConnection
from integrations.services.staff.brokers import broker_update
from integrations.services.staff.staff_mfa import staff_mfa_enrol, staff_mfa_pending_device
from tests.builders import IsiIntegrationFactory

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
