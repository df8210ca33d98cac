"""The admin's sidebar: the lists a staff member may see, grouped the way staff work.

Unfold calls ``sidebar(request)`` (``UNFOLD["SIDEBAR"]["navigation"]`` in the settings) on
every page. Each registered model lands in the group of ``GROUPS`` that names it, a model
no group names in "Other" (so a new admin is never hidden), and a list only shows for whom
its admin grants the view permission and the module (an admin that keeps out of the app
index, as each kind of integration's does, is reached from another list, not from here).
The login-lockout and job tables are in a group of their own, for superusers only
(``integrations.admin.superuser_only``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest
from django.urls import (
    NoReverseMatch,
    URLResolver,
    get_resolver,
    get_script_prefix,
    get_urlconf,
    reverse,
)
from django.utils.translation import get_language

# (group title, [(app_label.model_name, icon)]): icons are Material Symbols names.
GROUPS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "DROP",
        [
            ("integrations.dropcycle", "calendar_month"),
            ("integrations.workitem", "person_search"),
            ("integrations.reportfile", "upload_file"),
            # DROP access: a long outage's notice to CalPrivacy, and the outages themselves
            ("integrations.dropaccessobligation", "gavel"),
            ("integrations.dropoutage", "cloud_alert"),
        ],
    ),
    (
        "Requests",
        [
            ("integrations.deletionrequest", "delete_sweep"),
            ("integrations.resolutionrequest", "manage_search"),
            ("integrations.saasdeletion", "cloud_off"),
            ("integrations.optoutrecord", "unsubscribe"),
        ],
    ),
    (
        "Brokers and connections",
        [
            ("integrations.broker", "domain"),
            ("integrations.consumer", "group"),
            ("integrations.integration", "webhook"),
            ("integrations.saasconnection", "cloud_sync"),
            ("integrations.apikey", "key"),
        ],
    ),
    (
        "Service providers",
        [
            ("integrations.serviceprovider", "handshake"),
            ("integrations.directive", "assignment"),
        ],
    ),
    ("Audit", [("integrations.ledgerevent", "receipt_long")]),
    ("Staff", [("auth.user", "badge"), ("auth.group", "shield_person")]),
]
SUPERUSER_GROUP = "Superusers only"
SUPERUSER_APPS = {"axes", "procrastinate"}


def _item(title: str, link: str, icon: str) -> dict[str, Any]:
    # Escaped here (unfold's template marks it safe) as Django's escape() does, but into a
    # plain str: unfold deep-copies the navigation on every page, and Django's SafeString, a
    # str subclass, is copied the slow way.
    # Every key unfold's templates read of an item, set: a key missing from a dict costs the
    # template a failed lookup (an exception and a dir()), dozens of them on every page.
    return {
        "title": html.escape(title),
        "link": link,
        "icon": icon,
        "link_callback": None,
        "badge": None,
    }


@dataclass(frozen=True)
class _Entry:
    model: type[Model]
    title: str
    link: str
    group: str
    icon: str


@lru_cache(maxsize=16)
def _entries(
    registered: tuple[type[Model], ...], resolver: URLResolver, prefix: str, language: str | None
) -> tuple[_Entry, ...]:
    """The sidebar's lists in their order, with their titles, links and groups: the same on
    every page until the site's registry, its URLs, its script prefix or the language change
    (each is part of the key), so worked out once, not on every page."""
    icons = {label: icon for _, models in GROUPS for label, icon in models}
    group_of = {label: title for title, models in GROUPS for label, _ in models}
    order = {label: n for n, label in enumerate(icons)}
    entries = []
    for model in sorted(
        registered, key=lambda m: (order.get(m._meta.label_lower, 999), m._meta.label_lower)
    ):
        meta = model._meta
        try:
            link = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        except NoReverseMatch:
            continue
        label = meta.label_lower
        title = str(meta.verbose_name_plural)
        title = title[:1].upper() + title[1:]
        if label in group_of:
            entries.append(_Entry(model, title, link, group_of[label], icons[label]))
        elif meta.app_label in SUPERUSER_APPS:
            entries.append(_Entry(model, title, link, SUPERUSER_GROUP, "admin_panel_settings"))
        else:
            entries.append(_Entry(model, title, link, "Other", "table"))
    return tuple(entries)


def sidebar(request: HttpRequest) -> list[dict[str, Any]]:
    grouped: dict[str, list[dict[str, Any]]] = {title: [] for title, _ in GROUPS}
    grouped["Other"] = []
    grouped[SUPERUSER_GROUP] = []
    site = admin.site
    entries = _entries(
        tuple(site._registry), get_resolver(get_urlconf()), get_script_prefix(), get_language()
    )
    for entry in entries:
        model_admin = site._registry[entry.model]
        if not (
            model_admin.has_module_permission(request)
            and model_admin.has_view_or_change_permission(request)
        ):
            continue
        grouped[entry.group].append(_item(entry.title, entry.link, entry.icon))
    # Imported when called: the admin's modules register their ModelAdmins on import.
    from integrations.admin.audit import EVIDENCE_PERMISSIONS, METRICS_PERMISSIONS

    overview = [_item("Dashboard", reverse("admin:index"), "dashboard")]
    user: Any = request.user
    # The permissions each page itself asks for: no link to a page that would answer 403.
    if user.has_perms(METRICS_PERMISSIONS):
        overview.append(_item("DROP metrics", reverse("admin:drop_metrics"), "bar_chart"))
    if user.has_perms(EVIDENCE_PERMISSIONS):
        overview.append(_item("Evidence packs", reverse("admin:evidence"), "verified"))
    overview.append(_item("Broker integration guide", reverse("admin:broker_guide"), "menu_book"))
    groups = [_group("Overview", overview)]
    groups += [_group(title, items) for title, items in grouped.items() if items]
    return groups


def _group(title: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    # The keys unfold's templates read of a group, set (see _item).
    return {"title": title, "items": items, "collapsible": False, "separator": False, "badge": None}
