"""DROP's notifications on the pages of what they are about (a cycle, a report file)::

drop_notifications_table(cycle.drop_notifications.all())
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from integrations.models import DropNotification

# DROP's notification names no file: said of one attached to the latest of several files one
# run uploaded (``DropNotification.report_file_guessed``).
GUESSED = "attached by guess: one run uploaded several files and DROP's notification names none"


def drop_notifications_table(notifications: QuerySet[DropNotification]) -> str:
    """A small table, newest first: when, which event (and whether the file it is attached to
    is a guess), DROP's message; "none" when empty."""
    rows = [
        (
            f"{timezone.localtime(n.received_at):%Y-%m-%d %H:%M %Z}",
            f"{n.event_type} ({GUESSED})" if n.report_file_guessed else n.event_type,
            n.message,
        )
        for n in notifications.order_by("-received_at", "-pk")[:50]
    ]
    if not rows:
        return "none"
    return format_html(
        "<table><tr><th>received</th><th>event</th><th>DROP's message</th></tr>{}</table>",
        format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
    )
