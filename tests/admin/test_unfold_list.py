"""A list's column headers are worked out once per list (dropportal/unfold_list.py), and
every row's cells still carry their column's header as their label."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

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
