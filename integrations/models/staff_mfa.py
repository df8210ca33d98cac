"""Staff second factors (django-otp devices) whose secrets are encrypted at rest.

django-otp's own TOTPDevice keeps the seed as a plain hex column and its StaticToken the
recovery codes in clear: a database dump or backup would hold every staff member's second
factor. These two devices are django-otp ``Device`` models (its middleware, ``login`` and
``is_verified`` work with them as with its own) that keep their secrets in
``EncryptedTextField`` columns, under ``DROPPORTAL_ENCRYPTION_KEYS`` like every credential
(``secrets reencrypt`` rotates them). The one-time-code check itself stays django-otp's:
``StaffTotpDevice`` lends TOTPDevice's ``verify_token`` the key through ``bin_key``.

Call ``verify_token`` on a row locked with ``select_for_update`` (``services/staff/staff_mfa.py``
does): the lock is what keeps a code from being spent by two requests at once.
"""

from __future__ import annotations

from binascii import unhexlify
from typing import Any

from django.db import models
from django.utils.crypto import constant_time_compare
from django_otp.models import Device, ThrottlingMixin, TimestampMixin
from django_otp.plugins.otp_totp.models import TOTPDevice

from integrations.models.fields import EncryptedTextField


class StaffTotpDevice(TimestampMixin, ThrottlingMixin, Device):  # type: ignore[misc]
    """A staff member's authenticator app. Unconfirmed, it belongs to the session enrolling
    it (``enrolling_session_digest``): another session of the same account never sees it."""

    seed = EncryptedTextField()  # hex, as django-otp's TOTPDevice.key
    enrolling_session_digest = models.CharField(max_length=64, blank=True, db_index=True)
    step = models.PositiveSmallIntegerField(default=30)
    t0 = models.BigIntegerField(default=0)
    digits = models.PositiveSmallIntegerField(default=6)
    tolerance = models.PositiveSmallIntegerField(default=1)
    drift = models.SmallIntegerField(default=0)
    last_t = models.BigIntegerField(default=-1)  # a code's time step is accepted once

    class Meta(Device.Meta):
        verbose_name = "staff authenticator app"

    @property
    def bin_key(self) -> bytes:
        return unhexlify(self.seed.encode())

    # django-otp's TOTP check and otpauth URI, reading the seed through bin_key.
    verify_token = TOTPDevice.verify_token
    config_url = TOTPDevice.config_url
    get_throttle_factor = TOTPDevice.get_throttle_factor
    _read_str_from_settings = TOTPDevice._read_str_from_settings


class StaffRecoveryCodes(TimestampMixin, ThrottlingMixin, Device):  # type: ignore[misc]
    """A staff member's unused single-use recovery codes, as one encrypted value."""

    codes = EncryptedTextField()  # space-separated

    class Meta(Device.Meta):
        verbose_name = "staff recovery codes"

    def get_throttle_factor(self) -> int:
        return 1

    def verify_token(self, token: Any) -> bool:
        """Spend ``token`` if it is one of the codes (the caller holds the row's lock)."""
        allowed, _ = self.verify_is_allowed()
        if not allowed:
            return False
        remaining = self.codes.split()
        spent = next((c for c in remaining if constant_time_compare(c, str(token))), None)
        if spent is None:
            self.throttle_increment(commit=True)
            return False
        remaining.remove(spent)
        self.codes = " ".join(remaining)
        self.throttle_reset(commit=False)
        self.set_last_used_timestamp(commit=False)
        self.save()
        return True

    @property
    def remaining(self) -> int:
        return len(self.codes.split())
