"""Secrets at rest: re-encrypting every stored secret under the newest
``DROPPORTAL_ENCRYPTION_KEYS`` key, and checking that the configured keys read them::

    problem = encryption_keys_check()  # None, or one line naming the setting to fix
"""

from __future__ import annotations

from django.apps import apps
from django.db import connection, models, transaction

from integrations import encryption
from integrations.ledger_kinds import LedgerKind
from integrations.models import EncryptionCanary
from integrations.models.encryption import CANARY_PK, CANARY_TEXT
from integrations.models.fields import EncryptedTextField
from integrations.services.ledger import ledger_event_append

ENCRYPTION_KEYS_WRONG = (
    "DROPPORTAL_ENCRYPTION_KEYS cannot decrypt the stored secrets: set it to the keys they "
    "were encrypted with (newest first, the same on every host)"
)
ENCRYPTION_KEYS_MALFORMED = (
    "DROPPORTAL_ENCRYPTION_KEYS holds a value that is not a Fernet key (32 url-safe base64 "
    "bytes, comma-separated, newest first)"
)


def secrets_reencrypt(*, actor: str) -> int:
    """Rotate every stored Fernet token to the newest key (the encryption canary's too), in
    one transaction."""
    total = 0
    with transaction.atomic():
        for model in apps.get_app_config("integrations").get_models():
            columns = [
                f.column
                for f in model._meta.fields
                if isinstance(f, EncryptedTextField) and f.column
            ]
            if columns:
                rotated = _rotate_table(model, columns)
                total += 0 if model is EncryptionCanary else rotated  # counted: the user's
        ledger_event_append(
            kind=LedgerKind.SECRETS_REENCRYPTED, actor=actor, data={"secrets": total}
        )
    return total


def _rotate_table(model: type[models.Model], columns: list[str]) -> int:
    # Raw tokens: rotate the ciphertext directly; the clear text never reaches Python objects.
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    pk = quote(model._meta.pk.column)  # type: ignore[union-attr,arg-type]
    selected = ", ".join(quote(c) for c in columns)
    assignments = ", ".join(f"{quote(c)} = %s" for c in columns)
    rotated = 0
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {pk}, {selected} FROM {table} FOR UPDATE")  # noqa: S608
        for pk_value, *tokens in cursor.fetchall():
            cursor.execute(
                f"UPDATE {table} SET {assignments} WHERE {pk} = %s",  # noqa: S608
                [*(encryption.rotate(t) if t else t for t in tokens), pk_value],
            )
            rotated += sum(1 for t in tokens if t)
    return rotated


def encryption_keys_check() -> str | None:
    """None when ``DROPPORTAL_ENCRYPTION_KEYS`` reads the stored secrets, else the one line
    to show. Reads the encryption canary; the first check on a database writes it, once the
    keys have read a secret already stored (if any). A database error propagates."""
    try:
        stored = _canary()
        if stored is None:
            sample = _stored_secret()
            if sample is not None:
                encryption.decrypt(sample)
            # Two processes starting together: the first one's canary stands.
            EncryptionCanary.objects.bulk_create(
                [EncryptionCanary(pk=CANARY_PK, token=CANARY_TEXT)], ignore_conflicts=True
            )
            stored = _canary()
    except encryption.DecryptionError:
        return ENCRYPTION_KEYS_WRONG
    except ValueError:  # Fernet's own refusal of a malformed key
        return ENCRYPTION_KEYS_MALFORMED
    return None if stored == CANARY_TEXT else ENCRYPTION_KEYS_WRONG


def _canary() -> str | None:
    return EncryptionCanary.objects.filter(pk=CANARY_PK).values_list("token", flat=True).first()


def _stored_secret() -> str | None:
    """One encrypted value stored anywhere (its token), or None when there is none: one
    statement over every encrypted column, which stops at the first value it finds."""
    quote = connection.ops.quote_name
    selects = [
        f"(SELECT {quote(field.column)} FROM {quote(model._meta.db_table)} "  # noqa: S608
        f"WHERE {quote(field.column)} <> '' LIMIT 1)"
        for model in apps.get_app_config("integrations").get_models()
        if model is not EncryptionCanary
        for field in model._meta.fields
        if isinstance(field, EncryptedTextField) and field.column
    ]
    if not selects:
        return None
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(selects) + " LIMIT 1")
        row = cursor.fetchone()
    return None if row is None else str(row[0])
