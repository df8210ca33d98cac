"""``brokers lists-selected``: staff record which lists the broker selected in DROP's portal
and why; each selection is kept with the time it is in force from, and ledgered."""

from __future__ import annotations

import datetime as dt
import io
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.drop.calendar import drop_timezone
from integrations.models import Broker, LedgerEvent, ListSelection
from integrations.selectors.list_selection import lists_selected_at

pytestmark = pytest.mark.django_db


def lists_selected(*args: str) -> str:
    out = io.StringIO()
    call_command("brokers", "lists-selected", "4821", *args, stdout=out)
    return out.getvalue()


def test_a_selection_is_recorded_with_its_reason_and_ledgered(broker: Broker) -> None:
    out = lists_selected("--lists", "phone,email", "--reason", "we hold emails and phones")

    assert out.startswith("Recorded the lists broker 4821 selected in DROP's portal: Email, Phone")
    selection = ListSelection.objects.get()
    assert (selection.lists, selection.reason) == (["email", "phone"], "we hold emails and phones")
    assert selection.actor.startswith("cli")
    event = LedgerEvent.objects.get(kind="broker.lists_selected")
    assert (event.broker_id, event.actor) == ("4821", selection.actor)
    assert event.data == {
        "lists": ["Email", "Phone"],
        "reason": "we hold emails and phones",
        "effective_from": selection.effective_from.isoformat(),
        "previous_lists": None,
    }


def test_a_change_keeps_the_earlier_selection_and_names_it(broker: Broker) -> None:
    lists_selected("--lists", "email", "--reason", "emails only", "--since", "2026-08-01")
    out = lists_selected("--lists", "Email,NDZ,NameVIN", "--reason", "we bought a vehicle file")

    first, second = ListSelection.objects.order_by("effective_from")
    assert first.lists == ["email"]
    assert first.effective_from == dt.datetime(2026, 8, 1, tzinfo=drop_timezone())
    assert second.lists == ["email", "ndz", "name_vin"]  # DROP's names, in any case
    assert lists_selected_at(broker, dt.datetime(2026, 9, 1, tzinfo=dt.UTC)) == first
    assert lists_selected_at(broker) == second
    event = LedgerEvent.objects.filter(kind="broker.lists_selected").last()
    assert event is not None and event.data["previous_lists"] == ["Email"]
    assert "Email, NDZ, NameVIN" in out


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--lists", "email,fax", "--reason", "r"], "not a DROP list: 'fax' (the lists are email"),
        (["--lists", ",", "--reason", "r"], "name at least one DROP list"),
        (["--lists", "email", "--reason", "  "], "give the reason for this selection"),
        (["--lists", "email"], "the following arguments are required: --reason"),
        (["--lists", "email", "--reason", "r", "--since", "2099-01-01"], "is in the future"),
    ],
)
def test_bad_lists_or_no_reason_are_refused_and_nothing_is_recorded(
    broker: Broker, args: list[str], error: str
) -> None:
    with pytest.raises(CommandError, match=re.escape(error)):
        lists_selected(*args)

    assert not ListSelection.objects.exists()
    assert not LedgerEvent.objects.filter(kind="broker.lists_selected").exists()


def test_an_unknown_broker_is_one_clear_error(db: None) -> None:
    with pytest.raises(CommandError, match="no broker with id '4821'"):
        lists_selected("--lists", "email", "--reason", "r")


def test_json_and_the_broker_list_show_the_selection_in_force(broker: Broker) -> None:
    out = io.StringIO()
    call_command(
        "brokers", "lists-selected", "4821", "--lists", "email", "--reason", "emails",
        "--json", stdout=out,
    )  # fmt: skip
    recorded = json.loads(out.getvalue())
    assert (recorded["broker_id"], recorded["lists"], recorded["reason"]) == (
        "4821",
        ["email"],
        "emails",
    )

    out = io.StringIO()
    call_command("brokers", "list", "--json", stdout=out)
    (listed,) = json.loads(out.getvalue())["items"]
    assert listed["lists_selected"] == {key: recorded[key] for key in listed["lists_selected"]}
