"""``make demo``, run once per test process and left serving: the tests of its story, of the
figures an auditor gets from it and of its pages in a browser all read the same run.

The demo recreates the database <its DATABASE_URL's>_demo: it is pointed at the worker's test
database (``demo_env``), so runs on several workers never share one.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import database_url, subprocess_env
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ServedDemo:
    url: str  # where it serves the admin
    password: str  # of its logins (one per role, and `demo`)
    story: str  # what it told until it served
    started: dt.datetime  # when it was started, and when it served (UTC): its story ran
    served: dt.datetime  # between the two


def demo_env() -> dict[str, str]:
    """``make demo``'s environment with the test database as its DATABASE_URL: the demo then
    works in <test database>_demo, this worker's own, never in the test database itself."""
    return subprocess_env(DATABASE_URL=database_url(), PYTHONUNBUFFERED="1")


@contextmanager
def served_demo(template: str | None = None) -> Iterator[ServedDemo]:
    """Run ``python -m devtools.demo`` as ``make demo`` does, until it serves; Ctrl-C after.
    With ``template`` its database is a copy of that migrated one (``--template``)."""
    port = free_port()
    copy = ["--template", template] if template else []
    started = dt.datetime.now(dt.UTC)
    process = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "devtools.demo", "--port", str(port), *copy],
        cwd=ROOT,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    told, password = [], ""
    for line in process.stdout:  # the story, until it serves (or ends, having failed)
        told.append(line)
        found = re.search(r"staff login demo / (\S+)", line)
        password = found.group(1) if found else password
        if line.startswith("Serving "):
            break
    try:
        assert password and told[-1].startswith("Serving "), "".join(told[-40:])
        yield ServedDemo(
            url=f"http://127.0.0.1:{port}",
            password=password,
            story="".join(told),
            started=started,
            served=dt.datetime.now(dt.UTC),
        )
    finally:
        process.send_signal(signal.SIGINT)  # the demo stops on Ctrl-C
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
