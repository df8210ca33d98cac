"""Re-encrypting every stored secret under the newest ``DROPPORTAL_ENCRYPTION_KEYS`` key."""

from __future__ import annotations

from django.apps import apps
from django.db import connection, models, transaction

from integrations import encryption
from integrations.ledger_kinds import LedgerKind
from integrations.models.fields import EncryptedTextField
from integrations.services.ledger import ledger_event_append


def secrets_reencrypt(*, actor: str) -> int:
    """Rotate every stored Fernet token to the newest key, in one transaction."""
    total = 0
    with transaction.atomic():
        for model in apps.get_app_config("integrations").get_models():
            columns = [
                f.column
                for f in model._meta.fields
                if isinstance(f, EncryptedTextField) and f.column
            ]
            if columns:
                total += _rotate_table(model, columns)
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
