"""Staff accounts and their roles (Django's users and groups): each change a ledger event.

The admin saves the account or group itself (Django's forms) and then records the change;
deletions go through here whole. The event names the changed fields and the state after
the change (for an account: active, staff, superuser, roles; for a role: its permissions and
how many members), never a password or its hash::

    staff_user_change_record(user=ada, verb="changed", fields=["Groups"], actor="staff:ann")
    role_group_change_record(group=operators, verb="added", fields=[], actor="staff:ann")
    staff_users_delete(users=[bob], actor="staff:ann")          # staff_user.deleted each
    role_groups_delete(groups=[auditors], actor="staff:ann")    # group.deleted each
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeVar

from django.contrib.auth.models import Group, User
from django.db import transaction

from integrations.ledger_kinds import ledger_kind_compose
from integrations.services.ledger import ledger_event_append

# The roles, as migration 0005 made them (what each may do changes only by a migration):
# the groups the identity provider's claim may grant (DROPPORTAL_OIDC_ROLE_MAP).
STAFF_ROLES = ("Connections managers", "Operators", "Auditors")

# The first part of the ledger kinds: staff_user.added, group.changed, ...
STAFF_USER = "staff_user"
ROLE_GROUP = "group"

Verb = Literal["added", "changed", "deleted"]


def staff_user_change_record(
    *, user: User, verb: Verb, actor: str, fields: list[str] | None = None
) -> None:
    """Record an account the admin added or changed (``fields``: as its form labels them).
    Call it in the transaction that saved the account."""
    _record(STAFF_USER, verb, subject=str(user), actor=actor, fields=fields, state=_user(user))


def role_group_change_record(
    *, group: Group, verb: Verb, actor: str, fields: list[str] | None = None
) -> None:
    """Record a role the admin added or changed. Call it in the transaction that saved it."""
    _record(ROLE_GROUP, verb, subject=str(group), actor=actor, fields=fields, state=_group(group))


def staff_users_delete(*, users: Iterable[User], actor: str) -> None:
    """Delete staff accounts, each with its ``staff_user.deleted`` event (one transaction).
    One deleted meanwhile (a second submit) is not recorded again."""
    with transaction.atomic():
        for user in _still_there(User, users):
            staff_user_change_record(user=user, verb="deleted", actor=actor)
            user.delete()


def role_groups_delete(*, groups: Iterable[Group], actor: str) -> None:
    """Delete roles, each with its ``group.deleted`` event (one transaction). One deleted
    meanwhile (a second submit) is not recorded again."""
    with transaction.atomic():
        for group in _still_there(Group, groups):
            role_group_change_record(group=group, verb="deleted", actor=actor)
            group.delete()


Row = TypeVar("Row", User, Group)


def _still_there(model: type[Row], rows: Iterable[Row]) -> list[Row]:
    """``rows`` as they are now, locked until the transaction ends: two deletions at once
    (a double click, two superusers) record one event, the other finds it gone."""
    return list(
        model.objects.select_for_update().filter(pk__in=[row.pk for row in rows]).order_by("pk")
    )


def _record(
    name: str,
    verb: Verb,
    *,
    subject: str,
    actor: str,
    fields: list[str] | None,
    state: dict[str, Any],
) -> None:
    data: dict[str, Any] = {"fields": fields} if fields is not None else {}
    ledger_event_append(
        kind=ledger_kind_compose(name, verb),
        subject=subject,
        actor=actor,
        data={**data, **state},
    )


def _user(user: User) -> dict[str, Any]:
    return {
        "is_active": user.is_active,
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "groups": sorted(user.groups.values_list("name", flat=True)) if user.pk else [],
    }


def _group(group: Group) -> dict[str, Any]:
    if not group.pk:
        return {}
    return {
        "permissions": sorted(group.permissions.values_list("codename", flat=True)),
        "members": group.user_set.count(),
    }
