"""How much of a selection one run of an admin action takes: its first ``ROWS_PER_RUN`` rows
by primary key (oldest first), and the page says so.

An action runs in the web request, one service call a row (each its own transaction and
ledger event). "Select all" over 20,000 undeliverable requests after an outage would run for
many minutes, far past what a web request may take (gunicorn's 30 s, a proxy's timeout):
staff would get an error page and no word of how far it went. So a run takes at most
``ROWS_PER_RUN`` rows and, when the selection held more, says how many of how many it took.
Rows it changed so that they leave the list's filter (*State: undeliverable*, redelivered)
are not taken again: running it again goes on with the rest. Where rows it took are still
in the selection (a list not filtered by what the action changes, rows it refused), the
message says so, since running it again would take the same rows: staff narrow the list
first::

    batch = first_rows(queryset)
    for row in batch.rows:
        ...  # the service, as for any selection
    batch.tell(request)  # nothing when the selection fit in one run

An action handing a queryset on (a service taking one, a library's action) takes
``first_keys(queryset).chosen`` instead: the same run, read as keys only.

The pages that ask for a reason first (``action_pages.action_form_page``) count and list what
the run will take, and Django's "Delete selected" (replaced by ``delete_selected`` on each
of the project's admin sites: its confirmation page lists every related object of every
selected row, and a consumer is deleted through its service, one at a time) confirms and
deletes those rows only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse

from integrations.admin.capped_count import CappedCountPaginator, CountAtLeast

# A run stays within the web's 30 s on a machine twice as slow as the one the slowest
# action was measured on (docs/benchmarks.md, "Admin actions"). Read at each call (tests
# set it small).
ROWS_PER_RUN = 300


def selection_count(queryset: QuerySet[Any]) -> int:
    """How many rows the selection holds, read no further than the big lists' count cap
    (a ``CountAtLeast`` past it): "select all" over every consumer is not counted whole."""
    cap = CappedCountPaginator.cap
    found = queryset.order_by().values("pk")[: cap + 1].count()
    return CountAtLeast(found) if found > cap else found


def count_text(count: int) -> str:
    return str(count) if isinstance(count, CountAtLeast) else f"{count:,}"


def taken(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """The rows a run takes of ``queryset``, in the order it takes them (to list them)."""
    return queryset.order_by("pk")[:ROWS_PER_RUN]


_M = TypeVar("_M", bound=Model)


@dataclass(frozen=True)
class Batch(Generic[_M]):
    """What one run takes of a selection (``queryset``) of ``selected`` rows: the keys of
    its first rows (``keys``) and, read by ``first_rows``, those rows (``rows``). ``of`` names
    what was counted, when an action narrowed the selection first."""

    queryset: QuerySet[_M]
    keys: list[Any]
    selected: int
    rows: list[_M] = field(default_factory=list)
    of: str = "selected"

    @property
    def chosen(self) -> QuerySet[_M]:
        """The selection narrowed to the rows the run takes."""
        return self.queryset.filter(pk__in=self.keys)

    @property
    def partial(self) -> bool:
        return self.selected > len(self.keys)

    def left_text(self) -> str:
        left = self.selected - len(self.keys)
        return count_text(CountAtLeast(left) if isinstance(self.selected, CountAtLeast) else left)

    def taking(self) -> str:
        """What a run takes, in the words every message of it uses."""
        return f"the first {len(self.keys):,} of the {count_text(self.selected)} {self.of}"

    def note(self) -> str:
        """What the run did not take, and whether running it again takes the rest."""
        head = f"This run took {self.taking()} ({_rule()}); {self.left_text()} left as they were."
        still = self.chosen.count()
        if not still:
            return f"{head} Run the action again for the rest."
        return (
            f"{head} {still:,} of those it took are still in the selection (refused, or "
            "still matching the list's filters), so running it again would take them again: "
            "narrow the list to the rest first (a filter or a search)."
        )

    def tell(self, request: HttpRequest) -> None:
        if self.partial:
            messages.warning(request, self.note())


def _rule() -> str:
    return f"an action takes at most {ROWS_PER_RUN:,} a run, oldest first"


def _run(queryset: QuerySet[_M], found: list[Any]) -> tuple[list[Any], int]:
    """Of the first ``ROWS_PER_RUN + 1`` rows (or keys) ``found``, those a run takes, and
    how many the selection holds: counted only when there are more (a selection that fits
    costs no count)."""
    selected = len(found) if len(found) <= ROWS_PER_RUN else selection_count(queryset)
    return found[:ROWS_PER_RUN], selected


def first_rows(queryset: QuerySet[_M], of: str = "selected") -> Batch[_M]:
    """The first ``ROWS_PER_RUN`` rows of ``queryset`` by primary key. ``of`` says what
    ``queryset`` holds when it is not the selection itself ("enabled in the selection")."""
    rows, selected = _run(queryset, list(queryset.order_by("pk")[: ROWS_PER_RUN + 1]))
    return Batch(queryset, [row.pk for row in rows], selected, rows, of)


def first_keys(queryset: QuerySet[_M]) -> Batch[_M]:
    """``first_rows``' run read as keys only, for an action handed a queryset (its
    ``chosen``) rather than rows."""
    found = list(queryset.order_by("pk").values_list("pk", flat=True)[: ROWS_PER_RUN + 1])
    keys, selected = _run(queryset, found)
    return Batch(queryset, keys, selected)


def form_page_note(queryset: QuerySet[Any]) -> tuple[int, str]:
    """For a page asking for a reason before the action: how many rows the run will take,
    and, when the selection holds more, a sentence saying so ("" otherwise)."""
    batch = first_keys(queryset)
    if not batch.partial:
        return len(batch.keys), ""
    return len(batch.keys), (
        f"This run takes {batch.taking()} ({_rule()}); the others stay as they are until it "
        "is run again."
    )


def delete_selected(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> HttpResponse | None:
    """Django's "Delete selected", on the selection's first ``ROWS_PER_RUN`` rows: its
    confirmation page lists them (and only they are posted back to be deleted). Every
    ``DropportalAdminSite`` offers it as its "Delete selected" (``dropportal/admin.py``)."""
    batch = first_keys(queryset)  # Django's action reads the rows it deletes itself
    chosen = batch.chosen
    confirmed = bool(request.POST.get("post"))
    if batch.partial and not confirmed:
        messages.warning(
            request,
            f"Only {batch.taking()} are listed below, and only they are deleted once confirmed "
            f"({_rule()}): select the {batch.left_text()} left again afterwards.",
        )
    answer = django_delete_selected(modeladmin, request, chosen)
    if confirmed:
        batch.tell(request)  # a confirmation posted for more than the page listed
    return answer
