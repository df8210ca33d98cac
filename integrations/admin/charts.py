"""Server-rendered SVG charts for the dashboard: no JavaScript, no build step, no CDN.

Each function takes plain values and returns inline SVG markup, safe to drop into a template;
every text is escaped and every series segment can link to the list behind it::

    stacked_bars(
        [Bar(label="3", sublabel="Mar 12", segments=[Segment("Deleted", 120, "#2563eb", url)])],
        title="Outcomes per cycle",
    )
    cycle_timeline(start=date(2026, 3, 12), due=date(2026, 4, 26), today=date.today(),
                   not_removed=900, with_status=640, reported=0, owed=900, title="Cycle 3")
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

# Colours of the days-left states, shared with the dashboard's badges.
CALM = "#15803d"
SOON = "#b45309"
LATE = "#b91c1c"
TRACK = "#e5e7eb"
INK = "currentColor"  # the surrounding text colour (light and dark themes)
MUTED = "#6b7280"


@dataclass(frozen=True)
class Segment:
    label: str
    value: int
    color: str
    url: str | None = None


@dataclass(frozen=True)
class Bar:
    label: str
    segments: Sequence[Segment]
    sublabel: str = ""
    url: str | None = None

    @property
    def total(self) -> int:
        return sum(segment.value for segment in self.segments)


def days_left_tone(days_left: int, *, owed: int) -> str:
    """Calm with more than two weeks to go, soon within two weeks, late within 5 days or past;
    calm whatever the days with no status ``owed``: an amendment still to send owes none."""
    if not owed:
        return "calm"
    if days_left <= 5:
        return "late"
    if days_left <= 14:
        return "soon"
    return "calm"


def days_left_color(days_left: int, *, owed: int) -> str:
    return {"calm": CALM, "soon": SOON, "late": LATE}[days_left_tone(days_left, owed=owed)]


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is at least ``value`` (>= 1)."""
    if value <= 2:
        return max(value, 1)
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return math.ceil(step * power)
    return 10 * power  # pragma: no cover  (the loop always returns)


def _linked(url: str | None, inner: SafeString) -> SafeString:
    return format_html('<a href="{}">{}</a>', url, inner) if url else inner


def stacked_bars(
    bars: Sequence[Bar],
    *,
    title: str,
    width: int = 560,
    height: int = 200,
) -> SafeString:
    """One stacked column per bar, oldest left; each segment a link with a tooltip."""
    left, right, top, bottom = 44, 8, 18, 38
    plot_w, plot_h = width - left - right, height - top - bottom
    scale_max = nice_ceiling(max((bar.total for bar in bars), default=0))
    parts: list[SafeString] = [format_html("<title>{}</title>", title)]
    parts += _bars_grid(left=left, x_end=width - right, top=top, plot_h=plot_h, scale_max=scale_max)
    if not bars:
        parts.append(
            format_html(
                '<text x="{}" y="{}" text-anchor="middle" font-size="13" fill="{}">{}</text>',
                left + plot_w // 2,
                top + plot_h // 2,
                MUTED,
                "No cycle downloaded yet",
            )
        )
    slot = plot_w / max(len(bars), 1)
    bar_w = min(56.0, slot * 0.62)
    for index, bar in enumerate(bars):
        x = left + slot * index + (slot - bar_w) / 2
        parts += _bar_column(
            bar, x=x, bar_w=bar_w, base=top + plot_h, plot_h=plot_h, scale_max=scale_max
        )
        parts.append(_bar_labels(bar, center=x + bar_w / 2, axis=height - bottom))
    return _svg(width, height, title, parts, css_class="chart chart-bars")


def _bars_grid(*, left: int, x_end: int, top: int, plot_h: int, scale_max: int) -> list[SafeString]:
    """Horizontal grid: 0, half (labelled when it is a whole number), max."""
    parts: list[SafeString] = []
    for fraction in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - fraction)
        label = scale_max * fraction
        parts.append(
            format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="1"/>'
                '<text x="{}" y="{}" text-anchor="end" font-size="11" fill="{}">{}</text>',
                left,
                x_end,
                _n(y),
                _n(y),
                TRACK,
                left - 6,
                _n(y + 4),
                MUTED,
                _count_label(int(label)) if label == int(label) else "",
            )
        )
    return parts


def _bar_column(
    bar: Bar, *, x: float, bar_w: float, base: int, plot_h: int, scale_max: int
) -> list[SafeString]:
    """The bar's segments stacked up from ``base``, its total above them."""
    parts: list[SafeString] = []
    y: float = base
    for segment in bar.segments:
        if segment.value <= 0:
            continue
        h = plot_h * segment.value / scale_max
        y -= h
        parts.append(
            _linked(
                segment.url,
                format_html(
                    '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                    "<title>{}: {} {}</title></rect>",
                    _n(x),
                    _n(y),
                    _n(bar_w),
                    _n(max(h, 0.5)),
                    segment.color,
                    bar.label,
                    segment.label,
                    f"{segment.value:,}",
                ),
            )
        )
    parts.append(
        format_html(
            '<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="{}">{}</text>',
            _n(x + bar_w / 2),
            _n(y - 5),
            INK,
            _count_label(bar.total),
        )
    )
    return parts


def _bar_labels(bar: Bar, *, center: float, axis: int) -> SafeString:
    """The bar's label and sublabel under the axis, linked to the bar's list."""
    return _linked(
        bar.url,
        format_html(
            '<text x="{}" y="{}" text-anchor="middle" font-size="12" fill="{}">{}</text>'
            '<text x="{}" y="{}" text-anchor="middle" font-size="10" fill="{}">{}</text>',
            _n(center),
            axis + 16,
            INK,
            bar.label,
            _n(center),
            axis + 30,
            MUTED,
            bar.sublabel,
        ),
    )


def cycle_timeline(
    *,
    start: dt.date,
    due: dt.date,
    today: dt.date,
    not_removed: int,
    with_status: int,
    reported: int,
    owed: int,
    title: str,
    width: int = 600,
) -> SafeString:
    """The 45 days (or whatever the span) of a cycle: time used above, work done below (of
    the cycle's ``not_removed`` work items, how many have a status and how many DROP holds
    one for). ``owed``: the statuses DROP is still owed (``CycleWorkItems.owed``); with none,
    the time is late for nothing."""
    height = 92
    left, right = 8, 8
    parts: list[SafeString] = [format_html("<title>{}</title>", title)]
    parts += _timeline_time(
        start=start, due=due, today=today, owed=owed, width=width, left=left, right=right
    )
    parts.append(
        _timeline_work(
            not_removed=not_removed,
            with_status=with_status,
            reported=reported,
            left=left,
            track_w=width - left - right,
        )
    )
    return _svg(width, height, title, parts, css_class="chart chart-timeline")


def _timeline_time(
    *, start: dt.date, due: dt.date, today: dt.date, owed: int, width: int, left: int, right: int
) -> list[SafeString]:
    """Time: the track, the days used, a tick every 5 days, today; the two dates under it."""
    track_w = width - left - right
    span = max((due - start).days, 1)
    elapsed = (today - start).days
    days_left = (due - today).days
    color = days_left_color(days_left, owed=owed)
    caption = _days_caption(elapsed, span, days_left) if owed else "nothing owed"

    def x_at(day: float) -> float:
        return left + track_w * min(max(day, 0), span) / span

    parts: list[SafeString] = []
    parts.append(
        format_html(
            '<rect x="{}" y="22" width="{}" height="14" rx="3" fill="{}"/>'
            '<rect x="{}" y="22" width="{}" height="14" rx="3" fill="{}" fill-opacity="0.85">'
            "<title>{}</title></rect>",
            left,
            track_w,
            TRACK,
            left,
            _n(x_at(elapsed) - left),
            color,
            caption,
        )
    )
    parts.append(
        format_html_join(
            "",
            '<line x1="{0}" x2="{0}" y1="36" y2="40" stroke="{1}" stroke-width="1"/>',
            ((_n(x_at(day)), MUTED) for day in range(0, span + 1, 5)),
        )
    )
    today_x = x_at(elapsed)
    parts.append(
        format_html(
            '<line x1="{0}" x2="{0}" y1="16" y2="40" stroke="{1}" stroke-width="2"/>'
            '<text x="{2}" y="12" text-anchor="{3}" font-size="11" fill="{1}">{4}</text>',
            _n(today_x),
            INK,
            _n(today_x),
            "start" if today_x < width * 0.15 else "end" if today_x > width * 0.85 else "middle",
            caption,
        )
    )
    parts.append(
        format_html(
            '<text x="{}" y="52" font-size="11" fill="{}">{}</text>'
            '<text x="{}" y="52" text-anchor="end" font-size="11" fill="{}">due {}</text>',
            left,
            MUTED,
            f"downloaded {start:%b} {start.day}",
            width - right,
            color,
            f"{due:%b} {due.day}",
        )
    )
    return parts


def _timeline_work(
    *, not_removed: int, with_status: int, reported: int, left: int, track_w: int
) -> SafeString:
    """Work: statuses known, and of those reported to DROP."""
    known_w = track_w * with_status / not_removed if not_removed else 0
    reported_w = track_w * reported / not_removed if not_removed else 0
    return format_html(
        '<rect x="{}" y="62" width="{}" height="8" rx="2" fill="{}"/>'
        '<rect x="{}" y="62" width="{}" height="8" rx="2" fill="#93c5fd"/>'
        '<rect x="{}" y="62" width="{}" height="8" rx="2" fill="#2563eb"/>'
        '<text x="{}" y="86" font-size="11" fill="{}">{}</text>',
        left,
        track_w,
        TRACK,
        left,
        _n(known_w),
        left,
        _n(reported_w),
        left,
        MUTED,
        _work_caption(not_removed, with_status, reported),
    )


def _days_caption(elapsed: int, span: int, days_left: int) -> str:
    if days_left < 0:
        return f"overdue by {-days_left} day{'s' if days_left != -1 else ''}"
    if elapsed < 0:
        return "not started"
    return f"day {elapsed} of {span} · {days_left} left"


def _work_caption(not_removed: int, with_status: int, reported: int) -> str:
    if not not_removed:
        return "no status owed"  # no work item, or every one removed
    return (
        f"statuses known {with_status:,} of {not_removed:,} ({100 * with_status // not_removed}%)"
        f" · reported {reported:,}"
    )


def _count_label(value: int) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:,}"


def _n(value: float) -> str:
    """Coordinates with at most one decimal: smaller markup, no float noise."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _svg(
    width: int, height: int, title: str, parts: Sequence[SafeString], *, css_class: str
) -> SafeString:
    body = mark_safe("".join(parts))  # noqa: S308  (every part was built by format_html)
    # A chart whose segments link somewhere is a group of links, not one picture: an image
    # role would hide the links from keyboard and screen reader users.
    role = "group" if "<a " in body else "img"
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="{}" viewBox="0 0 {} {}" '
        'role="{}" aria-label="{}" preserveAspectRatio="xMinYMin meet">{}</svg>',
        css_class,
        width,
        height,
        role,
        title,
        body,
    )
