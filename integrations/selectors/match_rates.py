"""The match-rate watch: a list type whose match rate fell far below the broker's usual one.

Each cycle keeps, per list type, how many work items DROP sent and how many matched at
import (``DropCycle.match_rates``). A list of at least ``MATCH_RATE_MIN_ITEMS`` items whose
rate is below half the median of the broker's previous (up to ``MATCH_RATE_LOOKBACK``)
cycles holding that list type has usually met a change: DROP's standardization rules, or
the broker's own export. The ``match_rate_fell`` alert reads this::

    for fall in match_rate_falls():
        fall.cycle, fall.hash_type, fall.rate, fall.median
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from fractions import Fraction

from integrations.models import Broker, DropCycle

MATCH_RATE_MIN_ITEMS = 100
MATCH_RATE_LOOKBACK = 3
# How many earlier cycles are read to find LOOKBACK holding a list type (brokers select
# their lists once; a type absent from this many cycles in a row has no usual rate).
_CYCLES_READ = 12


@dataclass(frozen=True)
class MatchRateFall:
    cycle: DropCycle
    hash_type: str
    items: int
    matched: int
    rate: Fraction
    median: Fraction  # of the previous cycles' rates for the list type
    previous: int  # how many previous cycles the median is over


def match_rate(entry: dict[str, int]) -> Fraction | None:
    """A list's match rate, exactly (None when it held no item)."""
    items = int(entry.get("items", 0))
    return Fraction(int(entry.get("matched", 0)), items) if items > 0 else None


def match_rate_fell(current: dict[str, int], previous: list[Fraction]) -> Fraction | None:
    """The median ``current`` fell below half of, or None: too few items (under
    ``MATCH_RATE_MIN_ITEMS``), no previous cycle, or not below half (exactly half is not)."""
    rate = match_rate(current)
    if rate is None or int(current.get("items", 0)) < MATCH_RATE_MIN_ITEMS or not previous:
        return None
    median = Fraction(statistics.median(previous))
    return median if rate < median / 2 else None


def match_rate_falls(*, broker: Broker | None = None) -> list[MatchRateFall]:
    """The falls of each broker's latest cycle (the last imported), by list type."""
    latest = DropCycle.objects.order_by("broker_id", "-pk").distinct("broker_id")
    if broker is not None:
        latest = latest.filter(broker=broker)
    falls = []
    for cycle in latest.select_related("broker"):
        earlier = list(
            DropCycle.objects.filter(broker_id=cycle.broker_id, pk__lt=cycle.pk)
            .order_by("-pk")
            .values_list("match_rates", flat=True)[:_CYCLES_READ]
        )
        for hash_type, entry in sorted(cycle.match_rates.items()):
            rates = [
                rate
                for rates_of in earlier
                if (rate := match_rate(rates_of.get(hash_type, {}))) is not None
            ][:MATCH_RATE_LOOKBACK]
            median = match_rate_fell(entry, rates)
            if median is None:
                continue
            falls.append(
                MatchRateFall(
                    cycle=cycle,
                    hash_type=hash_type,
                    items=int(entry["items"]),
                    matched=int(entry.get("matched", 0)),
                    rate=match_rate(entry) or Fraction(0),
                    median=median,
                    previous=len(rates),
                )
            )
    return falls
