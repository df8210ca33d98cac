"""``manage.py staff list|deactivate|reset-mfa``: who may sign in to the admin, stopping someone
now, and a lost second factor.

    manage.py staff list [--json]        # each account: password or OIDC, last sign-in, roles
    manage.py staff deactivate ada       # no sign-in any more, every session ended at once
    manage.py staff reset-mfa ada        # a lost phone: every session ends, they enrol again

A deactivation is a ledger event (``staff_user.deactivated``), as is a reset
(``staff_user.mfa_reset``): the admin's reset is refused on one's own account, this one is
for a superuser who lost their own factor. Someone who signs in through
the identity provider stays refused here even while the provider still lets them in; remove
them there too.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import CommandError

from integrations.drop.calendar import drop_time_text
from integrations.management.base import DropportalCommand
from integrations.selectors.staff_sign_ins import StaffSignIn, staff_sign_ins
from integrations.services.staff.staff_mfa import staff_mfa_reset
from integrations.services.staff.staff_sign_in import staff_user_deactivate


class Command(DropportalCommand):
    help = (
        "List staff accounts and how they sign in; deactivate one, or reset its second factor, "
        "at once."
    )

    def add_subcommands(self, subparsers: Any) -> None:
        listing = subparsers.add_parser("list", help="staff accounts, how they sign in, roles")
        listing.add_argument("--json", action="store_true", help="print the result as JSON")
        deactivate = subparsers.add_parser(
            "deactivate", help="stop an account signing in and end its sessions now"
        )
        deactivate.add_argument("username")
        reset = subparsers.add_parser(
            "reset-mfa", help="remove an account's second factors and end its sessions"
        )
        reset.add_argument("username")

    def handle_list(self, **options: Any) -> None:
        rows = staff_sign_ins()
        if options["json"]:
            self.print_json({"items": [_as_json(row) for row in rows]})
            return
        if not rows:
            self.stdout.write("No staff account.")
        for row in rows:
            state = "active" if row.is_active else "deactivated"
            roles = ", ".join(row.roles) or ("superuser" if row.is_superuser else "no role")
            last = (
                f"last signed in {drop_time_text(row.last_signed_in_at)}"
                f"{f' by {row.last_method}' if row.last_method else ''}"
                if row.last_signed_in_at
                else "never signed in"
            )
            self.stdout.write(f"{row.username}  {row.signs_in_with}  {state}  {roles}  {last}")

    def handle_deactivate(self, **options: Any) -> None:
        user = _account_or_error(options["username"])
        if not user.is_active:
            raise CommandError(f"{user.username} is already deactivated")
        ended = staff_user_deactivate(user=user, actor=self.actor())
        self.stdout.write(
            f"{user.username} is deactivated: no sign-in from now on, {ended} session(s) ended."
        )

    def handle_reset_mfa(self, **options: Any) -> None:
        user = _account_or_error(options["username"])
        removed = staff_mfa_reset(user=user, actor=self.actor(), by=None)
        self.stdout.write(
            f"{user.username}: {removed} second factor(s) removed, every session ended; they "
            "enrol again at their next sign-in."
        )


def _account_or_error(username: str) -> User:
    user = User.objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no staff account {username!r}")
    return user


def _as_json(row: StaffSignIn) -> dict[str, Any]:
    return {
        "username": row.username,
        "is_active": row.is_active,
        "is_superuser": row.is_superuser,
        "roles": row.roles,
        "signs_in_with": row.signs_in_with,
        "last_method": row.last_method,
        "last_signed_in_at": row.last_signed_in_at.isoformat() if row.last_signed_in_at else None,
        "oidc_subject": row.oidc_subject,
    }
