"""Bad input in the admin gets a clear answer (a 400, a form error, a message or the list
without the bad filter), never a 500: each case a page or a link can send."""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib import admin
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.contrib.postgres.fields import ArrayField
from django.contrib.sessions.models import Session
from django.db import connection
from django.http.response import HttpResponseBase
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, LedgerEvent, WorkItem
from integrations.services.ledger import ledger_event_append
from integrations.services.staff.keys import CreatedApiKey
from tests.admin.test_role_table import every_action, every_model, role_user  # noqa: F401  (a fixture)
from tests.builders import (
    DeletionRequestFactory,
    OptOutRecordFactory,
    ResolutionRequestFactory,
    sample_cycle,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(role_user("Superusers"))
    return client


# -- the opt-out records' request column -------------------------------------------------------


@pytest.mark.parametrize("order", ["0", "-0"])
def test_opt_out_records_sort_by_their_request_column(
    broker: Broker, superuser_client: Client, order: str
) -> None:
    # One record of a deletion, one of a resolution: the column is whichever request it has.
    records = [
        OptOutRecordFactory.create(deletion_request=DeletionRequestFactory.create()),
        OptOutRecordFactory.create(resolution_request=ResolutionRequestFactory.create()),
        OptOutRecordFactory.create(deletion_request=DeletionRequestFactory.create()),
    ]
    expected = sorted(records, key=lambda record: record.request_uuid, reverse=order == "-0")

    # The column header's own link.
    page = superuser_client.get(f"/admin/integrations/optoutrecord/?o={order}")

    assert page.status_code == 200
    listed = re.findall(
        r'href="/admin/integrations/optoutrecord/(\d+)/change/[^"]*" title="([^"]+)"',
        page.content.decode(),
    )
    assert listed == [(str(record.pk), str(record.request_uuid)) for record in expected]


# -- the date drill-down in the last year a date can have -------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/admin/integrations/ledgerevent/?created_at__year=9999",
        "/admin/integrations/ledgerevent/?created_at__year=9999&created_at__month=12",
        "/admin/integrations/ledgerevent/?created_at__year=9999&created_at__month=12&created_at__day=31",
        "/admin/integrations/ledgerevent/?created_at__year=99999999999999999999",
        "/admin/integrations/reappearance/?reappeared_at__year=9999",
        "/admin/axes/accessattempt/?attempt_time__year=9999",
        "/admin/axes/accesslog/?attempt_time__year=9999",
        "/admin/axes/accessfailurelog/?attempt_time__year=9999",
    ],
)
def test_a_drill_down_past_the_last_year_is_refused_as_an_invalid_filter(
    broker: Broker, superuser_client: Client, url: str
) -> None:
    answer = superuser_client.get(url)

    # Django's answer to any filter a list cannot apply: the list, without it, flagged.
    assert answer.status_code == 302
    assert answer["Location"] == url.split("?")[0] + "?e=1"


def test_the_last_day_a_drill_down_can_reach_is_listed(
    broker: Broker, superuser_client: Client
) -> None:
    answer = superuser_client.get(
        "/admin/integrations/ledgerevent/?created_at__year=9998&created_at__month=12"
        "&created_at__day=31"
    )

    assert answer.status_code == 200


def test_a_ledger_export_past_the_last_year_is_a_400(
    broker: Broker, superuser_client: Client
) -> None:
    answer = superuser_client.post(
        "/admin/integrations/ledgerevent/export.csv?created_at__year=9999"
    )

    assert answer.status_code == 400
    assert answer.content == b"these filters do not apply to the ledger"
    assert not LedgerEvent.objects.filter(kind=LedgerKind.LEDGER_EXPORTED).exists()


# -- a character PostgreSQL cannot store ------------------------------------------------------

NUL_REFUSED = b"Not read: a string holds a NUL character (\\u0000), which no page takes."


NUL_URLS = [
    "/admin/integrations/workitem/?state__exact=%00",
    "/admin/integrations/deletionrequest/?state__exact=%00",
    "/admin/integrations/ledgerevent/?kind__exact=%00",
    "/admin/integrations/reportfile/?state__exact=%00",
    "/admin/integrations/dropcycle/?state__exact=1%00",
    "/admin/integrations/integration/?kind__exact=1%00",
    "/admin/integrations/broker/?q=a%00b",
    "/admin/integrations/broker/?%00=1",  # a name, not only a value
    "/admin/auth/user/?is_staff__exact=%00",
    "/admin/autocomplete/?app_label=integrations&model_name=consumer&field_name=broker&term=%00",
]


# One world for every page (a cycle's rows): each page is refused before it reads any.
def test_a_nul_sent_to_any_admin_page_is_a_400(
    broker: Broker, superuser_client: Client, subtests: pytest.Subtests
) -> None:
    sample_cycle(broker, today=timezone.localdate())

    for url in NUL_URLS:
        with subtests.test(url=url):
            answer = superuser_client.get(url)

            assert answer.status_code == 400, url
            assert answer["Content-Type"] == "text/plain", url
            assert answer.content == NUL_REFUSED, url


def test_a_nul_in_an_admin_address_is_a_400(broker: Broker, superuser_client: Client) -> None:
    # The "view on site" shortcut looks the object up by what the path holds: sessions are
    # keyed by text, where a NUL failed in the database.
    sessions = ContentType.objects.get_for_model(Session)

    for url in (f"/admin/r/{sessions.pk}/%00/", f"/admin/integrations/broker/{broker.pk}%00/"):
        answer = superuser_client.get(url)

        assert answer.status_code == 400, url
        assert answer.content == NUL_REFUSED, url


def test_a_ledger_export_with_a_nul_filter_is_a_400_and_no_export(
    broker: Broker, superuser_client: Client
) -> None:
    ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id=broker.broker_id)

    answer = superuser_client.post("/admin/integrations/ledgerevent/export.csv?kind__exact=%00")

    assert answer.status_code == 400
    assert answer.content == NUL_REFUSED
    assert not LedgerEvent.objects.filter(kind=LedgerKind.LEDGER_EXPORTED).exists()


def test_a_nul_posted_in_a_form_is_a_400_and_nothing_saved(
    broker: Broker, superuser_client: Client
) -> None:
    answer = superuser_client.post(
        f"/admin/integrations/broker/{broker.pk}/change/", {"name": "Acme\x00Data"}
    )

    assert answer.status_code == 400
    assert answer.content == NUL_REFUSED
    broker.refresh_from_db()
    assert broker.name == "Acme Data"


def test_a_nul_sent_before_signing_in_gets_the_login_page(broker: Broker) -> None:
    # As any other admin address does: nothing is said of what was sent.
    answer = Client().get("/admin/integrations/workitem/?state__exact=%00")

    assert answer.status_code == 302
    assert answer["Location"].startswith("/admin/login/")


# -- the job table's status (a PostgreSQL enum) -----------------------------------------------


def _job(status: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args) "
            "VALUES ('alerts', 'integrations.tasks.evaluate_alerts', %s, '{}') RETURNING id",
            [status],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("status", ["zzz", "Todo", "todo%20"])
def test_an_unknown_job_status_is_refused_as_an_invalid_filter(
    broker: Broker, superuser_client: Client, status: str
) -> None:
    _job("todo")

    answer = superuser_client.get(f"/admin/procrastinate/procrastinatejob/?status__exact={status}")

    assert answer.status_code == 302
    assert answer["Location"] == "/admin/procrastinate/procrastinatejob/?e=1"


def test_a_known_job_status_filters_the_jobs(broker: Broker, superuser_client: Client) -> None:
    waiting = _job("todo")
    _job("succeeded")

    answer = superuser_client.get("/admin/procrastinate/procrastinatejob/?status__exact=todo")

    assert answer.status_code == 200
    assert answer.context_data is not None
    assert [job.pk for job in answer.context_data["cl"].result_list] == [waiting]


# -- an array column filtered by text --------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/admin/integrations/apikey/?scopes=x",
        "/admin/integrations/apikey/?scopes__contains=x",
        "/admin/integrations/apikey/?scopes__contained_by=x",
        "/admin/integrations/apikey/?scopes__overlap=x",
        "/admin/integrations/apikey/?scopes__0_1=x",  # a slice is an array too
        "/admin/integrations/apikey/?scopes__0_1__0=x",  # and so is its item, to PostgreSQL
        "/admin/integrations/apikey/?scopes=%7Bingest%7D",  # nor is a literal a filter of ours
        "/admin/integrations/saasconnection/?identifier_categories=x",
        "/admin/integrations/apikey/?scopes__range=a,b",
        "/admin/integrations/apikey/?scopes__gt=x",
        "/admin/integrations/saasconnection/?identifier_categories__overlap=x",
    ],
)
def test_an_array_column_filtered_by_text_is_refused_as_an_invalid_filter(
    broker: Broker, superuser_client: Client, url: str
) -> None:
    answer = superuser_client.get(url)

    # PostgreSQL reads the text as an array ("malformed array literal"): a filter the list
    # cannot apply, so the list without it.
    assert answer.status_code == 302
    assert answer["Location"] == url.split("?")[0] + "?e=1"


@pytest.mark.parametrize("query", ["scopes__0=ingest", "scopes__len=1", "scopes__isnull=False"])
def test_an_array_column_s_item_or_length_still_filters(
    superuser_client: Client, make_key: Callable[..., CreatedApiKey], query: str
) -> None:
    key = make_key("ingest")

    answer = superuser_client.get(f"/admin/integrations/apikey/?{query}")

    assert answer.status_code == 200
    assert answer.context_data is not None
    assert [k.pk for k in answer.context_data["cl"].result_list] == [key.api_key.pk]


# -- a "digit" that is not an ASCII digit -----------------------------------------------------


def test_a_cycle_filter_that_is_no_ascii_number_lists_nothing(
    broker: Broker, superuser_client: Client, subtests: pytest.Subtests
) -> None:
    sample_cycle(broker, today=timezone.localdate())

    for model in ("deletionrequest", "resolutionrequest"):
        for cycle in ("%C2%B2", "%D9%A3"):  # "²" (isdigit, not int), "٣" (both)
            url = f"/admin/integrations/{model}/?cycle={cycle}"
            with subtests.test(url=url):
                answer = superuser_client.get(url)

                assert answer.status_code == 200, url
                assert answer.context_data is not None, url
                assert list(answer.context_data["cl"].result_list) == [], url


def test_a_drop_year_filter_that_is_no_ascii_number_is_not_applied(
    broker: Broker, superuser_client: Client
) -> None:
    sample_cycle(broker, today=timezone.localdate())

    answer = superuser_client.get("/admin/integrations/workitem/?drop_year=%C2%B2")

    assert answer.status_code == 200
    assert answer.context_data is not None
    assert len(answer.context_data["cl"].result_list) == WorkItem.objects.count() > 0


def test_a_reappearance_broker_that_is_no_ascii_number_counts_every_broker(
    broker: Broker, superuser_client: Client
) -> None:
    answer = superuser_client.get("/admin/integrations/reappearance/?broker__id__exact=%C2%B2")

    # The summary above the list reads the broker itself: no broker, so every one's counts.
    assert answer.status_code == 200
    assert answer.context_data is not None
    assert answer.context_data["reappearance_filtered"] is False


# -- an action on a selection that is not a row's id ------------------------------------------


NOT_IDS_POSTED = [
    ("/admin/integrations/workitem/", "set_work_item_status"),
    ("/admin/integrations/reportfile/", "approve_files"),
    ("/admin/integrations/integration/", "disable_integrations"),
    ("/admin/integrations/apikey/", "revoke_keys"),
    ("/admin/auth/user/", "reset_mfa"),
    ("/admin/auth/group/", "delete_selected"),
    ("/admin/axes/accesslog/", "delete_selected"),
    ("/admin/procrastinate/procrastinatejob/", "cancel"),
]


def test_an_action_on_a_selection_that_is_no_id_is_a_400(
    broker: Broker, superuser_client: Client, subtests: pytest.Subtests
) -> None:
    sample_cycle(broker, today=timezone.localdate())

    for url, action in NOT_IDS_POSTED:
        for selected in ("abc", "%C2%B2"):
            with subtests.test(url=url, action=action, selected=selected):
                answer = superuser_client.post(
                    url,
                    f"action={action}&index=0&_selected_action={selected}",
                    content_type="application/x-www-form-urlencoded",
                )

                tried = f"{url} {action} {selected}"
                assert answer.status_code == 400, tried
                assert answer["Content-Type"] == "text/plain", tried
                assert answer.content.startswith(
                    b"Not done: the selection holds a value that is no id"
                ), tried


def test_a_delete_confirmed_with_one_selection_no_id_deletes_nothing(
    broker: Broker, superuser_client: Client
) -> None:
    group = Group.objects.create(name="Readers")

    # The confirmation page's form, its rows as it lists them, one changed on the way.
    answer = superuser_client.post(
        "/admin/auth/group/",
        {"action": "delete_selected", "post": "yes", "_selected_action": [group.pk, "abc"]},
    )

    assert answer.status_code == 400
    assert Group.objects.filter(pk=group.pk).exists()


def test_an_action_on_ids_still_runs(broker: Broker, superuser_client: Client) -> None:
    group = Group.objects.create(name="Readers")

    answer = superuser_client.post(
        "/admin/auth/group/",
        {"action": "delete_selected", "post": "yes", "_selected_action": [group.pk]},
    )

    assert answer.status_code == 302
    assert not Group.objects.filter(pk=group.pk).exists()


# -- the login lockouts' own action (superusers only) -----------------------------------------


def test_cleaning_up_expired_login_attempts_deletes_the_expired_ones(
    broker: Broker, superuser_client: Client
) -> None:
    expired, recent = (
        AccessAttempt.objects.create(
            username=name, ip_address="203.0.113.9", failures_since_start=1
        )
        for name in ("expired", "recent")
    )
    # Older than the lockout's cool-off (AXES_COOLOFF_TIME, 15 minutes).
    AccessAttempt.objects.filter(pk=expired.pk).update(
        attempt_time=timezone.now() - dt.timedelta(hours=1)
    )

    answer = superuser_client.post(
        "/admin/axes/accessattempt/",
        {"action": "cleanup_expired_attempts", "index": 0, "_selected_action": [recent.pk]},
        follow=True,
    )

    assert answer.status_code == 200
    assert "Cleaned up 1 expired access attempts." in answer.content.decode()
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == ["recent"]


# -- every registered admin, a handful of hostile requests each ------------------------------


def _hostile_requests(
    client: Client, model_admin: admin.ModelAdmin[Any]
) -> Iterator[tuple[str, HttpResponseBase]]:
    """A NUL in a filter, a superscript digit in each, text for each array column, the date
    drill-down past 9999 and each action on a selection that is no id: what once broke
    lists. A guard for every admin registered later, bounded to run in every ``make test``
    (a few seconds)."""
    opts = model_admin.model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    page = client.get(url)
    yield url, page
    changelist = page.context_data["cl"] if page.status_code == 200 and page.context_data else None
    params = [
        p for spec in getattr(changelist, "filter_specs", ()) for p in spec.expected_parameters()
    ]
    # A NUL is refused for every page at once (the site's wrapper); a digit int() does not
    # read is each filter's own to handle.
    for query in [f"{url}?{(params or ['q'])[0]}=%00", *(f"{url}?{p}=%C2%B2" for p in params)]:
        yield query, client.get(query)
    for field in opts.get_fields():
        if isinstance(field, ArrayField):
            query = f"{url}?{field.name}=x"
            yield query, client.get(query)
    if model_admin.date_hierarchy:
        query = f"{url}?{model_admin.date_hierarchy}__year=9999"
        yield query, client.get(query)
    for action in every_action(model_admin):
        body = f"action={action}&index=0&_selected_action=abc"
        yield (
            f"POST {url} {body}",
            client.post(url, body, content_type="application/x-www-form-urlencoded"),
        )


@pytest.mark.usefixtures("every_model")
def test_no_registered_admin_answers_hostile_input_with_a_500(
    superuser_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="django.request")
    failed = [
        f"{answer.status_code} {request}"
        for model_admin in admin.site._registry.values()
        for request, answer in _hostile_requests(superuser_client, model_admin)
        if answer.status_code >= 500
    ]

    assert not failed, "\n".join(failed)
