"""No search box of the console puts a clear email in a URL, so none reaches an access log.

Every request the browser makes is recorded (``page.on("request")``) while an email is typed
into unfold's command palette (Ctrl+K and Cmd+K) and into the search boxes of the lists that
render it differently (the base list template, and lists with their own template); no
recorded URL may carry it, in any spelling. That every list renders this one search form is
checked without a browser (``tests/admin/test_work_item_search.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote_plus

import unfold
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Page, Request
from pytest_django.live_server_helper import LiveServer

from tests.browser.staff import sign_in

EMAIL = "Consumer.0113@Example.com"
# Unfold's palette sends what was typed this long after the last key (htmx's keyup delay, in
# the template of unfold's that ours replaces).
PALETTE = Path(unfold.__file__).parent / "templates" / "unfold" / "helpers" / "command.html"
(PALETTE_DELAY_MS,) = map(int, re.findall(r"keyup changed delay:(\d+)ms", PALETTE.read_text()))
# A timer started in the page after the last key, for as long, fires after htmx's, which
# sends the request as it fires: no margin of wall time on top (it was 1 s per shortcut).
PAGE_WAITS = "ms => new Promise(done => setTimeout(done, ms))"
# The work items (the search staff use most), a list on the base template and the three
# lists whose templates extend it with their own blocks.
LISTS = ("workitem", "consumer", "ledgerevent", "integration", "reportfile")


def _carries_the_email(url: str) -> bool:
    return "consumer.0113" in unquote_plus(unquote_plus(url)).lower()


def test_no_search_box_puts_a_typed_email_in_a_url(
    page: Page, live_server: LiveServer, staff_user: User
) -> None:
    urls: list[str] = []

    def record(request: Request) -> None:
        urls.append(request.url)

    page.on("request", record)
    sign_in(page, live_server, "alice")
    for shortcut in ("Control+k", "Meta+k"):
        page.keyboard.press(shortcut)
        page.keyboard.type(EMAIL)
        page.evaluate(PAGE_WAITS, PALETTE_DELAY_MS)
        page.keyboard.press("Escape")
    assert not [url for url in urls if _carries_the_email(url)], "the palette sent it"
    assert not page.locator("#search-input-command").count(), "the command palette is there"
    sidebar = page.locator("#nav-sidebar-apps a")
    offered = {href for href in sidebar.evaluate_all("els => els.map(a => a.href)")}
    searched = []
    for name in LISTS:
        address = f"{live_server.url}/admin/integrations/{name}/"
        assert address in offered, f"the sidebar offers no {address}"
        page.goto(address)
        box = page.locator("#searchbar")
        box.fill(EMAIL)
        # Until the answer to the redirect's GET arrives: the URL that might carry the email
        # has been requested by then, and the next list need not wait for this one to draw.
        with page.expect_navigation(wait_until="commit"):
            box.press("Enter")
        searched.append(address)
    assert len(urls) > len(searched)
    assert not [url for url in urls if _carries_the_email(url)]


def test_the_palettes_search_url_answers_no_search(staff_user: User) -> None:
    client = Client()
    client.force_login(staff_user)
    answer = client.get("/admin/search/", {"s": EMAIL, "extended": "1"})
    assert answer.status_code == 404
    assert EMAIL.lower() not in answer.content.decode().lower()
