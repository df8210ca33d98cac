"""The encryption canary: one known value encrypted under ``DROPPORTAL_ENCRYPTION_KEYS``.

A process whose keys cannot read it cannot read the stored secrets either; it says so in
one line at start and in ``/readyz`` instead of failing request by request
(``services/staff/secrets.py`` ``encryption_keys_check``). ``secrets reencrypt`` rotates it with
every other encrypted column.
"""

from __future__ import annotations

from django.db import models

from integrations.models.fields import EncryptedTextField

CANARY_PK = 1
CANARY_TEXT = "dropportal encryption canary"


class EncryptionCanary(models.Model):
    id = models.PositiveSmallIntegerField(primary_key=True, default=CANARY_PK)
    token = EncryptedTextField()  # CANARY_TEXT, encrypted
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "encryption canary"
        constraints = [
            models.CheckConstraint(condition=models.Q(id=CANARY_PK), name="encryption_canary_one")
        ]

    def __str__(self) -> str:
        return "encryption canary"
