"""Real-browser tests: Playwright driving Debian's chromium against pytest-django's live server.

One chromium for all of them (they are run together); each test gets a fresh context (no
cookies) and a page::

    def test_something(page: Page, live_server: LiveServer, staff_user: User) -> None:
        sign_in(page, live_server, "alice")  # log_in(...) goes through the login form
        page.get_by_role("link", name="Brokers").click()

We never download a browser: ``CHROMIUM`` is launched directly; by default Debian's
``/usr/bin/chromium-headless-shell`` where it is installed, else ``/usr/bin/chromium`` (the
Debian package that ``.ci/run`` installs). Without it the tests are skipped on
a developer machine and fail in CI. Screenshots go to ``test-artifacts/`` (also one per
failed test).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connections
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from tests.browser.staff import ARTIFACTS, make_staff

# The headless shell is the same Blink as chromium, without the desktop browser around it
# (what Playwright runs headless by its own downloads): the same pages drawn for less CPU.
_HEADLESS_SHELL = Path("/usr/bin/chromium-headless-shell")
CHROMIUM = os.environ.get("CHROMIUM") or (
    str(_HEADLESS_SHELL) if _HEADLESS_SHELL.exists() else "/usr/bin/chromium"
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/browser/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


# Package scope, not session: the sync API keeps an event loop running in this thread until
# it stops, and tests elsewhere (the job worker) call asyncio.run, which refuses to nest.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    if not Path(CHROMIUM).exists():
        message = f"no chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # Django refuses ORM calls from a thread with a running event loop; ours are ordinary
    # blocking calls made between page actions, so allow them while the driver runs.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as driver:
            yield driver
            # While that loop runs, Django keeps this thread's connections apart from the
            # ones it has without it (its connections are task-local in a running loop):
            # those the browser tests opened are closed here, or they would stay open
            # after the tests and hold the test database against its drop.
            connections.close_all()


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-US")
    context.set_default_timeout(10_000)
    yield context
    context.close()


@pytest.fixture
def page(context: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    page = context.new_page()
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
        page.screenshot(path=str(ARTIFACTS / f"failed-{name}.png"), full_page=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def staff_user(transactional_db: None) -> User:
    return make_staff("alice", superuser=True)
