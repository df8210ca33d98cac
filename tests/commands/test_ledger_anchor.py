"""``ledger anchor`` and ``ledger verify --tsa-cert``: the chain timestamped at once by the
authority, and every kept token checked against its certificate."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from devtools.tsa_simulator import TsaSimulator
from integrations.ledger_kinds import LedgerKind
from integrations.models import LedgerAnchor, LedgerEvent
from integrations.services.ledger import ledger_event_append
from tests.builders import anchor_moved_to_head
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def events() -> None:
    with transaction.atomic():
        for i in range(3):
            ledger_event_append(kind=LedgerKind.BROKER_UPDATED, broker_id="4821", data={"i": i})


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger", *args, stdout=out)
    return out.getvalue()


def test_ledger_anchor_timestamps_the_head_at_once(tsa: TsaSimulator) -> None:
    said = run("anchor")
    anchor = LedgerAnchor.objects.get()
    assert re.fullmatch(
        rf"Anchored position {anchor.position} \(chain hash {anchor.chain_hash}\) with "
        rf"{re.escape(tsa.url)}: token SHA-256 {anchor.token_sha256}, timestamped .+\.\n",
        said,
    )
    assert tsa.queries == 1


def test_ledger_anchor_without_an_authority_is_one_clear_line(settings: Any) -> None:
    settings.DROPPORTAL_TSA_URL = ""
    with pytest.raises(CommandError) as refused:
        run("anchor")
    assert str(refused.value) == (
        "DROPPORTAL_TSA_URL is not set: no time-stamping authority to anchor the ledger with"
    )


# Transactional: the command's start commits the encryption canary (with the suite's keys) in
# the test database, which the flush after this test empties; a later test setting other
# keys would otherwise meet it.
@pytest.mark.django_db(transaction=True)
def test_ledger_anchor_without_an_authority_exits_1_with_that_line() -> None:
    """As an operator runs it: the one line on stderr, nothing else, exit 1."""
    ran = subprocess.run(
        [sys.executable, "manage.py", "ledger", "anchor"],
        cwd=ROOT,
        env=subprocess_env(DROPPORTAL_TSA_URL=""),
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 1
    assert ran.stderr == (
        "CommandError: DROPPORTAL_TSA_URL is not set: no time-stamping authority to anchor the "
        "ledger with\n"
    )
    assert ran.stdout == ""


def test_ledger_anchor_names_the_authoritys_failure(tsa: TsaSimulator) -> None:
    tsa.refuse_next(502)
    with pytest.raises(CommandError, match=r"^the time-stamping authority at .+: HTTP 502$"):
        run("anchor")


@pytest.mark.parametrize(
    ("secret_at", "problem"),
    [
        ("?apikey=S3CR3T", "HTTP 502"),  # an authority that takes an API key in its query
        ("@", "invalid URL: a user name or password in the URL is not allowed"),
    ],
)
def test_a_failed_anchor_keeps_the_authoritys_credentials_out_of_its_line(
    tsa: TsaSimulator, settings: Any, secret_at: str, problem: str
) -> None:
    if secret_at == "@":
        settings.DROPPORTAL_TSA_URL = tsa.url.replace("://", "://ops:S3CR3T@")
    else:
        settings.DROPPORTAL_TSA_URL = tsa.url + secret_at
    tsa.refuse_next(502)
    with pytest.raises(CommandError) as refused:
        run("anchor")
    # The command's one line, and the job's logged retries (the same exception).
    assert str(refused.value) == f"the time-stamping authority at {tsa.url}: {problem}"
    failed = LedgerEvent.objects.get(kind="ledger.anchor_failed")
    assert failed.data["tsa_url"] == tsa.url


def test_ledger_verify_checks_every_token_against_the_certificate(
    tsa: TsaSimulator, tmp_path: Path
) -> None:
    run("anchor")
    run("anchor")
    ca = tmp_path / "tsa-ca.pem"
    ca.write_bytes(tsa.ca_pem)
    said = run("verify", "--tsa-cert", str(ca))
    assert "Anchors: 2 time-stamp tokens cover the chain hashes at their positions; " in said
    assert "signatures chain to the given certificate." in said
    unsigned = run("verify")
    assert "signatures not checked against an authority (pass --tsa-cert FILE)" in unsigned
    report = json.loads(run("verify", "--json", "--tsa-cert", str(ca)))
    assert report["ok"] and report["anchors_checked"] == 2
    assert report["anchors_signature_checked"] and report["anchor_problems"] == []


def test_ledger_verify_names_a_token_of_another_chain_head(
    tsa: TsaSimulator, tmp_path: Path
) -> None:
    run("anchor")
    honest = LedgerAnchor.objects.get()
    forged = anchor_moved_to_head(honest)
    ca = tmp_path / "tsa-ca.pem"
    ca.write_bytes(tsa.ca_pem)
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("ledger", "verify", "--tsa-cert", str(ca), stdout=io.StringIO(), stderr=err)
    assert exited.value.code == 1
    assert err.getvalue() == (
        f"Ledger anchor does not hold: the token of position {forged.position} (anchor "
        f"{forged.id}): it covers another chain head, not {forged.chain_hash}.\n"
    )


def test_ledger_verify_fails_a_token_under_another_authority(
    tsa: TsaSimulator, tmp_path: Path
) -> None:
    run("anchor")
    wrong = tmp_path / "other-ca.pem"
    with TsaSimulator(name="another TSA") as other:
        wrong.write_bytes(other.ca_pem)
    err = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("ledger", "verify", "--tsa-cert", str(wrong), stdout=io.StringIO(), stderr=err)
    assert "does not chain to the given certificate" in err.getvalue()


def test_ledger_verify_with_an_unreadable_certificate_is_one_line(tmp_path: Path) -> None:
    not_a_cert = tmp_path / "ca.pem"
    not_a_cert.write_text("hello")
    with pytest.raises(CommandError, match=r"ca\.pem: not a certificate"):
        run("verify", "--tsa-cert", str(not_a_cert))
    with pytest.raises(CommandError, match="cannot read"):
        run("verify", "--tsa-cert", str(tmp_path / "missing.pem"))
