"""Every admin page and command, tried as each role, against the table in SECURITY.md.

The walk is driven by what the admin site holds when the tests run, not by page markup:
every registered ModelAdmin (its list, add, change and delete pages and every action it
has for anyone) and every other named URL of the site (exports, downloads, guided flows).
SECURITY.md's table "What each role may do" is parsed here, so the document and the code
cannot disagree: a new admin, action or page without its row fails, and so does a row
that no longer matches what the role can do. Each role's column is its own test; a failure
prints the column as observed.

How each thing is tried, with nothing changed for a role that may do it:

- ``view``: the list and an object's page answer 200 (403 otherwise);
- ``add``: the add page answers 200; a role that may not add gets 403 on GET and on POST;
- ``change``: the object's page says the role may change it; a role that may not gets 403
  when it POSTs the page;
- ``delete``: the object's delete page answers 200 (GET only; 403 otherwise);
- an action: the list offers it; a role it is not offered to POSTs it anyway, and Django
  refuses it (403; the list again with "No action selected."; or, when the role has no
  action at all there, the list, as Django then runs none);
- another URL (``admin:<name>``): GET and POST; "yes" when one of them is answered with
  neither 403 nor 405, "—" when every answer but a 405 is a 403.

The same walks check two more rules on the pages they open:

- no page a role opens holds a stored credential (``test_credentials_write_only``): the world
  holds one of each kind (``credentials_stored``, in ``tests/admin/conftest.py``), and
  Auditors, Operators and superusers first open every page ``credential_pages`` names,
  before anything is posted;
- an Auditor changes nothing: every list and object page of the app opens, nothing can be
  added (but audit keys), changed or deleted, and every action the admin has, posted
  confirmed on the first row, leaves the row and the ledger as they were.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db import connection, models
from django.test import Client, RequestFactory
from django.urls import URLPattern, URLResolver, reverse
from django.utils import timezone

from dropportal.navigation import sidebar
from integrations.ledger_kinds import LedgerKind
from integrations.models import ApiKey, Broker, LedgerEvent
from integrations.services.cycle.canaries import canary_round_send
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.keys import CreatedApiKey
from tests.admin.conftest import (
    CREDENTIAL_MODELS,
    credential_pages,
    credentials_stored,
)
from tests.builders import (
    CanaryFactory,
    DirectiveFactory,
    DropAccessObligationFactory,
    IsiIntegrationFactory,
    SampleCycle,
    ServiceProviderFactory,
    sample_cycle,
)

pytestmark = pytest.mark.django_db

SECURITY_MD = Path(__file__).resolve().parents[2] / "SECURITY.md"
TABLE_HEADING = "### What each role may do"
ROLES = ("Connections managers", "Operators", "Auditors", "Staff without a role", "Superusers")
NONE = "—"
MODEL_OPERATIONS = ("view", "add", "change", "delete")
# Django's own pages of the site, the same for every staff member: not walked (the own
# password change is dropportal's, and in the table).
SITE_VIEWS = {
    "login",
    "logout",
    "password_change_done",
    "jsi18n",
    "autocomplete",
    "view_on_site",
    "app_list",
}
MODEL_VIEW_SUFFIXES = ("_changelist", "_add", "_change", "_delete", "_history")
# The roles that open every page of ``credential_pages`` before their walk.
CREDENTIAL_ROLES = ("Auditors", "Operators", "Superusers")


# -- the table ------------------------------------------------------------------------------


def documented_table() -> dict[str, dict[str, str]]:
    """``{key: {role: cell}}`` from SECURITY.md's table (the key: a row's backticked name)."""
    text = SECURITY_MD.read_text(encoding="utf-8")
    assert TABLE_HEADING in text, f"SECURITY.md has no section {TABLE_HEADING!r}"
    lines = text.split(TABLE_HEADING, 1)[1].splitlines()
    rows = [line for line in lines[: _table_end(lines)] if line.startswith("|")]
    header = _cells(rows[0])
    assert tuple(header[1:]) == ROLES, f"the table's columns are {header}"
    table: dict[str, dict[str, str]] = {}
    for row in rows[2:]:
        cells = _cells(row)
        key = re.search(r"`([^`]+)`", cells[0])
        assert key, f"a row of the role table names no `key`: {row}"
        assert key.group(1) not in table, f"two rows for {key.group(1)}"
        table[key.group(1)] = dict(zip(ROLES, cells[1:], strict=True))
    return table


def _table_end(lines: list[str]) -> int:
    started = False
    for index, line in enumerate(lines):
        if line.startswith("|"):
            started = True
        elif started:
            return index
    return len(lines)


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def cell(operations: list[str]) -> str:
    return ", ".join(operations) if operations else NONE


# -- the world ------------------------------------------------------------------------------


class World(NamedTuple):
    sample: SampleCycle
    api_key: str  # as minted, in clear


@pytest.fixture
def every_model(broker: Broker, make_key: Callable[..., CreatedApiKey]) -> World:
    """At least one row of every model the admin shows."""
    sample = sample_cycle(broker, today=timezone.localdate())
    # An ISI integration for its kind's pages (a closed port: "Check connection" fails fast).
    IsiIntegrationFactory.create(broker=broker, name="Acme API", base_url="https://127.0.0.1:9")
    api_key = make_key("webhook_callback").key
    DirectiveFactory.create(provider=ServiceProviderFactory.create(broker=broker))
    ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id=broker.broker_id)
    now = timezone.now()
    DropAccessObligationFactory.create(broker=broker)
    CanaryFactory.create(broker=broker)
    canary_round_send(broker=broker, actor="test")
    AccessAttempt.objects.create(username="x", ip_address="203.0.113.9", failures_since_start=1)
    AccessLog.objects.create(username="x", ip_address="203.0.113.9", attempt_time=now)
    AccessFailureLog.objects.create(username="x", ip_address="203.0.113.9", attempt_time=now)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args) "
            "VALUES ('alerts', 'integrations.tasks.evaluate_alerts', 'todo', '{}')"
        )
    return World(sample, api_key)


def role_user(role: str) -> User:
    username = role.lower().replace(" ", "-")
    if role == "Superusers":
        return User.objects.create_superuser(username, password="pw-123-role")
    user = User.objects.create_user(username, password="pw-123-role", is_staff=True)
    if role != "Staff without a role":
        user.groups.add(Group.objects.get(name=role))
    return user


def every_action(model_admin: admin.ModelAdmin) -> list[str]:
    """Every action the admin has, for anyone (a superuser's list)."""
    request = RequestFactory().get("/admin/")
    request.user = User(is_superuser=True, is_staff=True, is_active=True)
    return list(model_admin.get_actions(request))


def any_row(model: type[models.Model]) -> models.Model:
    row = model._default_manager.order_by("pk").first()
    assert row is not None, f"no {model.__name__} to try the admin on"
    return row


# -- trying ---------------------------------------------------------------------------------


class Walker:
    def __init__(self, role: str, user: User, credentials: list[str]) -> None:
        self.role = role
        self.user = user
        # Every page a GET opens is read for each (UTF-8, as the pages are sent).
        self.credentials = [secret.encode() for secret in credentials]
        self.client = Client()
        self.signed_in = False
        # What each URL answered a GET, for the sidebar's check: its links are pages the walk
        # opens anyway, as the same role in the same world.
        self.got: dict[str, int] = {}
        # The answers of pages opened before the walk (``credential_pages``), which the walk
        # reads again rather than asking twice: nothing a role may not do changes them.
        self.opened: dict[str, Any] = {}

    def logged_in(self) -> Client:
        # Again when a page (MFA logout) ended the session: a login is several writes and
        # signals.
        if not self.signed_in:
            self.client.force_login(self.user)
            self.signed_in = True
        return self.client

    def answered(self, response: Any) -> Any:
        # The session as the page left it, in memory: reading the stored one before every
        # request was a query and a decode each time.
        self.signed_in = "_auth_user_id" in response.wsgi_request.session
        return response

    def get(self, url: str) -> Any:
        response = self.answered(self.logged_in().get(url))
        self.got[url] = response.status_code
        if response.status_code == 200 and not response.streaming:
            page = response.content
            for secret in self.credentials:
                assert secret not in page, f"{self.role} reads a stored credential on {url}"
        return response

    def get_opened(self, url: str) -> Any:
        """The answer to ``url`` opened before the walk, or a GET now."""
        opened = self.opened.pop(url, None)
        return opened if opened is not None else self.get(url)

    def open_credential_pages(self) -> None:
        """Every page ``credential_pages`` names, as the world was built (each read for every
        stored credential by ``get``)."""
        for url in credential_pages():
            self.opened[url] = self.get(url)
        shown = {url: r for url, r in self.opened.items() if r.status_code == 200}
        assert len(shown) > len(CREDENTIAL_MODELS) * 2, f"{self.role} opened only {len(shown)}"
        # The broker's page says when its credential was set, never what it is.
        broker = Broker.objects.get()
        status = shown[reverse("admin:integrations_broker_change", args=[broker.pk])]
        assert re.search(
            r"set \(last changed \d{4}-\d\d-\d\d \d\d:\d\d (?:PST|PDT)\)", status.content.decode()
        ), f"{self.role}: the broker's page does not say when its DROP API key was set"

    def got_status(self, url: str) -> int:
        """What ``url`` answered this walk's GET, fetched now if it was not opened yet."""
        return self.got[url] if url in self.got else self.get(url).status_code

    def post(self, url: str, data: dict[str, Any]) -> Any:
        return self.answered(self.logged_in().post(url, data))

    def model_operations(self, model: type[models.Model], model_admin: admin.ModelAdmin) -> str:
        info = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        row = any_row(model)
        done: list[str] = []

        auditing = self.role == "Auditors" and model._meta.app_label == "integrations"
        events_before = (
            LedgerEvent.objects.exclude(kind="outcomes.exported").count() if auditing else 0
        )

        changelist = self.get_opened(reverse(f"{info}_changelist"))
        page = self.get_opened(reverse(f"{info}_change", args=[row.pk]))
        assert changelist.status_code in (200, 403), (info, changelist.status_code)
        assert page.status_code == changelist.status_code, f"{info}: list and page disagree"
        viewer = changelist.status_code == 200
        if viewer:
            done.append("view")

        add_url = reverse(f"{info}_add")
        adding = self.get(add_url)
        assert adding.status_code in (200, 403), (info, "add", adding.status_code)
        if adding.status_code == 200:
            done.append("add")
        else:
            assert self.post(add_url, {}).status_code == 403, f"{info}: POST add not refused"

        if viewer and page.context_data["has_change_permission"]:
            done.append("change")
        else:
            refused = self.post(reverse(f"{info}_change", args=[row.pk]), {})
            assert refused.status_code == 403, f"{info}: POST change not refused"

        deleting = self.get(reverse(f"{info}_delete", args=[row.pk]))
        assert deleting.status_code in (200, 403), (info, "delete", deleting.status_code)
        if deleting.status_code == 200:
            done.append("delete")

        action_form = changelist.context_data.get("action_form") if viewer else None
        offered = (
            {name for name, _ in action_form.fields["action"].choices} if action_form else set()
        )
        for action in every_action(model_admin):
            if action in offered:
                done.append(action)
                continue
            tried = self.post(
                reverse(f"{info}_changelist"),
                {"action": action, "_selected_action": [row.pk], "index": 0, "post": "yes"},
            )
            messages = [str(m) for m in tried.wsgi_request._messages]
            refused = (
                tried.status_code == 403
                or (tried.status_code == 302 and "No action selected." in messages)
                # No action at all for this role: Django shows the list, runs nothing.
                or (tried.status_code == 200 and not offered)
            )
            assert refused, f"{info}: action {action} not offered, yet run ({tried.status_code})"
        if auditing:
            self.auditor_changes_nothing(model, model_admin, row, done, offered, events_before)
        return cell(done)

    def auditor_changes_nothing(
        self,
        model: type[models.Model],
        model_admin: admin.ModelAdmin,
        row: models.Model,
        done: list[str],
        offered: set[str],
        events_before: int,
    ) -> None:
        """An Auditor sees every list and page of the app and changes nothing, whatever the
        role table says: the walk above opened the list and the row's page, asked to add
        (GET and POST) and POSTed the page and every action not offered."""
        info = f"admin:integrations_{model._meta.model_name}"
        assert "view" in done, f"{info}: an auditor does not see the list or the page"
        # An auditor mints audit keys (tests/admin/test_roles.py).
        assert "add" not in done or model is ApiKey, f"{info}: an auditor may add"
        assert "change" not in done, f"{info}: an auditor may change"  # its POST was a 403
        # The row a list shows first, as well as the walk's (the first by id).
        first = model._default_manager.first()
        assert first is not None, f"no {model.__name__} to try to change"
        if first.pk != row.pk:
            url = reverse(f"{info}_change", args=[first.pk])
            assert self.get(url).status_code == 200, f"{info}: an auditor cannot see {url}"
            assert self.post(url, {}).status_code == 403, f"{info}: an auditor changed {url}"
        for target in {row.pk, first.pk}:
            deleted = self.post(reverse(f"{info}_delete", args=[target]), {"post": "yes"})
            assert deleted.status_code == 403, f"{info}: an auditor's delete is not refused"
            for action in every_action(model_admin):
                if target == row.pk and action not in offered:
                    continue  # posted, confirmed, by the walk above
                self.post(
                    reverse(f"{info}_changelist"),
                    {"action": action, "_selected_action": [target], "post": "yes"},
                )
            assert model._default_manager.filter(pk=target).exists(), f"{info}: row gone"
        # An auditor may export the outcome history: that access is recorded, nothing changes.
        after = LedgerEvent.objects.exclude(kind="outcomes.exported").count()
        assert after == events_before, f"{info}: an auditor's action changed something"

    def page(self, url: str) -> str:
        answers = {self.get_opened(url).status_code, self.post(url, {}).status_code} - {405}
        assert answers, f"{url}: neither GET nor POST is allowed"
        assert not any(status >= 500 for status in answers), (url, answers)
        return NONE if answers == {403} else "yes"


def _named_patterns(
    patterns: list[URLPattern | URLResolver], prefix: str = ""
) -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _named_patterns(pattern.url_patterns, prefix + str(pattern.pattern))
        elif pattern.name:
            yield prefix + str(pattern.pattern), pattern


def admin_pages() -> dict[str, tuple[str, URLPattern]]:
    """Every named URL of the admin site but the ModelAdmins' own pages and Django's."""
    registered = {
        f"{model._meta.app_label}_{model._meta.model_name}" for model in admin.site._registry
    }
    pages = {}
    for route, pattern in _named_patterns(admin.site.get_urls()):
        name = pattern.name or ""
        standard = any(
            name == f"{label}{suffix}" for label in registered for suffix in MODEL_VIEW_SUFFIXES
        )
        if standard or name in SITE_VIEWS:
            continue
        pages[f"admin:{name}"] = (route, pattern)
    return pages


def page_url(key: str, route: str, pattern: URLPattern) -> str:
    """The page's URL, its parameters taken from rows of the world."""
    kwargs: dict[str, Any] = {}
    for name in pattern.pattern.converters:
        if name in ("pk", "id", "object_id"):
            app_label, model_name = route.split("/")[:2]
            model = next(
                m
                for m in admin.site._registry
                if (m._meta.app_label, m._meta.model_name) == (app_label, model_name)
            )
            kwargs[name] = any_row(model).pk
        elif name == "fmt":
            kwargs[name] = "csv"
        elif name == "token":
            kwargs[name] = "no-such-token"
        else:
            pytest.fail(f"{key}: teach page_url a value for its parameter {name!r}")
    return reverse(key, kwargs=kwargs)


# -- the test -------------------------------------------------------------------------------


# One role's column per test: each walk is a few hundred requests, and the columns can run
# on several workers at once. The sidebar is checked on the same walk: every page it links is
# one the walk opened as that role.
@pytest.mark.parametrize("role", ROLES)
def test_what_each_role_may_do_is_what_security_md_says(
    every_model: World, broker: Broker, role: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The walk is refused hundreds of times on purpose: Django logs each 403 as a WARNING
    # with its traceback, formatted every time. Errors (a 500) are still logged.
    caplog.set_level(logging.ERROR, logger="django.request")
    documented = {key: cells[role] for key, cells in documented_table().items()}
    observed: dict[str, str] = {}
    pages = admin_pages()
    models_ = sorted(admin.site._registry.items(), key=lambda pair: pair[0]._meta.label_lower)
    user = role_user(role)
    credentials = credentials_stored(broker, every_model.sample.integration, every_model.api_key)
    walker = Walker(role, user, credentials)
    if role in CREDENTIAL_ROLES:
        walker.open_credential_pages()
    for model, model_admin in models_:
        observed[model._meta.label_lower] = walker.model_operations(model, model_admin)
    for key, (route, pattern) in sorted(pages.items()):
        observed[key] = walker.page(page_url(key, route, pattern))

    missing = sorted(set(observed) - set(documented))
    stale = sorted(set(documented) - set(observed))
    differ = sorted(
        key for key in set(observed) & set(documented) if observed[key] != documented[key]
    )
    as_observed = "\n".join(f"| `{key}` | {observed[key]} |" for key in sorted(observed))
    problems = []
    if missing or stale or differ:
        problems.append(
            f"SECURITY.md's role table disagrees with the admin for {role}: no row for "
            f"{missing}, rows for what no longer exists {stale}, rows that differ {differ}. "
            f"As observed for {role}:\n{as_observed}"
        )

    # The Evidence packs page needs the export permission, which Operators lack: the sidebar
    # offered it to everyone who may view the ledger, and the link answered 403.
    request = RequestFactory().get("/admin/")
    request.user = user
    links = [item["link"] for group in sidebar(request) for item in group["items"]]
    assert links, "the sidebar lists the dashboard and the guide at least"
    refused = [link for link in links if walker.got_status(link) != 200]
    if refused:
        problems.append(f"{role}: the sidebar links pages that refuse them: {refused}")
    assert not problems, "\n\n".join(problems)
