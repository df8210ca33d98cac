"""A list's column headers are worked out once per list (dropportal/unfold_list.py), and
every row's cells still carry their column's header as their label; a list nothing narrows
counts its rows once."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dropportal import unfold_list
from tests.builders import BrokerFactory

pytestmark = pytest.mark.django_db


def test_a_lists_headers_are_built_once_and_label_every_rows_cells(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    BrokerFactory.create_batch(3)
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-1"))
    lists: list[Any] = []
    build = unfold_list._unfold_result_headers

    def counted(cl: Any) -> Any:
        lists.append(cl)
        return build(cl)

    monkeypatch.setattr(unfold_list, "_unfold_result_headers", counted)

    page = client.get("/admin/integrations/broker/").content.decode()

    assert len(lists) == 1, "the headers were built more than once for one list"
    headers = [str(h["text"]) for h in build(lists[0])]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page.split("<tbody", 1)[1], flags=re.DOTALL)
    assert len(rows) == 3
    for row in rows:
        labels = re.findall(r'<t[dh] class="field-[^"]*" data-label="([^"]*)"', row)
        assert labels == headers, "a cell is not labelled with its column's header"


def _counts(client: Client, url: str) -> tuple[list[str], str]:
    with CaptureQueriesContext(connection) as queries:
        page = client.get(url).content.decode()
    return [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"]], page


def test_a_list_counts_its_every_row_apart_only_when_it_is_narrowed(client: Client) -> None:
    # Django's list counts the rows it lists and then every row of the admin's queryset,
    # for "2 results (3 total)": the same count twice on a list nothing narrows.
    BrokerFactory.create_batch(2, mode="production")
    searched = BrokerFactory.create(mode="test")
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-1"))

    counts, page = _counts(client, "/admin/integrations/broker/")
    assert len(counts) == 1, counts
    assert not re.search(r"results? \(<a", " ".join(page.split()))

    for narrowed in ("?mode__exact=production", f"?q={searched.broker_id}"):
        counts, page = _counts(client, f"/admin/integrations/broker/{narrowed}")
        assert len(counts) == 2, (narrowed, counts)
        shown = " ".join(page.split())
        assert re.search(r"\d results? \(<a href=\"\?\">3 total</a>\)", shown), narrowed


def test_a_list_is_the_same_page_as_with_both_counts(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    BrokerFactory.create_batch(3)
    client.force_login(User.objects.create_superuser("alice", "a@example.com", "pw-alice-1"))
    for url in ("/admin/integrations/broker/", "/admin/integrations/broker/?mode__exact=test"):
        ours = client.get(url).content.decode()
        monkeypatch.setattr(ChangeList, "get_results", unfold_list._django_get_results)
        djangos = client.get(url).content.decode()
        monkeypatch.undo()
        assert _same_page(ours) == _same_page(djangos), url


def _same_page(page: str) -> str:
    # Each answer has its own CSRF token, and unfold joins a tag's classes from a set.
    page = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", page)
    return re.sub(
        r'class="([^"]*)"', lambda m: 'class="' + " ".join(sorted(m.group(1).split())) + '"', page
    )
