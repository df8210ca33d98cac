"""Staff sign-ins: through the company's identity provider (OpenID Connect) or by password,
each a ledger event, as is each refusal, each change of roles and each deactivation.

The admin verifies the provider's ID token (Authlib: signature, issuer, audience, expiry,
nonce) and hands its claims here::

    outcome = staff_oidc_sign_in(issuer=issuer, claims=id_token_claims)
    outcome.user          # None: refused, outcome.refusal says why (for the person's page)
    outcome.mfa_by_idp    # the provider did multi-factor authentication (its ``amr``)
    staff_sign_in_refuse(method="oidc", reason="...", username="")  # failed verification
    staff_signed_in_record(user=user, **outcome.sign_in)  # once complete (below)
    staff_signed_in_record(user=user, method="password", second_factor="app")
    staff_user_deactivate(user=user, actor="cli:ann")   # at once: every session ends

A sign-in is recorded once complete: after our second factor when one is asked (the admin
keeps it waiting in the session until then, ``integrations/admin/sign_in.py``), so a password,
or a provider's sign-in without its MFA, that never passes it is no sign-in in the ledger.

A person is their provider's ``sub`` for its issuer, never their email alone. Their roles are
set from the claim at every sign-in, so a group removed at the provider is a role lost at the
next sign-in; no one becomes a superuser this way, and a superuser's account is refused here
(superusers sign in with their password and our second factor). No token is ever recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, Group, User
from django.db import IntegrityError, transaction
from django.utils import timezone

from integrations.ledger_kinds import LedgerKind
from integrations.models import StaffOidcIdentity
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.staff import staff_user_change_record
from integrations.services.staff.staff_mfa import staff_sessions_end_recorded
from integrations.storable_text import storable, unstorable_reason

OIDC = "oidc"
PASSWORD = "password"  # noqa: S105  (the name of a way to sign in)

# RFC 8176's authentication method references, by the factor each one is. "mfa" says the
# provider used several factors; otherwise two different factors must be listed (a password
# and a one-time code, a hardware key and a fingerprint...). One factor alone is not enough.
_KNOWLEDGE = {"pwd", "pin", "kba"}
_POSSESSION = {"otp", "hwk", "swk", "sc", "sms", "tel", "pop", "mca"}
_INHERENCE = {"fpt", "face", "iris", "retina", "vbm"}

REFUSED_NO_ROLE = (
    "Your account at the identity provider is in no group that gives a role here. Ask your "
    "administrator to add you to one of the groups dropportal's staff roles are mapped to."
)
REFUSED_INACTIVE = "This account is deactivated here. Ask a dropportal superuser."
REFUSED_NOT_STAFF = "This account has no staff status here. Ask a dropportal superuser."
REFUSED_SUPERUSER = (
    "This is a superuser account: superusers sign in with their password and two-factor "
    "authentication, not through the identity provider."
)
REFUSED_NO_SUBJECT = "The identity provider's answer names nobody (no sub claim)."
# OpenID Connect's own limit, and the column's.
_SUBJECT_MAX: int = StaffOidcIdentity._meta.get_field("subject").max_length  # type: ignore[assignment]
REFUSED_UNSTORABLE = (
    "The identity provider's answer cannot be stored here: a NUL or a lone surrogate in the "
    f"name, email, sub or amr, or a sub longer than {_SUBJECT_MAX} characters. Ask your "
    "administrator."
)
REFUSED_USERNAME_TAKEN = (
    "No account can be opened here for you: the username the identity provider gives, and "
    "its variant here, are already other accounts'. Ask a dropportal superuser."
)
# The claims kept in an account or in the ledger as they are (the groups are not: a
# refusal records them made storable, and one holding a NUL maps to no role anyway).
_KEPT_CLAIMS = ("sub", "preferred_username", "email", "amr")


@dataclass(frozen=True)
class OidcSignIn:
    user: User | None
    refusal: str = ""
    # What its ``staff_user.signed_in`` records (``staff_signed_in_record(**sign_in)``).
    sign_in: dict[str, Any] = field(default_factory=dict)

    @property
    def mfa_by_idp(self) -> bool:
        return bool(self.sign_in.get("mfa_by_identity_provider"))


def idp_did_mfa(amr: Iterable[str]) -> bool:
    """Whether an ID token's ``amr`` says the provider did multi-factor authentication."""
    methods = {str(m) for m in amr}
    if "mfa" in methods:
        return True
    factors = sum(bool(methods & kind) for kind in (_KNOWLEDGE, _POSSESSION, _INHERENCE))
    return factors >= 2


def mapped_roles(claims: Mapping[str, Any]) -> list[str]:
    """Our roles for the provider's groups in ``DROPPORTAL_OIDC_ROLES_CLAIM``."""
    claimed = claims.get(settings.DROPPORTAL_OIDC_ROLES_CLAIM) or []
    if isinstance(claimed, str):
        claimed = claimed.split()
    role_map: Mapping[str, str] = settings.DROPPORTAL_OIDC_ROLE_MAP
    return sorted({role_map[str(g)] for g in claimed if str(g) in role_map})


def staff_oidc_sign_in(*, issuer: str, claims: Mapping[str, Any]) -> OidcSignIn:
    """Sign in (or refuse) the person the verified ID token ``claims`` name, creating their
    account at their first sign-in, and set their roles from the claim."""
    subject = str(claims.get("sub") or "")
    amr = [str(m) for m in claims.get("amr") or []]
    mfa = idp_did_mfa(amr)
    if not subject:
        staff_sign_in_refuse(method=OIDC, reason=REFUSED_NO_SUBJECT, username="")
        return OidcSignIn(user=None, refusal=REFUSED_NO_SUBJECT)
    wanted = str(claims.get("preferred_username") or claims.get("email") or subject)[:120]
    if unstorable_reason([claims.get(c) for c in _KEPT_CLAIMS]) or len(subject) > _SUBJECT_MAX:
        # Refused before any query: PostgreSQL would fail the request on it (a 500).
        return _refused(REFUSED_UNSTORABLE, username=wanted, subject=subject, claims=claims)
    roles = mapped_roles(claims)
    with transaction.atomic():
        identity = (
            StaffOidcIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is None:
            if not roles:  # no account for someone who may not sign in anyway
                return _refused(REFUSED_NO_ROLE, username=wanted, subject=subject, claims=claims)
            username = _new_username(wanted, subject)
            if username is None:
                return _refused(
                    REFUSED_USERNAME_TAKEN, username=wanted, subject=subject, claims=claims
                )
            user = User(username=username, is_staff=True)
            user.email = str(claims.get("email") or "")[:254]
            user.set_unusable_password()
            try:
                with transaction.atomic():  # a savepoint: the refusal below is still recorded
                    user.save()
                    identity = StaffOidcIdentity.objects.create(
                        user=user, issuer=issuer, subject=subject
                    )
                    # Each account is the ledger's from its start, as one the admin adds.
                    staff_user_change_record(
                        user=user, verb="added", actor=f"oidc:{user.get_username()}"
                    )
            except IntegrityError:  # the name taken meanwhile (another first sign-in)
                return _refused(
                    REFUSED_USERNAME_TAKEN, username=user.username, subject=subject, claims=claims
                )
        user = identity.user
        if user.is_superuser:
            return _refused(
                REFUSED_SUPERUSER, username=user.username, subject=subject, claims=claims
            )
        if not user.is_active:
            return _refused(
                REFUSED_INACTIVE, username=user.username, subject=subject, claims=claims
            )
        if not user.is_staff:  # a superuser took the staff status away: that stands
            return _refused(
                REFUSED_NOT_STAFF, username=user.username, subject=subject, claims=claims
            )
        _roles_set(user, roles)
        if not roles:
            return _refused(REFUSED_NO_ROLE, username=user.username, subject=subject, claims=claims)
        user.last_login = identity.last_signed_in_at = timezone.now()
        user.save(update_fields=["last_login"])
        identity.save(update_fields=["last_signed_in_at"])
    sign_in = {
        "method": OIDC,
        "issuer": issuer,
        "oidc_subject": subject,
        "roles": roles,
        "amr": amr,
        "mfa_by_identity_provider": mfa,
    }
    return OidcSignIn(user=user, sign_in=sign_in)


def staff_sign_in_refuse(*, method: str, reason: str, username: str, **data: Any) -> None:
    """Record a refused sign-in (``reason``: one line, never a token or a secret)."""
    ledger_event_append(
        kind=LedgerKind.STAFF_USER_SIGN_IN_REFUSED,
        subject=username or "unknown",
        actor=f"{method}:{username or 'unknown'}",
        data={"method": method, "reason": reason, **data},
    )


def staff_signed_in_record(
    *, user: AbstractBaseUser, method: str, second_factor: str = "", **details: Any
) -> None:
    """Record a complete sign-in: its ``method`` (``PASSWORD``, or ``OIDC`` with the details
    of ``OidcSignIn.sign_in``) and, when our second factor completed it, which one passed
    (``staff_mfa_factor``)."""
    passed = {"second_factor": second_factor} if second_factor else {}
    ledger_event_append(
        kind=LedgerKind.STAFF_USER_SIGNED_IN,
        subject=user.get_username(),
        actor=f"{'oidc' if method == OIDC else 'staff'}:{user.get_username()}",
        data={"method": method, **details, **passed},
    )


def staff_user_deactivate(*, user: User, actor: str) -> int:
    """Deactivate ``user`` at once: no new sign-in, by password or the identity provider, and
    every session of theirs ends now (the admin calls it too, after its form saved the
    account inactive). Returns the sessions ended."""
    with transaction.atomic():
        User.objects.filter(pk=user.pk).update(is_active=False)
        user.is_active = False
        return staff_sessions_end_recorded(
            user, kind=LedgerKind.STAFF_USER_DEACTIVATED, actor=actor
        )


def _refused(reason: str, *, username: str, subject: str, claims: Mapping[str, Any]) -> OidcSignIn:
    # The groups the provider sent are recorded: they say why no role was found. Each text
    # as PostgreSQL can store it: REFUSED_UNSTORABLE is recorded too.
    claimed = claims.get(settings.DROPPORTAL_OIDC_ROLES_CLAIM) or []
    staff_sign_in_refuse(
        method=OIDC,
        reason=reason,
        username=storable(username),
        oidc_subject=storable(subject),
        claimed_groups=sorted(
            storable(str(g)) for g in (claimed.split() if isinstance(claimed, str) else claimed)
        ),
    )
    return OidcSignIn(user=None, refusal=reason)


def _roles_set(user: User, roles: list[str]) -> None:
    before = sorted(user.groups.values_list("name", flat=True))
    if before == roles:
        return
    user.groups.set(Group.objects.filter(name__in=roles))
    ledger_event_append(
        kind=LedgerKind.STAFF_USER_ROLES_CHANGED,
        subject=user.get_username(),
        actor="oidc:identity-provider",
        data={"before": before, "after": roles},
    )


def _new_username(wanted: str, subject: str) -> str | None:
    """The new account's username, ``wanted`` or its variant, or None when both are taken."""
    # Someone else (a password account, or another issuer's person) has it: never theirs.
    variant = f"{wanted}+{hashlib.sha256(subject.encode()).hexdigest()[:8]}"
    taken = set(
        User.objects.filter(username__in=[wanted, variant]).values_list("username", flat=True)
    )
    return next((name for name in (wanted, variant) if name not in taken), None)
