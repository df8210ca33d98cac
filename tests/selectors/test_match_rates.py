"""The match-rate watch: a list type of the broker's latest cycle that matched at less than
half the median of its previous (up to three) cycles, with at least 100 items, raises
``match_rate_fell`` naming the list type and what usually causes it."""

from __future__ import annotations

from fractions import Fraction

import pytest
from django.test import Client

from integrations.models import AlertState, Broker, DropCycle
from integrations.selectors.match_rates import match_rate_falls, match_rate_fell
from integrations.services.staff.alerts import alerts_evaluate
from tests.builders import DropCycleFactory

pytestmark = pytest.mark.django_db


def rates(*pairs: tuple[int, int]) -> list[Fraction]:
    return [Fraction(matched, items) for matched, items in pairs]


@pytest.mark.parametrize(
    ("items", "matched", "previous", "fell"),
    [
        (1000, 49, rates((100, 1000)), True),  # 4.9 % against 10 %: below half
        (1000, 50, rates((100, 1000)), False),  # exactly half is not below it
        (99, 0, rates((100, 1000)), False),  # fewer than 100 items: too few to tell
        (100, 0, rates((100, 1000)), True),  # 100 is enough
        (1000, 0, [], False),  # no previous cycle: nothing to compare with
        (1000, 0, rates((0, 500)), False),  # nothing ever matched: nothing fell
        # The median, not the mean: one odd cycle does not move it.
        (1000, 40, rates((100, 1000), (90, 1000), (900, 1000)), True),
        (1000, 60, rates((100, 1000), (120, 1000)), False),  # median of two: 11 %, half 5.5 %
    ],
)
def test_the_rule_and_its_edges(
    items: int, matched: int, previous: list[Fraction], fell: bool
) -> None:
    median = match_rate_fell({"items": items, "matched": matched}, previous)
    assert (median is not None) is fell


def cycle(broker: Broker, session: str, **lists: tuple[int, int]) -> DropCycle:
    """A cycle whose lists matched ``(matched, items)`` each."""
    return DropCycleFactory.create(
        broker=broker,
        drop_session_id=session,
        match_rates={
            hash_type: {"items": items, "matched": matched}
            for hash_type, (matched, items) in lists.items()
        },
    )


def test_a_fall_alerts_naming_the_list_and_what_usually_causes_it(broker: Broker) -> None:
    cycle(broker, "1", email=(300, 1000), phone=(50, 500))
    cycle(broker, "2", email=(100, 1000), phone=(60, 500))  # an odd one, outside the three
    cycle(broker, "3", email=(250, 1000), phone=(55, 500))
    cycle(broker, "4", email=(260, 1000), phone=(45, 500))
    cycle(broker, "5", email=(240, 1000), phone=(40, 500))
    latest = cycle(broker, "6", email=(30, 1200), phone=(52, 480), ndz=(0, 80))

    (raised,) = alerts_evaluate(conditions=["match_rate_fell"]).raised

    assert raised.key == f"match_rate_fell:cycle:{latest.pk}:email"
    assert raised.text == (
        "The match rate of the Email list fell to 2.5% (30 of 1200) in DROP cycle 6 of broker "
        "4821, below half its median of 25.0% over the previous 3 cycle(s): usually DROP "
        "changed its standardization rules or the broker's consumer export changed (a "
        "column, a format); check both before the cycle's statuses are reported"
    )
    assert raised.details["previous_cycles"] == 3
    assert raised.details["median"] == 0.25  # cycles 3 to 5: cycle 2's 10 % is not among them

    # The next cycle matches as usual: the alert clears.
    cycle(broker, "7", email=(270, 1000), phone=(50, 500))
    assert [a.key for a in alerts_evaluate().cleared] == [raised.key]
    assert not AlertState.objects.filter(condition="match_rate_fell", active=True).exists()


def test_the_first_cycle_and_small_lists_never_alert(broker: Broker) -> None:
    cycle(broker, "1", email=(0, 5000))
    assert match_rate_falls() == []
    cycle(broker, "2", email=(0, 99), phone=(0, 100))  # phone: no previous cycle with it
    assert match_rate_falls() == []
    cycle(broker, "3", email=(0, 100))  # a first rate of 0 % is no fall to come from
    assert match_rate_falls() == []


def test_cycles_imported_before_rates_were_kept_are_not_compared(broker: Broker) -> None:
    DropCycleFactory.create(broker=broker, drop_session_id="1")  # match_rates: {}
    cycle(broker, "2", email=(0, 1000))
    assert match_rate_falls() == []


def test_the_cycles_page_shows_each_lists_match_rate(broker: Broker, admin_client: Client) -> None:
    shown = cycle(broker, "1", email=(123, 1000), phone=(0, 40))
    page = admin_client.get(f"/admin/integrations/dropcycle/{shown.pk}/change/")
    text = page.content.decode()
    assert "Match rate by list type (at import)" in text
    assert "<tr><td>Email</td><td>123</td><td>1000</td><td>12.3%</td></tr>" in text
    assert "<tr><td>Phone</td><td>0</td><td>40</td><td>0.0%</td></tr>" in text
