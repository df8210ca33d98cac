"""Reappearances in the admin: the date drill-down names and filters DROP's days."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client

from integrations.models import Broker
from tests.builders import ReappearanceFactory, WorkItemFactory

pytestmark = pytest.mark.django_db

# 03:00 UTC on January 1, 2027 is 19:00 on December 31, 2026 in California.
LATE_EVENING = dt.datetime(2027, 1, 1, 3, 0, tzinfo=dt.UTC)
DEC_31 = "reappeared_at__day=31&reappeared_at__month=12&reappeared_at__year=2026"


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_a_late_evening_reappearance_is_under_its_drop_day(
    broker: Broker, admin_client: Client
) -> None:
    late = ReappearanceFactory.create(
        work_item=WorkItemFactory.create(cycle__broker=broker), reappeared_at=LATE_EVENING
    )
    month = admin_client.get(
        "/admin/integrations/reappearance/?reappeared_at__month=12&reappeared_at__year=2026"
    )
    assert f"?{DEC_31}" in month.content.decode().replace("&amp;", "&")  # the day it shows
    day = admin_client.get(f"/admin/integrations/reappearance/?{DEC_31}")
    assert list(day.context["cl"].result_list) == [late]
    jan_1 = "reappeared_at__day=1&reappeared_at__month=1&reappeared_at__year=2027"
    assert (
        not admin_client.get(f"/admin/integrations/reappearance/?{jan_1}").context["cl"].result_list
    )
