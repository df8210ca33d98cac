"""``drop recurring``'s refusals: how far ahead it may send rounds."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.models import Broker

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("ahead", ["46", "5000000"])
def test_drop_recurring_refuses_to_look_further_ahead_than_the_interval(
    broker: Broker, settings: Any, ahead: str
) -> None:
    settings.DROPPORTAL_RECURRING_DAYS = 45
    with pytest.raises(CommandError, match="--ahead must be at most 45 days"):
        call_command("drop", "recurring", "--broker", broker.broker_id, "--ahead", ahead)


def test_drop_recurring_looks_as_far_ahead_as_the_interval(broker: Broker, settings: Any) -> None:
    settings.DROPPORTAL_RECURRING_DAYS = 30
    out = io.StringIO()
    call_command(
        "drop", "recurring", "--broker", broker.broker_id, "--ahead", "30", "--json", stdout=out
    )
    assert json.loads(out.getvalue())["work_items"] == 0
    with pytest.raises(CommandError, match="--ahead must be at most 30 days"):
        call_command("drop", "recurring", "--broker", broker.broker_id, "--ahead", "31")
