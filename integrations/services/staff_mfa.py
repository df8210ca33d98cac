"""Staff multi-factor authentication (django-otp): a TOTP app, and single-use recovery codes.

Each change is one transaction with its ledger event (never a code or a seed)::

    device = staff_mfa_pending_device(user=user)          # its seed is shown for enrolment
    codes = staff_mfa_enrol(user=user, device=device, token="123456", actor="staff:ann")
    staff_mfa_reset(user=user, actor="staff:root")        # lost phone: enrol again
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django_otp import user_has_device
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from integrations.ledger_kinds import LedgerKind
from integrations.services.ledger import ledger_event_append

RECOVERY_CODES = 10
TOTP_DEVICE_NAME = "authenticator app"
RECOVERY_DEVICE_NAME = "recovery codes"


def staff_mfa_required(user: AbstractBaseUser) -> bool:
    """Whether this staff member must pass a second factor: always in a real deployment
    (``DROPPORTAL_STAFF_MFA_REQUIRED``), and whenever they enrolled."""
    return bool(settings.DROPPORTAL_STAFF_MFA_REQUIRED) or user_has_device(user)


def staff_mfa_enrolled(user: AbstractBaseUser) -> bool:
    return TOTPDevice.objects.devices_for_user(user, confirmed=True).exists()


def staff_mfa_pending_device(*, user: AbstractBaseUser) -> TOTPDevice:
    """The unconfirmed TOTP device being enrolled (the same one until it is confirmed)."""
    with transaction.atomic():
        device = TOTPDevice.objects.devices_for_user(user, confirmed=False).first()
        if device is None:
            device = TOTPDevice.objects.create(user=user, name=TOTP_DEVICE_NAME, confirmed=False)
    return device


def staff_mfa_enrol(
    *, user: AbstractBaseUser, device: TOTPDevice, token: str, actor: str
) -> list[str]:
    """Confirm ``device`` with a code it shows; returns new recovery codes (show them once)."""
    with transaction.atomic():
        device = TOTPDevice.objects.select_for_update().get(pk=device.pk, user=user)
        if not device.verify_token((token or "").strip().replace(" ", "")):
            raise ValidationError({"token": "that code does not match: try the current one"})
        TOTPDevice.objects.filter(user=user).exclude(pk=device.pk).delete()
        device.confirmed = True
        device.save(update_fields=["confirmed"])
        codes = _recovery_codes_replace(user)
        ledger_event_append(
            kind=LedgerKind.STAFF_USER_MFA_ENROLLED,
            subject=user.get_username(),
            actor=actor,
            data={"recovery_codes": len(codes)},
        )
    return codes


def staff_mfa_recovery_codes_renew(*, user: AbstractBaseUser, actor: str) -> list[str]:
    """New recovery codes; the old ones stop working."""
    with transaction.atomic():
        codes = _recovery_codes_replace(user)
        ledger_event_append(
            kind=LedgerKind.STAFF_USER_MFA_RECOVERY_CODES_RENEWED,
            subject=user.get_username(),
            actor=actor,
            data={"recovery_codes": len(codes)},
        )
    return codes


def staff_mfa_reset(*, user: AbstractBaseUser, actor: str) -> int:
    """Remove every second factor of ``user`` (they enrol again at their next login)."""
    with transaction.atomic():
        removed, _ = TOTPDevice.objects.filter(user=user).delete()
        removed_static, _ = StaticDevice.objects.filter(user=user).delete()
        ledger_event_append(
            kind=LedgerKind.STAFF_USER_MFA_RESET,
            subject=user.get_username(),
            actor=actor,
            data={"devices_removed": removed + removed_static},
        )
    return removed + removed_static


def _recovery_codes_replace(user: AbstractBaseUser) -> list[str]:
    StaticDevice.objects.filter(user=user).delete()
    device = StaticDevice.objects.create(user=user, name=RECOVERY_DEVICE_NAME, confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=code) for code in codes)
    return codes
