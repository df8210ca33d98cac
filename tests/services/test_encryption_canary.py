"""Wrong ``DROPPORTAL_ENCRYPTION_KEYS``: checked against a stored canary at start and by
/readyz, so a command says so in one line and the load balancer takes the process out,
instead of a traceback per command and a 500 per request; ``secrets reencrypt`` rotates the
canary with every other secret."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.test import Client

from integrations.models import EncryptionCanary
from integrations.services.staff.brokers import broker_create
from integrations.services.staff.keys import api_key_create
from integrations.services.staff.secrets import ENCRYPTION_KEYS_WRONG, encryption_keys_check
from tests.conftest import bearer, subprocess_env

OTHER_KEY = Fernet.generate_key().decode()


def _manage(*args: str, keys: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        env=subprocess_env(DROPPORTAL_ENCRYPTION_KEYS=keys),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db(transaction=True)
def test_a_command_with_other_keys_says_so_in_one_line(settings: Any) -> None:
    broker_create(broker_id="4821", name="Acme", drop_api_key="dk_live_1", actor="test")
    keys = ",".join(settings.DROPPORTAL_ENCRYPTION_KEYS)

    # No canary yet: the other keys fail on the stored secret, and write none.
    assert not EncryptionCanary.objects.exists()
    before_the_canary = _manage("brokers", "list", keys=OTHER_KEY)
    assert not EncryptionCanary.objects.exists()
    # The right keys start, and their start writes the canary.
    assert _manage("brokers", "list", keys=keys).returncode == 0
    assert EncryptionCanary.objects.exists()
    assert encryption_keys_check() is None
    # Written by an earlier start: the other keys fail on the canary.
    after_the_canary = _manage("brokers", "list", keys=OTHER_KEY)

    for refused in (before_the_canary, after_the_canary):
        assert refused.returncode != 0
        assert refused.stdout == ""
        assert refused.stderr.strip().splitlines() == [f"CommandError: {ENCRYPTION_KEYS_WRONG}"]
    assert "DROPPORTAL_ENCRYPTION_KEYS" in ENCRYPTION_KEYS_WRONG


@pytest.mark.django_db(transaction=True)
def test_the_worker_refuses_to_start_with_other_keys(settings: Any) -> None:
    broker_create(broker_id="4821", name="Acme", drop_api_key="dk_live_1", actor="test")
    refused = _manage("worker", keys=OTHER_KEY)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [f"CommandError: {ENCRYPTION_KEYS_WRONG}"]


@pytest.mark.django_db
def test_readyz_is_not_ready_while_the_keys_cannot_read_the_secrets(
    settings: Any, client: Client
) -> None:
    # /readyz details are for the operator's metrics key of every broker.
    key = api_key_create(broker=None, scopes=["metrics"], actor="test").key
    broker_create(broker_id="7001", name="Other", drop_api_key="dk_live_2", actor="test")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers")
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES")
    assert client.get("/readyz").json() == {"ready": True}

    settings.DROPPORTAL_ENCRYPTION_KEYS = [OTHER_KEY]
    response = client.get("/readyz", **bearer(key))

    assert response.status_code == 503
    assert response.json()["missing"] == ["encryption_keys"]
    assert response.json()["checks"]["encryption_keys"] == ENCRYPTION_KEYS_WRONG
    assert client.get("/readyz").json() == {"ready": False}


@pytest.mark.django_db
def test_reencrypt_rotates_the_canary_so_the_old_key_can_go(settings: Any) -> None:
    old = settings.DROPPORTAL_ENCRYPTION_KEYS[0]
    assert encryption_keys_check() is None  # writes the canary under the old key
    settings.DROPPORTAL_ENCRYPTION_KEYS = [OTHER_KEY, old]
    call_command("secrets", "reencrypt")

    settings.DROPPORTAL_ENCRYPTION_KEYS = [OTHER_KEY]
    assert encryption_keys_check() is None
    settings.DROPPORTAL_ENCRYPTION_KEYS = [old]
    assert encryption_keys_check() == ENCRYPTION_KEYS_WRONG


@pytest.mark.django_db
def test_a_malformed_key_is_named(settings: Any) -> None:
    settings.DROPPORTAL_ENCRYPTION_KEYS = ["not-a-fernet-key"]
    assert "not a Fernet key" in (encryption_keys_check() or "")
