"""Secrets at rest: MultiFernet, newest key first, and re-encryption with the newest key."""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection

from integrations import encryption
from integrations.models import Broker
from integrations.services.staff.brokers import broker_create

OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


def stored_token() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT drop_api_key FROM integrations_broker")
        return cursor.fetchone()[0]


def test_round_trip_and_ciphertext_differs(settings) -> None:
    settings.DROPPORTAL_ENCRYPTION_KEYS = [NEW]
    token = encryption.encrypt("s3cret")
    assert "s3cret" not in token
    assert encryption.decrypt(token) == "s3cret"
    assert encryption.encrypt("s3cret") != token


def test_a_remembered_credential_is_forgotten_with_the_keys(settings) -> None:
    settings.DROPPORTAL_ENCRYPTION_KEYS = [OLD]
    token = encryption.encrypt("whsec_x")
    assert encryption.decrypt_credential(token) == "whsec_x"
    settings.DROPPORTAL_ENCRYPTION_KEYS = [NEW]  # the old key withdrawn: no longer readable
    with pytest.raises(encryption.DecryptionError, match="cannot be decrypted"):
        encryption.decrypt_credential(token)


def test_unknown_key_is_a_clear_error(settings) -> None:
    settings.DROPPORTAL_ENCRYPTION_KEYS = [OLD]
    token = encryption.encrypt("s3cret")
    settings.DROPPORTAL_ENCRYPTION_KEYS = [NEW]
    with pytest.raises(encryption.DecryptionError, match="cannot be decrypted"):
        encryption.decrypt(token)


@pytest.mark.django_db
def test_reencrypt_moves_stored_secrets_to_the_newest_key(settings) -> None:
    settings.DROPPORTAL_ENCRYPTION_KEYS = [OLD]
    broker_create(broker_id="4821", name="A", drop_api_key="drop-key", actor="test")
    old_token = stored_token()
    settings.DROPPORTAL_ENCRYPTION_KEYS = [NEW, OLD]
    assert Broker.objects.get().drop_api_key == "drop-key"  # old key still reads
    out = io.StringIO()
    call_command("secrets", "reencrypt", stdout=out)
    assert "Re-encrypted 1" in out.getvalue()
    assert stored_token() != old_token
    settings.DROPPORTAL_ENCRYPTION_KEYS = [NEW]  # the old key can go now
    assert Broker.objects.get().drop_api_key == "drop-key"
