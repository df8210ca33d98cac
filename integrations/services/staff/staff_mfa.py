"""Staff multi-factor authentication: a TOTP app and single-use recovery codes (django-otp
devices of ``models/staff_mfa.py``, their secrets encrypted), the resets of a lost factor or
password, and a member's change of their own password.

Each change is one transaction with its ledger event (never a code or a seed)::

    device = staff_mfa_pending_device(user=user, session_key=key)  # this session's own seed
    codes = staff_mfa_enrol(user=user, session_key=key, token="123456", password=pw,
                            actor="staff:ann")
    codes = staff_mfa_recovery_codes_renew(user=user, password=pw, actor="staff:ann")
    device = staff_mfa_verify(user=user, token="123456", actor="staff:ann")  # None: refused
    staff_mfa_factor(device)  # "app" or "recovery_code", as the ledger names it
    staff_mfa_reset(user=user, actor="staff:root", by=root)  # lost phone: enrol again
    staff_password_reset_record(user_id=user.pk, actor="staff:root", by=root)  # admin set it
    staff_password_change(user=user, old_password=pw, new_password=new, actor="staff:ann",
                          keep_session_key=key)  # their own, the old one again

An enrolment belongs to the session that started it, and asks for the password again: a
session opened with a leaked or since-reset password cannot take over an account that has no
second factor yet. A reset (of the factor or of the password) ends every session of the user,
and is never of the resetting superuser's own account (``by``): a stolen session would keep
itself, end the owner's and set its own factor or password. Another superuser resets it, or
``manage.py staff reset-mfa``; one's own password changes with the old one again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django_otp.plugins.otp_static.models import StaticToken
from django_otp.util import random_hex

from integrations.ledger_kinds import LedgerKind
from integrations.models import AdminSession, StaffRecoveryCodes, StaffTotpDevice
from integrations.services.ledger import ledger_event_append

RECOVERY_CODES = 10
RECOVERY_CODE_LENGTH = 8  # django-otp's random_token(): 8 base32 letters, never an app's 6 digits
TOTP_DEVICE_NAME = "authenticator app"
RECOVERY_DEVICE_NAME = "recovery codes"
TOTP_SEED_BYTES = 20  # django-otp's default, what authenticator apps expect
# The second factors as the ledger names them (``staff_mfa_factor``).
FACTOR_APP = "app"
FACTOR_RECOVERY_CODE = "recovery_code"

REFUSED_OWN_MFA_RESET = (
    "Not on your own account: another superuser resets your two-factor authentication, or "
    "`manage.py staff reset-mfa USERNAME` on the server."
)
REFUSED_OWN_CREDENTIAL_RESET = (
    "On your own account, change your password with the old one again (Change password)."
)


def staff_mfa_required(user: AbstractBaseUser) -> bool:
    """Whether this staff member must pass a second factor: always in a real deployment
    (``DROPPORTAL_STAFF_MFA_REQUIRED``), and whenever they enrolled."""
    return bool(settings.DROPPORTAL_STAFF_MFA_REQUIRED) or staff_mfa_enrolled(user)


def staff_mfa_enrolled(user: AbstractBaseUser) -> bool:
    # Only our devices: django-otp's own (clear) ones are emptied by migration 0020.
    return StaffTotpDevice.objects.filter(user=user, confirmed=True).exists()


def _digest(session_key: str) -> str:
    return hashlib.sha256(session_key.encode()).hexdigest()


def staff_mfa_pending_device(*, user: AbstractBaseUser, session_key: str) -> StaffTotpDevice:
    """The TOTP device this session is enrolling: its own seed, made on first use and the
    same until confirmed. Another session of the account gets another one."""
    digest = _digest(session_key)
    stale = timezone.now() - dt.timedelta(seconds=settings.SESSION_COOKIE_AGE)
    with transaction.atomic():
        StaffTotpDevice.objects.filter(user=user, confirmed=False, created_at__lt=stale).delete()
        device = StaffTotpDevice.objects.filter(
            user=user, confirmed=False, enrolling_session_digest=digest
        ).first()
        if device is None:
            device = StaffTotpDevice.objects.create(
                user=user,
                name=TOTP_DEVICE_NAME,
                confirmed=False,
                seed=random_hex(TOTP_SEED_BYTES),
                enrolling_session_digest=digest,
            )
    return device


def staff_mfa_enrol(
    *, user: AbstractBaseUser, session_key: str, token: str, password: str | None, actor: str
) -> list[str]:
    """Confirm this session's pending device with a code it shows and the account's password
    again; returns new recovery codes (show them once). ``password=None`` only for an account
    that has none (it signs in through the identity provider, which this session just did)."""
    with transaction.atomic():
        # One enrolment at a time per account: the second one finds the first confirmed.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        _password_again_check(user, password)
        if staff_mfa_enrolled(user):
            raise ValidationError({"token": "two-factor authentication is already set up"})
        device = (
            StaffTotpDevice.objects.select_for_update()
            .filter(user=user, confirmed=False, enrolling_session_digest=_digest(session_key))
            .first()
        )
        if device is None:
            raise ValidationError({"token": "this set-up expired: start again"})
        if not device.verify_token((token or "").strip().replace(" ", "")):
            raise ValidationError({"token": "that code does not match: try the current one"})
        StaffTotpDevice.objects.filter(user=user).exclude(pk=device.pk).delete()
        device.confirmed = True
        device.enrolling_session_digest = ""
        device.save(update_fields=["confirmed", "enrolling_session_digest"])
        codes = _recovery_codes_replace(user)
        ledger_event_append(
            kind=LedgerKind.STAFF_USER_MFA_ENROLLED,
            subject=user.get_username(),
            actor=actor,
            data={"recovery_codes": len(codes)},
        )
    return codes


def staff_mfa_verify(
    *, user: AbstractBaseUser, token: str, actor: str
) -> StaffTotpDevice | StaffRecoveryCodes | None:
    """The device ``token`` (a code, or a recovery code) passes, or None. Only the factor the
    token is shaped for is tried (a recovery code's length: the recovery codes; otherwise the
    app's six digits) and so only that one is slowed down by a wrong try: wrong recovery codes
    never lock the owner's app out, nor the reverse. The device's row is locked while it
    checks, so one code is never accepted twice. Each wrong code is a ledger event
    (``staff_user.mfa_failed``): whoever holds the password and guesses codes leaves a
    trace; django-otp's growing delay (1 s, 2 s, 4 s... after each one) bounds them, tries
    within it being refused before any code is checked, and not recorded."""
    token = (token or "").strip().replace(" ", "").lower()
    if not token:
        return None
    model: type[StaffTotpDevice | StaffRecoveryCodes] = (
        StaffRecoveryCodes if len(token) == RECOVERY_CODE_LENGTH else StaffTotpDevice
    )
    with transaction.atomic():
        device = model.objects.select_for_update().filter(user=user, confirmed=True).first()
        if device is None or not device.verify_is_allowed()[0]:
            return None
        # A refused try commits its throttle count, and its event, with this transaction.
        if not device.verify_token(token):
            ledger_event_append(
                kind=LedgerKind.STAFF_USER_MFA_FAILED,
                subject=user.get_username(),
                actor=actor,
                data={
                    "factor": staff_mfa_factor(device),
                    "failures": device.throttling_failure_count,
                },
            )
            return None
    return device


def staff_mfa_factor(device: StaffTotpDevice | StaffRecoveryCodes) -> str:
    """The factor ``device`` is, as the ledger names it."""
    return FACTOR_RECOVERY_CODE if isinstance(device, StaffRecoveryCodes) else FACTOR_APP


@dataclass(frozen=True)
class FactorsOnceInClear:
    """A member's factors enrolled before their secrets were encrypted (``encrypted_at``):
    until then django-otp kept them in clear, and a database dump from then still holds
    them. New recovery codes and a new authenticator app make those copies worthless."""

    encrypted_at: dt.datetime
    app: bool
    recovery_codes: bool


def staff_mfa_factors_once_in_clear(user: AbstractBaseUser) -> FactorsOnceInClear | None:
    # The migration's applied time is the line: it made the encrypted copies (so each was
    # created before it is recorded as applied) and deleted the clear ones. Found by name,
    # not number, which a merge may change. One query: the dashboard shows it on every visit.
    encrypting = MigrationRecorder.Migration.objects.filter(
        app="integrations", name__endswith="_staff_mfa_encrypted"
    )
    before = {"user": user, "confirmed": True, "created_at__lte": OuterRef("applied")}
    found = (
        encrypting.annotate(
            totp_before=Exists(StaffTotpDevice.objects.filter(**before)),
            codes_before=Exists(StaffRecoveryCodes.objects.filter(**before)),
        )
        .values("applied", "totp_before", "codes_before")
        .first()
    )
    if found is None or not (found["totp_before"] or found["codes_before"]):
        return None
    return FactorsOnceInClear(
        encrypted_at=found["applied"],
        app=found["totp_before"],
        recovery_codes=found["codes_before"],
    )


def staff_mfa_recovery_codes_left(user: AbstractBaseUser) -> int:
    codes = StaffRecoveryCodes.objects.filter(user=user, confirmed=True).first()
    return codes.remaining if codes else 0


def staff_mfa_recovery_codes_renew(
    *, user: AbstractBaseUser, password: str | None, actor: str
) -> list[str]:
    """New recovery codes, with the account's password again; the old ones stop working.
    ``password=None`` only for an account that has none (it signs in through the identity
    provider, which this session did lately)."""
    with transaction.atomic():
        _password_again_check(user, password)
        if not staff_mfa_enrolled(user):
            # Not keyed "password": the password was right, and a wrong one counts as a
            # failed login (admin/lockout.py password_asked_again).
            raise ValidationError({"mfa": "set up two-factor authentication first"})
        codes = _recovery_codes_replace(user)
        ledger_event_append(
            kind=LedgerKind.STAFF_USER_MFA_RECOVERY_CODES_RENEWED,
            subject=user.get_username(),
            actor=actor,
            data={"recovery_codes": len(codes)},
        )
    return codes


def staff_mfa_reset(
    *,
    user: AbstractBaseUser,
    actor: str,
    by: AbstractBaseUser | None,
    keep_session_key: str | None = None,
) -> int:
    """Remove every second factor of ``user`` and end their sessions (but the resetting
    superuser's own, ``keep_session_key``): they log in and enrol again. ``by``: that
    superuser (None: the command line); refused on their own account."""
    _not_own_account(user.pk, by, REFUSED_OWN_MFA_RESET)
    with transaction.atomic():
        removed, _ = StaffTotpDevice.objects.filter(user=user).delete()
        removed_codes, _ = StaffRecoveryCodes.objects.filter(user=user).delete()
        ended = staff_sessions_end(user, keep_session_key=keep_session_key)
        ledger_event_append(
            kind=LedgerKind.STAFF_USER_MFA_RESET,
            subject=user.get_username(),
            actor=actor,
            data={"devices_removed": removed + removed_codes, "sessions_ended": ended},
        )
    return removed + removed_codes


def staff_password_reset_record(
    *, user_id: int, actor: str, by: AbstractBaseUser, keep_session_key: str | None = None
) -> int:
    """After a superuser (``by``) set the password of the user ``user_id``: end their sessions
    (a session opened with the old password must not enrol or act after it) and record who
    did it. Call it in the transaction that saved the password: refused on their own account
    (no old password was asked), it rolls the password back. Returns the sessions ended."""
    _not_own_account(user_id, by, REFUSED_OWN_CREDENTIAL_RESET)
    with transaction.atomic():
        user = get_user_model().objects.get(pk=user_id)
        return staff_sessions_end_recorded(
            user,
            kind=LedgerKind.STAFF_USER_PASSWORD_RESET,
            actor=actor,
            keep_session_key=keep_session_key,
        )


def staff_password_change(
    *,
    user: AbstractBaseUser,
    old_password: str,
    new_password: str,
    actor: str,
    keep_session_key: str | None = None,
) -> int:
    """A member sets their own password (``new_password``, validated by the caller's form),
    giving the current one again: their other sessions end (but ``keep_session_key``, the
    one they did it from). Returns the sessions ended."""
    with transaction.atomic():
        locked = get_user_model().objects.select_for_update().get(pk=user.pk)
        if not locked.has_usable_password():
            # Not a wrong password (nothing to guess): refused, not counted.
            raise ValidationError(
                {
                    "old_password": "this account has no password here: it signs in through "
                    "the identity provider"
                }
            )
        _password_again_check(locked, old_password)
        locked.set_password(new_password)
        locked.save(update_fields=["password"])
        user.password = locked.password  # the caller's copy keeps its session (its hash)
        return staff_sessions_end_recorded(
            locked,
            kind=LedgerKind.STAFF_USER_PASSWORD_CHANGED,
            actor=actor,
            keep_session_key=keep_session_key,
        )


def staff_sessions_end(user: AbstractBaseUser, *, keep_session_key: str | None = None) -> int:
    """End every session of ``user`` (but ``keep_session_key``); returns how many. Call it in
    the transaction of the change that ends them."""
    # By the user's column (AdminSession): no other session is read, however many.
    theirs = AdminSession.objects.filter(user_id=user.pk, expire_date__gt=timezone.now())
    if keep_session_key is not None:
        theirs = theirs.exclude(session_key=keep_session_key)
    ended, _ = theirs.delete()
    return ended


def staff_sessions_purge_expired() -> int:
    """Delete the sessions past their expiry; returns how many. Django only deletes one when
    it is next read, and most never are (a sign-out deletes its own; an abandoned browser or
    a sign-in started at the identity provider and never finished leaves one behind)."""
    purged, _ = AdminSession.objects.filter(expire_date__lte=timezone.now()).delete()
    return purged


def staff_sessions_end_recorded(
    user: AbstractBaseUser, *, kind: LedgerKind, actor: str, keep_session_key: str | None = None
) -> int:
    """``staff_sessions_end``, and the change that ends them as one ledger event ``kind`` on
    ``user`` with the count; returns it. Call it in the transaction of that change."""
    ended = staff_sessions_end(user, keep_session_key=keep_session_key)
    ledger_event_append(
        kind=kind, subject=user.get_username(), actor=actor, data={"sessions_ended": ended}
    )
    return ended


def _not_own_account(user_id: object, by: AbstractBaseUser | None, refusal: str) -> None:
    if by is not None and by.pk == user_id:
        raise ValidationError(refusal)


def _password_again_check(user: AbstractBaseUser, password: str | None) -> None:
    """The account's password asked again; ``None`` stands for it only on an account that
    has no usable password (the caller vouches for a sign-in at the identity provider)."""
    if password is None:
        if user.has_usable_password():
            raise ValidationError({"password": "that is not the account's password"})
    elif not user.check_password(password or ""):
        raise ValidationError({"password": "that is not the account's password"})


def _recovery_codes_replace(user: AbstractBaseUser) -> list[str]:
    StaffRecoveryCodes.objects.filter(user=user).delete()
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaffRecoveryCodes.objects.create(
        user=user, name=RECOVERY_DEVICE_NAME, confirmed=True, codes=" ".join(codes)
    )
    return codes
