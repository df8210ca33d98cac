"""What an auditor gets from ``make demo``'s broker: a pack that verifies with no database,
and the year's DROP figures, counted by hand from the demo's story (devtools/demo.py).

The demo's broker 4821 (two cycles, in one DROP year but from 1 January to about 9 February,
when the first falls in the year before and the years' figures are added up):

- Cycle 1, downloaded 40 days ago (midnight in DROP's calendar): Email 24 matches + 150
  unknown hashes, Phone 50 unknown: 224 work items. Outcomes: 14 deleted + 2 failed then
  deleted, 4 not found, 2 opted out, 2 exempt; all reported. Then one unknown Email hash
  matches a consumer registered late: deleted, amended from 5 to 3.
- Cycle 2, pulled today: Email 14 matches + 90 unknown, Phone 30 unknown: 134 work items,
  nothing reported to DROP yet.

Received 358 (Email 174 + 104 = 278, Phone 50 + 30 = 80). Matched 24 + 1 + 14 = 39 (all
Email). Complied 16 + 1 + 2 = 19, denied 2 (no basis given: a deletion's exempt carries
none), not found 4 + (150 - 1) + 50 = 203 (Email 153, Phone 50), open: cycle 2's 134
(Email 104, Phone 30). Every reported status was reported during the demo's run, 40 days
and the time of day after the download: the median and the mean are both that.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.core.management import call_command

from devtools.databases import demo_database_name
from integrations.drop.calendar import drop_date, drop_timezone
from tests.conftest import database_url
from tests.served_demo import ROOT, ServedDemo, demo_env

EMAIL = {"received": 278, "matched": 39, "complied": 19, "denied": 2, "not_found": 153}
PHONE = {"received": 80, "matched": 0, "complied": 0, "denied": 0, "not_found": 50}
TOTAL = {"received": 358, "matched": 39, "complied": 19, "denied": 2, "not_found": 203}


def _demo_database_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        pytest.skip("SKIPPED LOUDLY: needs DATABASE_URL (the demo's database sits next to it)")
    parts = urlsplit(database_url())  # the demo works beside the test database (demo_env)
    return urlunsplit(parts._replace(path=demo_database_name(parts.path)))


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


@pytest.mark.slow
def test_the_demo_broker_gets_a_verifiable_pack_and_its_figures(
    tmp_path: Path, demo: ServedDemo
) -> None:
    demo_url = _demo_database_url()
    started, ended = demo.started, demo.served  # its statuses were reported in between
    env = {**demo_env(), "DATABASE_URL": demo_url}
    # The years the figures and the pack count in are DROP's: for the first hours of a year
    # in UTC (until midnight in California), UTC's year is the next one and holds no cycle.
    # Cycle 1 was downloaded 40 days back: from 1 January to about 9 February the story
    # spans two DROP years, and each year's figures are counted and added up.
    zone = drop_timezone()
    downloaded = dt.datetime.combine(
        started.astimezone(zone).date() - dt.timedelta(days=40), dt.time(), tzinfo=zone
    )
    years = sorted({downloaded.year, drop_date(started).year})
    yearly = []
    for year in years:
        metrics = manage(
            "drop", "metrics", "--broker", "4821", "--year", str(year), "--format", "json",
            env=env,
        )  # fmt: skip
        assert metrics.returncode == 0, metrics.stderr
        yearly.append(json.loads(metrics.stdout))
    earliest = (started - downloaded) / dt.timedelta(days=1) - 0.005
    latest = (ended - downloaded) / dt.timedelta(days=1) + 0.005
    rows: dict[str, list[dict[str, Any]]] = {"Email": [], "Phone": [], "total": []}
    for figures in yearly:
        for row in figures["by_list_type"]:
            assert row["list_type"] in rows, row
            rows[row["list_type"]].append(row)
        rows["total"].append(figures["total"])
    assert rows["Email"] and rows["Phone"]
    for name, expected, still_open in (
        ("Email", EMAIL, 104),
        ("Phone", PHONE, 30),
        ("total", TOTAL, 134),
    ):
        assert {key: sum(row[key] for row in rows[name]) for key in expected} == expected
        assert sum(row["open"] for row in rows[name]) == still_open
        assert sum(row["removed"] for row in rows[name]) == 0
        # Every reported status was reported during the demo's run; a year whose items
        # have none yet has no median (only when the story spans two years).
        timed = [row for row in rows[name] if row["median_days"] is not None]
        assert len(timed) == len(rows[name]) or len(years) == 2
        assert timed
        for row in timed:
            assert earliest <= row["median_days"] <= latest
            assert earliest <= row["mean_days"] <= latest
    exemption_bases: dict[str, int] = {}
    for figures in yearly:
        for basis, count in figures["exemption_bases"].items():
            exemption_bases[basis] = exemption_bases.get(basis, 0) + count
    assert exemption_bases == {"(not given)": 2}

    pack = tmp_path / "demo-evidence.zip"
    exported = manage(
        "evidence", "export", "--broker", "4821", "--since", f"{years[0]}-01-01",
        "--until", f"{years[-1]}-12-31", "--sample", "1", "--seed", "demo", "--out", str(pack),
        env=env,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    # The key the demo and its commands sign with is this process's (``subprocess_env``):
    # read here, without starting Django once more.
    public_key = io.StringIO()
    call_command("evidence", "public-key", stdout=public_key)
    (tmp_path / "evidence.pem").write_text(public_key.getvalue())

    # The auditor's machine: no DATABASE_URL, nothing to connect to.
    offline = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    verified = manage(
        "evidence", "verify", str(pack), "--public-key", str(tmp_path / "evidence.pem"),
        "--json", env=offline,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["key_trusted"]
    assert report["sample"]["drawn"] == 1 and report["sample"]["seed"] == "demo"
    # The components this test's demo exercises (canaries are the demo's own steps): the
    # demo records the lists selected before its first cycle, and every match goes through
    # the services, so the rematch explains each difference.
    ours = ("drop_access", "standardization", "hashing", "status_reporting", "suppression_list")
    for key in ("list_selection", *ours, "matching", "service_providers"):
        assert report["components"][key]["result"] == "pass", report["components"][key]
    # 39 requests of the cycles and the late match, 26 of the recurring round, 1 of the
    # reappearance.
    assert any(check.startswith("outcomes: 66 rows") for check in report["checks"]), report[
        "checks"
    ]
