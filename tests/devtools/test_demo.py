"""``make demo`` keeps telling the whole cycle, and ends serving the admin at one consumer's
story (the ``demo`` fixture runs it as make does, on its own database)."""

from __future__ import annotations

import re

import pytest

from integrations.evidence.components import TITLES
from tests.served_demo import ServedDemo


@pytest.mark.slow
def test_the_demo_narrates_a_whole_cycle_and_the_ledger_verifies(demo: ServedDemo) -> None:
    story = demo.story
    assert "the broker verified 24 of 24 signatures" in story
    assert "DROP received" in story
    # DROP's own notification arrives signed and starts the pull, which imports cycle 2.
    assert "DROP POSTed a signed download.ready notification to " in story
    assert "/api/v1/drop/notifications/4821: HTTP 204" in story
    assert "the pull it started (job integrations.tasks.pull_broker): imported " in story
    assert "An amendment goes to DROP" in story
    # A service provider gets a signed directive and acknowledges it with its own key.
    assert "acknowledged with its own key (scope directive_ack): HTTP 200" in story
    assert "Mailhouse  match" in story and "acknowledged " in story
    assert "26 round(s): 26 deletion request(s)" in story
    assert "ledgered as recurring; the statuses DROP holds did not change" in story
    # A deleted consumer registered again from a supplier's file: a reappearance, with its
    # source, so the broker finds the supplier that sells deleted people again.
    assert "Suppression: a deleted consumer comes back in a supplier's file" in story
    assert "finds the supplier that sells deleted people again" in story
    source = r"file:supplier-batch\.csv \(SHA-256 [0-9a-f]{12}…\)"
    assert re.search(rf"reappearance recorded: CRM-RESOLD-1 from {source}", story)
    assert re.search(r"\d{4}-\d\d +1 +1  file:supplier-batch\.csv \(SHA-256 [0-9a-f]{64}\)", story)
    # A canary round: the test consumer deleted at every target, observed, not attested.
    assert re.search(r"canary round \d+ at .+: CRM-CANARY-1 deleted", story)
    assert "the round passed." in story
    assert "An auditor opens the evidence pack's actioning component" in story
    assert "chain verified" in story
    # The chain anchored outside, and the pack an auditor checks offline against the public
    # key and the time-stamping authority's certificate.
    assert re.search(r"integrations\.tasks\.anchor_ledger\): chain position \d+ anchored", story)
    auditor = story.split("The auditor: an evidence pack, checked offline", 1)[1]
    assert re.search(r"timestamps: \d+ tokens cover the chain hashes at positions", auditor)
    assert "each signature chains to the given certificate" in auditor
    assert "Evidence pack verified." in auditor
    # All nine components pass, each with what the auditor does with it, and one story.
    for title in TITLES.values():
        assert f"  {title}: pass. " in auditor, title
    assert re.search(r"The sampled story \(sample/[\w-]+\.html\)", auditor)
    # It ends pointing at one consumer's story page, then serves it.
    last = story.rsplit("Where to look", 1)[1]
    assert f"Log in          {demo.url}/admin/  user demo, password {demo.password}" in last
    assert re.search(
        rf"Story +{re.escape(demo.url)}/admin/integrations/workitem/\d+/change/ +\(CRM-LATE-1",
        last,
    )
    assert re.search(r"\nDone in \d+\.\d s\.\n", last)
    assert last.rstrip().endswith(f"Serving {demo.url}/admin/ with a worker; Ctrl-C to stop.")
