"""``make demo`` keeps telling the whole cycle: run it as make does, on its own database."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import database_url, subprocess_env

# Every demo run recreates the database <its DATABASE_URL's>_demo: each test points it at
# its worker's test database (demo_env), so runs on several workers never share one.

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def demo_env() -> dict[str, str]:
    """``make demo``'s environment with the test database as its DATABASE_URL: the demo then
    works in <test database>_demo, this worker's own, never in the test database itself."""
    return subprocess_env(DATABASE_URL=database_url(), PYTHONUNBUFFERED="1")


def test_the_demo_narrates_a_whole_cycle_and_the_ledger_verifies(django_db_setup: None) -> None:
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "devtools.demo", "--no-serve", "--port", str(free_port())],
        cwd=ROOT,
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    story = result.stdout
    assert "the broker verified 24 of 24 signatures" in story
    assert "DROP received" in story
    # DROP's own notification arrives signed and starts the pull, which imports cycle 2.
    assert "DROP POSTed a signed download.ready notification to " in story
    assert "/api/v1/drop/notifications/4821: HTTP 204" in story
    assert "the pull it started (job integrations.tasks.pull_broker): imported " in story
    assert "An amendment goes to DROP" in story
    assert "chain verified" in story
    assert "Where to look" in story
    # It ends pointing at one consumer's story page.
    last = story.rsplit("Where to look", 1)[1]
    assert re.search(
        r"CRM-LATE-1's story: http://127\.0\.0\.1:\d+/admin/integrations/workitem/\d+/change/", last
    )
    seconds = float(story.rsplit("Done in ", 1)[1].split(" s.")[0])
    assert seconds < 60
