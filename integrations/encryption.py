"""Secrets at rest: MultiFernet over ``DROPPORTAL_ENCRYPTION_KEYS`` (newest key first).

Everything a broker gives us to keep secret (DROP API keys, webhook secrets, ISI tokens)
is stored as a Fernet token. Encryption always uses the newest key; decryption tries
every key, so an old key stays readable until ``manage.py secrets reencrypt`` has run::

    token = encryption.encrypt("whsec_...")
    encryption.decrypt(token)  # "whsec_..."
"""

from __future__ import annotations

from functools import cache, lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver


class DecryptionError(Exception):
    """A stored secret cannot be read with any configured key."""


@cache
def _fernet() -> MultiFernet:
    keys = settings.DROPPORTAL_ENCRYPTION_KEYS
    if not keys:
        raise DecryptionError("DROPPORTAL_ENCRYPTION_KEYS holds no key")
    return MultiFernet([Fernet(key.encode() if isinstance(key, str) else key) for key in keys])


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: object) -> None:
    if setting == "DROPPORTAL_ENCRYPTION_KEYS":
        _fernet.cache_clear()
        decrypt_credential.cache_clear()


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode("ascii")).decode("utf-8")
    except InvalidToken as exc:
        raise DecryptionError(
            "a stored secret cannot be decrypted with DROPPORTAL_ENCRYPTION_KEYS"
        ) from exc


@lru_cache(maxsize=1024)
def decrypt_credential(token: str | None) -> str | None:
    """``decrypt``, remembered by token, for a credential read on every request (a webhook
    secret, by each callback; the callbacks bench measures what it saves, docs/benchmarks.md):
    the token never changes without its ciphertext changing, and the clear value is in this
    process's memory anyway while it is used. Never for consumer data. None or "" (no
    credential) comes back as it is, as an ``EncryptedTextField`` gives it."""
    return decrypt(token) if token else token


def rotate(token: str) -> str:
    """Re-encrypt ``token`` under the newest key (no-op in meaning, new ciphertext)."""
    try:
        return _fernet().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken as exc:
        raise DecryptionError(
            "a stored secret cannot be decrypted with DROPPORTAL_ENCRYPTION_KEYS"
        ) from exc
