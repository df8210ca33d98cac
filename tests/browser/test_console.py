"""The console in a real browser, as each role, on the demo's data: every page passes
axe-core (no critical or serious violation), every list fits 1280 pixels, and a consumer's
story is reached by keyboard alone. Screenshots of each page go to test-artifacts/console/.

``make demo`` runs once per test process (the ``demo`` fixture: its own database, served on a
free port) and each role logs in once (``devtools.demo`` creates a login per role); the pages
are visited in a loop: the sidebar names every list the role may open, and each list's first
row is its record page. Content another role's walk in this process already passed, and the
page around it (header, sidebar) and sidebar entries an earlier page passed, are not checked
again (``AXE_SHAPE``); what fails is checked on every page. A page another role's walk
opened, which the server renders for this role with the same markup but for the sidebar (the
role's lists, its login), is not opened again: its findings are that page's, and its screenshot
is the earlier role's (none is taken for this role: a copy would show another login).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import axe_playwright_python
import pytest
from playwright.sync_api import Browser, Page, expect
from pytest_django.live_server_helper import LiveServer

from integrations.drop.standardize import email_hash
from integrations.models import Broker, ConsumerHash, WorkItem
from integrations.services.staff.brokers import broker_create
from tests.browser.staff import ARTIFACTS, make_staff, sign_in
from tests.builders import sample_cycle
from tests.served_demo import ServedDemo

ROLES = {"Auditors": "auditor", "Operators": "operator", "Connections managers": "connections"}
BLOCKING = {"critical", "serious"}
# axe-core as the package ships it: given to the browser once per context, which runs it in
# every page it opens, instead of being sent and compiled again for every page checked.
AXE = Path(axe_playwright_python.__file__).with_name("axe.min.js")
WIDTH = 1280
# unfold's scrollbar (SimpleBar) wraps the sidebar in clipping layers that axe cannot see
# through: with it, the sidebar's colours were never checked. Its mark is taken off before
# it starts (an init script runs before the page's own), and the sidebar is the plain
# scrolling box it stands in for, drawn the same. (Not by blocking its script: routing a
# request turns off the browser's cache for every other.)
NO_SIMPLEBAR = """document.addEventListener('DOMContentLoaded', () => {
    document.querySelectorAll('[data-simplebar]').forEach(e => e.removeAttribute('data-simplebar'));
}, {capture: true});"""


@pytest.fixture
def world(transactional_db: None) -> Broker:
    from django.utils import timezone

    broker = broker_create(broker_id="4821", name="Acme Data", actor="test")
    sample_cycle(broker, today=timezone.localdate())
    make_staff("olga", "Operators")
    return broker


# A list's rows repeat one template: a row whose markup has the shape of an earlier row's
# (the same elements, classes, styles and attribute names, text or none where it had text or
# none) is left out of the check, which costs in proportion to the page's elements; a row
# with another status badge, an empty cell or a link more keeps its own check. The same goes
# for a page's content (``#content``, rows left out) across the roles' walks (most pages show
# every role the same content), for the sidebar's entries across pages (an entry with the
# shape of one that passed is left out; the current page's entry has classes of its own, so
# it is checked as such), and for the page around the content once its entries are left out
# (the document's header and sidebar, which every page of a role repeats). Most of axe's time
# goes to colour contrast, which hit-tests every text it checks: a page whose every part has
# passed is not run at all.
AXE_SHAPE = """passedEntries => {
    const shapeOf = (element, leftOut = '[data-axe-repeat]') => [
        element, ...element.querySelectorAll('*'),
    ].filter(e => !e.closest(leftOut))
        .map(e => [
            e.tagName, e.getAttribute('class'), e.getAttribute('style'),
            e.getAttributeNames().sort().join(','),
            [...e.childNodes].some(n => n.nodeType === Node.TEXT_NODE && n.textContent.trim()),
        ].join('|')).join(' ');
    const leaveOutRepeats = (elements, seen) => elements.forEach(element => {
        const shape = shapeOf(element);
        if (seen.has(shape)) element.setAttribute('data-axe-repeat', '');
        seen.add(shape);
    });
    leaveOutRepeats(document.querySelectorAll('#result_list tbody tr'), new Set());
    const entries = new Set(passedEntries);
    leaveOutRepeats(document.querySelectorAll('#nav-sidebar-apps li'), entries);
    const content = document.querySelector('#content');
    const aroundLeftOut = '[data-axe-repeat], #content, script';
    return {
        content: content ? shapeOf(content) : '',
        around: [...document.body.children].filter(e => !e.matches(aroundLeftOut))
            .map(e => shapeOf(e, aroundLeftOut)).join(' '),
        entries: [...entries].filter(shape => !passedEntries.includes(shape)),
    };
}"""
# A violation's impact is its rule's (axe-core 4.12 gives every result of a rule the rule's
# impact): a rule whose impact is not blocking can fail nothing here, so it is not run (a
# tenth of axe's time: region and the landmark rules walk the whole document).
AXE_RUN = """([skipContent, skipAround, blocking]) => axe.run(
    skipAround && document.querySelector('#content')
        ? {include: [['#content']], exclude: [['[data-axe-repeat]']]}
        : {
            include: [['html']],
            exclude: [['[data-axe-repeat]'], ...(skipContent ? [['#content']] : [])],
        },
    {
        resultTypes: ['violations'],
        rules: Object.fromEntries(axe._audit.rules
            .filter(rule => rule.impact && !blocking.includes(rule.impact))
            .map(rule => [rule.id, {enabled: false}])),
    },
).then(results => results.violations)"""


@dataclass
class Passed:
    """What passed axe in this module's walks: page contents and what is around them (their
    shapes' digests), and sidebar entries (their shapes)."""

    content: set[str] = field(default_factory=set)
    around: set[str] = field(default_factory=set)
    entries: set[str] = field(default_factory=set)
    # Pages opened in the browser, by their served markup's digest (``_markup``) and the box
    # their content was laid out in: what was found there.
    pages: dict[tuple[str, str], Checked] = field(default_factory=dict)
    opened: set[str] = field(default_factory=set)  # their addresses


@dataclass(frozen=True)
class Checked:
    problems: list[str]
    facts: dict[str, Any] | None  # LIST's


@pytest.fixture(scope="module")
def passed() -> Passed:
    return Passed()


def _violations(page: Page, passed: Passed) -> list[str]:
    shapes: dict[str, Any] = page.evaluate(AXE_SHAPE, sorted(passed.entries))
    content, around = (_digest(shapes["content"]), _digest(shapes["around"]))
    skip = [content in passed.content, around in passed.around]
    if all(skip):
        return []
    found: list[dict[str, Any]] = page.evaluate(AXE_RUN, [*skip, sorted(BLOCKING)])
    problems = [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes'][:3]]}"
        for v in found
        if v.get("impact") in BLOCKING
    ]
    if not problems:
        passed.content.add(content)
        passed.around.add(around)
        passed.entries.update(shapes["entries"])
    return problems


def _digest(shape: str) -> str:
    return hashlib.sha256(shape.encode()).hexdigest()


def _shot(page: Page, role: str, url: str) -> None:
    folder = ARTIFACTS / "console"
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9]+", "-", urlsplit(url).path.strip("/")) or "dashboard"
    # JPEG: quicker to take than PNG (a hundred times a run), and as legible. The caret is
    # left as it is: nothing on the walk's pages has the focus, and hiding it is a style added
    # and taken away again, two restylings of the whole page for every picture.
    path = folder / f"{role.split()[0].lower()}-{name}.jpg"
    page.screenshot(path=str(path), type="jpeg", quality=85, caret="initial")


SIDEBAR = '<div id="nav-sidebar"'


def _markup(html: str) -> str:
    """The digest of a served page without what differs between two renderings of it for two
    roles around the same content: the form tokens, and the sidebar (the lists the role may
    open, and who is signed in). The sidebar is checked on the role's own pages, and is a
    column of its own width whatever it holds, which ``CONTENT_BOX`` makes sure of."""
    html = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", html)
    start = html.find(SIDEBAR)
    if start >= 0:
        depth = 0
        for tag in re.finditer(r"<div\b|</div>", html[start:]):
            depth += 1 if tag.group() != "</div>" else -1
            if depth == 0:
                html = html[:start] + html[start + tag.end() :]
                break
    return _digest(html)


# Where the page's content is laid out: two pages of the same markup but for the sidebar
# navigation lay out the same when this box is the same in both.
CONTENT_BOX = """() => {
    const box = (document.querySelector('#content') || document.body).getBoundingClientRect();
    return [box.left, box.width, window.innerWidth].join(',');
}"""


# The list's facts in one call: whether it fits the window, and its first record's address.
LIST = """() => {
    const table = document.querySelector('#result_list');
    if (!table) return null;
    const box = table.getBoundingClientRect();
    const first = table.querySelector("tbody a[href*='/change/']");
    return {
        fits: box.right <= window.innerWidth + 1
            && table.offsetWidth <= table.parentElement.clientWidth + 1,
        record: first && (first.getAttribute('href') || ''),
    };
}"""


def _log_in(page: Page, url: str, username: str, password: str) -> None:
    """Log in as the login form does, its POST's cookies going to the page's context: the
    form's own page, which the walk does not check, is not drawn."""
    login = f"{url}/admin/login/?next=/admin/"
    form = page.request.get(login).text()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token is not None, form[:2000]
    answer = page.request.post(
        login,
        form={"csrfmiddlewaretoken": token.group(1), "username": username, "password": password},
        max_redirects=0,
    )
    assert answer.status == 302, f"{username} is not logged in: {answer.status}"


@pytest.mark.slow
@pytest.mark.parametrize("role", list(ROLES))
def test_every_page_passes_axe_and_every_list_fits_1280_pixels(
    browser: Browser, demo: ServedDemo, passed: Passed, role: str
) -> None:
    url, password = demo.url, demo.password
    context = browser.new_context(viewport={"width": WIDTH, "height": 900}, locale="en-US")
    context.set_default_timeout(10_000)
    context.add_init_script(path=AXE)
    context.add_init_script(NO_SIMPLEBAR)
    page = context.new_page()
    _log_in(page, url, ROLES[role], password)
    page.goto(f"{url}/admin/")
    assert page.url == f"{url}/admin/", f"{role} is not logged in"
    sidebar = page.locator("#nav-sidebar-apps a")
    pages = sorted({href for href in sidebar.evaluate_all("els => els.map(a => a.href)")})
    assert len(pages) >= 5, f"{role} sees only {pages}"
    content_box: str = page.evaluate(CONTENT_BOX)
    problems: dict[str, list[str]] = {}
    checked = 0

    def check(address: str) -> dict[str, Any] | None:
        """The page's problems (in ``problems``), and LIST's facts."""
        nonlocal checked
        checked += 1
        key = None
        if page.url != address:  # the login lands on the dashboard
            # A page another role's walk opened, served with the same markup but for the
            # sidebar: what was found there holds here (the server's rendering tells, a
            # fraction of the browser's work).
            if address in passed.opened:
                key = (_markup(page.request.get(address).text()), content_box)
                if (seen := passed.pages.get(key)) is not None:
                    problems[address] = list(seen.problems)
                    return seen.facts
            opened = page.goto(address)
            assert opened is not None
            key = (_markup(opened.text()), content_box)
        problems[address] = _violations(page, passed)
        _shot(page, role, address)
        facts: dict[str, Any] | None = page.evaluate(LIST)
        if facts is not None and not facts["fits"]:
            problems[address].append(f"the list is wider than {WIDTH} pixels")
        passed.opened.add(address)
        if key is not None:
            passed.pages[key] = Checked(list(problems[address]), facts)
        return facts

    for address in pages:
        found = check(address)
        if found is not None and found["record"] is not None:
            check(url + found["record"])
    context.close()
    failing = {address: found for address, found in problems.items() if found}
    assert not failing, f"{role}: {failing}"
    assert checked >= 8, f"{role} checked only {checked} pages"


def test_a_consumers_story_is_reached_by_keyboard_alone(
    page: Page, live_server: LiveServer, world: Broker
) -> None:
    item = WorkItem.objects.filter(deletion_requests__isnull=False).first()
    assert item is not None
    # The consumer's email, registered as its hash; DROP sent the same hash.
    hashed = base64.b64decode(email_hash("consumer.0113@example.com"))
    ConsumerHash.objects.filter(consumer__remote_identifier="C-1").update(hash=hashed)
    WorkItem.objects.filter(pk=item.pk).update(hash=hashed)
    page.set_viewport_size({"width": WIDTH, "height": 900})
    sign_in(page, live_server, "olga", "/admin/integrations/workitem/")
    page.keyboard.press("/")  # the search box's shortcut
    page.keyboard.type("  CONSUMER.0113@example.COM ")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"\?q="))
    assert "0113" not in page.url.lower()
    _tab_to(page, "#result_list tbody a[href*='/change/']")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Story, oldest first")).to_be_visible()
    _tab_to(page, ".dp-timeline a")  # the story's links are reached by Tab, in order
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.closest('.dp-timeline') !== null")
    _shot(page, "Operators", "story")


def _tab_to(page: Page, selector: str, limit: int = 120) -> None:
    """Press Tab until the focus is on an element matching ``selector``."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("s => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"Tab never reached {selector}")
