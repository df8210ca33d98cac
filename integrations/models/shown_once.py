"""Secrets waiting to be shown once to the staff member who just created them.

Not in the session: a row here is encrypted, bound to the session that created it (by a
digest of its key), lives at most ``SHOWN_ONCE_TTL`` and is deleted when shown.
"""

from __future__ import annotations

import datetime as dt

from django.db import models

from integrations.drop_zone import drop_time_text
from integrations.models.fields import EncryptedTextField

SHOWN_ONCE_TTL = dt.timedelta(minutes=10)


class ShownOnceSecret(models.Model):
    token_digest = models.CharField(max_length=64, unique=True)  # SHA-256 of the URL's token
    session_digest = models.CharField(max_length=64)  # SHA-256 of the creating session's key
    payload = EncryptedTextField()  # the page to show, as JSON
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "secret shown once"

    def __str__(self) -> str:
        return f"secret shown once, until {drop_time_text(self.expires_at)}"
