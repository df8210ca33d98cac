"""The work items search takes what staff know: a work item id, a request UUID, a
remote_identifier, a DROP hash, or a clear email or phone number written any way (hashed in
memory, never kept, logged or put in a URL)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.db.models.options import Options
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from integrations.drop.standardize import email_hash, phone_hash
from integrations.models import Broker, DeletionRequest, DropCycle, Integration
from integrations.services.cycle.drop_import import drop_zip_import
from tests.admin.markup import link_texts
from tests.builders import (
    ConsumerFactory,
    WebhookIntegrationFactory,
    drop_zip,
    write_zip,
)

pytestmark = pytest.mark.django_db

LIST = "/admin/integrations/workitem/"
EMAIL = "consumer.0113@example.com"
PHONE = "4155550113"
# DROP's lists: the consumer's email and phone entries, and two strangers.
ENTRIES = {
    "Email": [("WIEMAIL00113", email_hash(EMAIL)), ("WIEMAIL00999", email_hash("x@y.z"))],
    "Phone": [("WIPHONE00113", phone_hash(PHONE)), ("WIPHONE00999", phone_hash("2125550199"))],
}


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("alice", "alice@example.com", "pw-alice-1"))
    return client


@pytest.fixture
def cycle(broker: Broker, tmp_path: Path) -> DropCycle:
    WebhookIntegrationFactory.create(broker=broker)
    ConsumerFactory.create(
        broker=broker,
        remote_identifier="CRM-0113",
        hashes={"email": email_hash(EMAIL), "phone": phone_hash(PHONE)},
    )
    path = write_zip(tmp_path, drop_zip(broker, ENTRIES))
    return drop_zip_import(
        broker=broker, path=path, downloaded_at=timezone.now(), actor="test"
    ).cycle


def found(staff: Client, term: str) -> list[str]:
    """What the search box finds for ``term``: it posts, then follows the redirect."""
    posted = staff.post(LIST, {"q": term, "_search": "1"})
    assert posted.status_code == 302
    page = staff.get(posted["Location"]).content.decode()
    return sorted(link_texts(page, r'[^"]*workitem/\d+/change/[^"]*'))


THE_CONSUMERS = ["WIEMAIL00113", "WIPHONE00113"]


@pytest.mark.parametrize(
    "term",
    [
        "  CONSUMER.0113@example.COM ",
        "Consumer.0113 @Example.com",
        "+1 (415) 555-0113",
        "415.555.0113",
        "415-555-0113 ext 12",
        "415/555/0113",
        "415\u2011555\u20110113",
        "tel:+1-415-555-0113",
        "tel:+1-415-555-0113;ext=7",
        "CRM-0113",
    ],
)
def test_an_email_phone_or_remote_identifier_finds_the_consumers_work_items(
    staff: Client, cycle: DropCycle, term: str
) -> None:
    assert found(staff, term) == THE_CONSUMERS


def test_an_id_a_request_uuid_or_a_drop_hash_finds_its_work_item(
    staff: Client, cycle: DropCycle
) -> None:
    assert found(staff, " WIEMAIL00999 ") == ["WIEMAIL00999"]
    assert found(staff, email_hash("x@y.z")) == ["WIEMAIL00999"]
    request = DeletionRequest.objects.get(work_item__work_item_id="WIPHONE00113")
    assert found(staff, str(request.request_uuid)) == ["WIPHONE00113"]
    assert found(staff, "nobody@example.com") == []
    assert found(staff, "CRM-011") == []  # exact: no prefix


def test_the_clear_email_goes_no_further_than_the_search(
    staff: Client, cycle: DropCycle, caplog: pytest.LogCaptureFixture
) -> None:
    typed = "  CONSUMER.0113@example.COM "
    with caplog.at_level(logging.DEBUG), connection.execute_wrapper(_no_clear_value_in_sql):
        posted = staff.post(LIST, {"q": typed, "_search": "1"})
        assert posted.status_code == 302
        location = posted["Location"]
        assert "0113" not in location.lower()  # the hash, not the address
        page = staff.get(location).content.decode()
    assert sorted(link_texts(page, r'[^"]*workitem/\d+/change/[^"]*')) == THE_CONSUMERS
    assert EMAIL not in page.lower()
    assert email_hash(EMAIL) in page  # the search box shows what was searched: the hash
    assert EMAIL not in caplog.text.lower()


def _no_clear_value_in_sql(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
    # Nothing the search sends the database holds the address: only its hash.
    assert EMAIL not in f"{sql} {params}".lower()
    return execute(sql, params, many, context)


@pytest.mark.parametrize(
    "typed",
    [
        "  CONSUMER.0113@example.COM ",
        "415-555-0113 ext 12",
        "415/555/0113",
        "415\u2011555\u20110113",
        "tel:+1-415-555-0113",
        "Jane Doe",  # neither an id nor a hash: not sent at all
    ],
)
def test_only_ids_uuids_and_hashes_reach_the_address(
    staff: Client, cycle: DropCycle, typed: str
) -> None:
    location = staff.post(LIST, {"q": typed, "_search": "1"})["Location"]
    digits = "".join(ch for ch in typed if ch.isdigit())
    assert "0113" not in location and "doe" not in location.lower(), location
    assert not digits or digits not in location


@pytest.mark.parametrize("typed", [EMAIL, "415-555-0113", "415/555/0113 x12", "Jane Doe"])
def test_a_clear_identifier_in_the_address_is_refused_not_searched(
    staff: Client, cycle: DropCycle, typed: str
) -> None:
    answer = staff.get(LIST, {"q": typed})
    assert answer.status_code == 302
    assert "q=" not in answer["Location"]
    page = staff.get(answer["Location"]).content.decode()
    assert "Not searched" in page
    assert link_texts(page, r'[^"]*workitem/\d+/change/[^"]*')  # the whole list, unsearched


@pytest.mark.parametrize("typed", [EMAIL, "415-555-0113"])
def test_the_autocomplete_endpoint_refuses_a_clear_identifier_too(
    staff: Client, cycle: DropCycle, typed: str
) -> None:
    """Django's autocomplete reads its search as ``term`` and searches the work items by the
    same rule (a clear email hashed and found): no page asks it, but a typed or followed
    address would, with the identifier in the access log."""
    asked = {"app_label": "integrations", "model_name": "deletionrequest"}
    asked["field_name"] = "work_item"
    answer = staff.get("/admin/autocomplete/", {**asked, "term": typed})
    assert answer.status_code == 400
    assert "0113" not in answer.content.decode()
    by_id = staff.get("/admin/autocomplete/", {**asked, "term": "WIEMAIL00113"})
    assert by_id.status_code == 200  # an id still searches


def test_every_list_keeps_a_clear_email_out_of_its_address(staff: Client, cycle: DropCycle) -> None:
    consumers = "/admin/integrations/consumer/?remote_identifier_kind=external_id"
    posted = staff.post(consumers, {"q": EMAIL, "_search": "1"})
    assert posted.status_code == 302
    assert posted["Location"].startswith("/admin/integrations/consumer/?")
    assert "remote_identifier_kind=external_id" in posted["Location"]  # the filters stay
    assert "0113" not in posted["Location"]
    refused = staff.get("/admin/integrations/deletionrequest/", {"q": EMAIL})
    assert refused.status_code == 302 and "0113" not in refused["Location"]
    # Other terms are searched as before.
    assert staff.get("/admin/integrations/consumer/", {"q": "CRM-0113"}).status_code == 200


def _search_form(page: str) -> str:
    """The list's search form, whole: from ``<form`` to ``</form>`` around ``#searchbar``."""
    found = re.search(r'<form[^>]*role="search".*?</form>', page, flags=re.DOTALL)
    return found.group(0) if found else ""


def _searched_lists() -> Iterator[tuple[Options[Any], str]]:
    """Each registered list with a search box: its model's options and its address."""
    for model, model_admin in admin.site._registry.items():
        if model_admin.search_fields:
            meta = model._meta
            yield meta, reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")


def test_every_list_with_a_search_box_posts_what_is_typed(staff: Client, cycle: DropCycle) -> None:
    # Every list renders the one search form (a browser test types into a few of them):
    # it posts, and the answer's address keeps the email out.
    searched = []
    for _meta, changelist in _searched_lists():
        form = _search_form(staff.get(changelist).content.decode())
        assert 'method="post"' in form, f"{changelist}: no search form that posts"
        assert 'name="_search"' in form and 'id="searchbar"' in form, changelist
        assert "action=" not in form, f"{changelist}: the search posts elsewhere"
        posted = staff.post(changelist, {"q": EMAIL, "_search": "1"})
        assert posted.status_code == 302, changelist
        assert "0113" not in posted["Location"], changelist
        searched.append(changelist)
    assert len(searched) >= 10, searched


# The lists searched by names of ours, none a consumer's: their words travel. Every list of
# integrations is one, whatever its kind (a kind added later too).
NAMED_LISTS = {
    "integrations.Broker",
    "integrations.ReportFile",
    "integrations.DropCycle",
    "integrations.SaasConnection",
    "integrations.ApiKey",
    "integrations.ServiceProvider",
    "integrations.Directive",
    "auth.User",
    "auth.Group",
    "axes.AccessAttempt",
    "axes.AccessLog",
    "axes.AccessFailureLog",
} | {model._meta.label for model in admin.site._registry if issubclass(model, Integration)}


@pytest.mark.parametrize(
    "typed", ["Ann Smith", "Smith,Ann,1985-07-04,91790", "1HGCM82633A004352", "91790"]
)
def test_every_other_list_keeps_a_name_a_date_a_zip_or_a_vin_out_of_its_address(
    staff: Client, cycle: DropCycle, typed: str
) -> None:
    """Safe by default: a list that is not one of ``NAMED_LISTS`` sends only its ids."""
    refused = []
    for meta, changelist in _searched_lists():
        posted = staff.post(changelist, {"q": typed, "_search": "1"})
        assert posted.status_code == 302, changelist
        if meta.label in NAMED_LISTS:
            continue
        clear = [part for part in re.split(r"[ ,]", typed) if part in posted["Location"]]
        assert not clear, f"{changelist}: {posted['Location']}"
        refused.append(meta.label)
    assert {"integrations.Consumer", "integrations.WorkItem", "integrations.LedgerEvent"} <= set(
        refused
    )
    assert "integrations.DeletionRequest" in refused
