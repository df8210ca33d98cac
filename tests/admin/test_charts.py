"""The dashboard's SVG charts: well-formed, proportional, linked and escaped."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET

import pytest

from integrations.admin.charts import (
    CALM,
    LATE,
    SOON,
    Bar,
    Segment,
    cycle_timeline,
    days_left_color,
    nice_ceiling,
    stacked_bars,
)

SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)  # noqa: S314  (our own output)


def texts(svg: ET.Element) -> list[str]:
    return [t.text or "" for t in svg.iter(f"{SVG}text")]


def bars() -> list[Bar]:
    return [
        Bar(
            label="#1",
            sublabel="Mar 12",
            url="/admin/cycle/1/",
            segments=[
                Segment("Deleted", 30, "#2563eb", "/items/?cycle=1&status=3"),
                Segment("Not found", 10, "#94a3b8", "/items/?cycle=1&status=5"),
                Segment("Exempt", 0, "#d97706", "/items/?cycle=1&status=2"),
            ],
        ),
        Bar(label="#2", sublabel="Apr 26", segments=[Segment("Deleted", 20, "#2563eb")]),
    ]


def test_stacked_bars_draw_one_linked_rect_per_non_zero_segment() -> None:
    svg = parse(stacked_bars(bars(), title="Outcomes"))
    links = [a.get("href") for a in svg.iter(f"{SVG}a")]
    assert "/items/?cycle=1&status=3" in links  # the parser has undone the &amp;
    assert "/items/?cycle=1&status=2" not in links  # a zero segment draws nothing
    rects = list(svg.iter(f"{SVG}rect"))
    assert [r.get("fill") for r in rects] == ["#2563eb", "#94a3b8", "#2563eb"]
    assert [r.findtext(f"{SVG}title") for r in rects] == [
        "#1: Deleted 30",
        "#1: Not found 10",
        "#2: Deleted 20",
    ]


def test_stacked_bars_are_proportional_and_stack_upwards() -> None:
    svg = parse(stacked_bars(bars(), title="Outcomes", height=200))
    deleted, not_found, second = (
        (float(r.get("y", 0)), float(r.get("height", 0))) for r in svg.iter(f"{SVG}rect")
    )
    assert deleted[1] == pytest.approx(3 * not_found[1], rel=0.01)
    assert deleted[1] == pytest.approx(1.5 * second[1], rel=0.01)
    assert not_found[0] + not_found[1] == pytest.approx(deleted[0], abs=0.1)  # on top
    # The scale is a round number at or above the tallest bar (40): 50.
    assert {"0", "25", "50"} <= set(texts(svg))
    assert {"40", "20", "#1", "Mar 12"} <= set(texts(svg))


def test_stacked_bars_escape_every_text() -> None:
    markup = stacked_bars(
        [Bar(label="<b>", segments=[Segment('"x"&', 1, "#000", "/?a=1&b=<2>")])],
        title="<script>alert(1)</script>",
    )
    assert "<script>" not in markup and "<b>" not in markup
    svg = parse(markup)
    assert svg.get("aria-label") == "<script>alert(1)</script>"
    assert "<b>" in texts(svg)


def test_stacked_bars_without_data_say_so() -> None:
    svg = parse(stacked_bars([], title="Outcomes"))
    assert "No cycle downloaded yet" in texts(svg)
    assert not list(svg.iter(f"{SVG}rect"))


@pytest.mark.parametrize(
    ("value", "ceiling"),
    [(0, 1), (1, 1), (2, 2), (3, 5), (10, 10), (11, 20), (22, 25), (40, 50), (51, 100)],
)
def test_nice_ceiling(value: int, ceiling: int) -> None:
    assert nice_ceiling(value) == ceiling


@pytest.mark.parametrize(("days_left", "color"), [(30, CALM), (14, SOON), (5, LATE), (-2, LATE)])
def test_days_left_color(days_left: int, color: str) -> None:
    assert days_left_color(days_left, owed=1) == color


def timeline(today: dt.date, **work: int) -> ET.Element:
    start = dt.date(2026, 3, 12)
    counts = {"not_removed": 200, "with_status": 150, "reported": 50, "owed": 150, **work}
    return parse(
        cycle_timeline(
            start=start, due=start + dt.timedelta(days=45), today=today, title="Cycle 3", **counts
        )
    )


def test_timeline_shows_the_days_used_and_the_work_done() -> None:
    svg = timeline(dt.date(2026, 3, 21))  # day 9 of 45
    track, used, work_track, known, reported = list(svg.iter(f"{SVG}rect"))
    assert float(used.get("width", 0)) == pytest.approx(float(track.get("width", 0)) * 9 / 45)
    assert used.get("fill") == CALM
    assert float(known.get("width", 0)) == pytest.approx(float(work_track.get("width", 0)) * 0.75)
    assert float(reported.get("width", 0)) == pytest.approx(float(work_track.get("width", 0)) / 4)
    captions = texts(svg)
    assert "day 9 of 45 · 36 left" in captions
    assert "due Apr 26" in captions
    assert "statuses known 150 of 200 (75%) · reported 50" in captions
    assert len(list(svg.iter(f"{SVG}line"))) == 10 + 1  # a tick every 5 days, and today


def test_timeline_of_a_late_cycle_is_red_and_full() -> None:
    svg = timeline(dt.date(2026, 4, 29))
    track, used, *_ = list(svg.iter(f"{SVG}rect"))
    assert used.get("fill") == LATE
    assert used.get("width") == track.get("width")
    assert "overdue by 3 days" in texts(svg)


def test_timeline_with_nothing_owed() -> None:
    assert "no status owed" in texts(timeline(dt.date(2026, 3, 21), not_removed=0, with_status=0))


def test_timeline_of_a_cycle_past_due_owing_nothing_is_not_late() -> None:
    # Every status with DROP; the cycle waits for an amendment only, which owes none.
    svg = timeline(dt.date(2026, 4, 29), with_status=200, reported=200, owed=0)
    _, used, *_ = list(svg.iter(f"{SVG}rect"))
    assert used.get("fill") == CALM
    assert "nothing owed" in texts(svg)
    assert not any("overdue" in text for text in texts(svg))
