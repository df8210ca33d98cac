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

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import escape

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
    return {"title": escape(title), "link": link, "icon": icon}


def sidebar(request: HttpRequest) -> list[dict[str, Any]]:
    placed = {label for _, models in GROUPS for label, _ in models}
    icons = {label: icon for _, models in GROUPS for label, icon in models}
    grouped: dict[str, list[dict[str, Any]]] = {title: [] for title, _ in GROUPS}
    grouped["Other"] = []
    grouped[SUPERUSER_GROUP] = []
    order = {label: n for n, label in enumerate(icons)}
    site = admin.site
    registered = sorted(
        site._registry.items(),
        key=lambda pair: (order.get(pair[0]._meta.label_lower, 999), pair[0]._meta.label_lower),
    )
    for model, model_admin in registered:
        meta = model._meta
        if not (
            model_admin.has_module_permission(request)
            and model_admin.has_view_or_change_permission(request)
        ):
            continue
        try:
            link = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        except NoReverseMatch:
            continue
        label = meta.label_lower
        title = str(meta.verbose_name_plural)
        title = title[:1].upper() + title[1:]
        if label in placed:
            group = next(name for name, models in GROUPS if label in dict(models))
            grouped[group].append(_item(title, link, icons[label]))
        elif meta.app_label in SUPERUSER_APPS:
            grouped[SUPERUSER_GROUP].append(_item(title, link, "admin_panel_settings"))
        else:
            grouped["Other"].append(_item(title, link, "table"))
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
    groups = [{"title": "Overview", "items": overview}]
    groups += [{"title": title, "items": items} for title, items in grouped.items() if items]
    return groups
