"""Who may sign in to the admin, and how each last did: the ``staff list`` command's rows.

    for row in staff_sign_ins(): row.username, row.last_method, row.last_signed_in_at, row.roles

The way of the last sign-in (password or the identity provider) is read from the ledger's
``staff_user.signed_in`` events, the one record of every sign-in.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import OuterRef, Subquery

from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerEvent, StaffOidcIdentity


@dataclass(frozen=True)
class StaffSignIn:
    username: str
    is_active: bool
    is_superuser: bool
    roles: list[str]
    signs_in_with: str  # "password" or "oidc": what the account has
    last_method: str | None  # how it last signed in, None: never since the ledger knows
    last_signed_in_at: dt.datetime | None
    oidc_subject: str | None


def staff_sign_ins() -> list[StaffSignIn]:
    last_event = LedgerEvent.objects.filter(
        kind=LedgerKind.STAFF_USER_SIGNED_IN, subject=OuterRef("username")
    ).order_by("-id")
    users = (
        User.objects.filter(is_staff=True)
        .annotate(
            last_method=Subquery(last_event.values("data__method")[:1]),
            oidc_subject=Subquery(
                StaffOidcIdentity.objects.filter(user=OuterRef("pk")).values("subject")[:1]
            ),
        )
        .prefetch_related("groups")
        .order_by("username")
    )
    return [
        StaffSignIn(
            username=user.username,
            is_active=user.is_active,
            is_superuser=user.is_superuser,
            roles=sorted(group.name for group in user.groups.all()),
            signs_in_with="oidc" if user.oidc_subject else "password",
            last_method=user.last_method,
            last_signed_in_at=user.last_login,
            oidc_subject=user.oidc_subject,
        )
        for user in users
    ]
