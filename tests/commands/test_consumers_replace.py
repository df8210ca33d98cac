"""``consumers import --replace``: a full file makes the broker's set of a kind, within the
--max-forget guard unless --force."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from devtools.drop_simulator import work_items
from integrations.models import Broker, Consumer, ConsumerHash, DeletionRequest, LedgerEvent
from integrations.services.cycle.drop_import import drop_zip_import
from tests.builders import ConsumerFactory, WebhookIntegrationFactory, drop_zip, write_zip

pytestmark = pytest.mark.django_db


def run(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command(
        "consumers", "import", "--broker", "4821", *args, "--json", stdout=out,
        stderr=io.StringIO(),
    )  # fmt: skip
    return json.loads(out.getvalue())


def full_file(tmp_path: Path, numbers: range | list[int], name: str = "full.csv") -> str:
    path = tmp_path / name
    rows = "".join(f"C-{i},p{i}@example.com\n" for i in numbers)
    path.write_text("remote_identifier,email\n" + rows, encoding="utf-8")
    return str(path)


@pytest.fixture
def forty(broker: Broker, tmp_path: Path) -> None:
    """40 consumers of kind external_id, and one crm_id consumer no file here lists."""
    run(full_file(tmp_path, range(40), "first.csv"))
    ConsumerFactory.create(
        broker=broker,
        remote_identifier="CRM-1",
        hashes={"email": "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="},
    )
    Consumer.objects.filter(remote_identifier="CRM-1").update(remote_identifier_kind="crm_id")


def pointers() -> set[str]:
    return set(Consumer.objects.values_list("remote_identifier", flat=True))


def test_replace_forgets_the_consumers_of_the_kind_missing_from_the_file(
    broker: Broker, tmp_path: Path, forty: None
) -> None:
    # C-0 and C-1 are gone from tonight's export (5 %), C-40 is new.
    summary = run(full_file(tmp_path, range(2, 41)), "--replace")
    assert summary["consumers_forgotten"] == 2
    assert summary["consumers_created"] == 1
    assert pointers() == {f"C-{i}" for i in range(2, 41)} | {"CRM-1"}  # another kind: kept
    assert not ConsumerHash.objects.filter(consumer__remote_identifier="C-0").exists()
    (event,) = LedgerEvent.objects.filter(kind="consumers.replaced")
    assert event.data | {"source": None} == {
        "source": None,
        "remote_identifier_kinds": ["external_id"],
        "consumers_before": 40,
        "consumers_forgotten": 2,
        "hashes_removed": 2,
        "hashes_forgotten": 0,
        "max_forget": 0.05,
        "forced": False,
    }
    assert "C-0" not in json.dumps(event.data) and "p0@" not in json.dumps(event.data)
    # The same file again forgets nothing more.
    assert run(full_file(tmp_path, range(2, 41)), "--replace")["consumers_forgotten"] == 0


def test_replace_past_max_forget_is_refused_and_writes_nothing(
    broker: Broker, tmp_path: Path, forty: None
) -> None:
    before = pointers()
    path = full_file(tmp_path, [*range(3, 40), 99])  # 3 of 40 missing: 7.5 %
    with pytest.raises(CommandError, match=r"would forget 3 of 40 consumers \(7\.5%\)") as raised:
        run(path, "--replace")
    assert "nothing was imported" in str(raised.value)
    assert pointers() == before  # C-99 not added either
    assert not LedgerEvent.objects.filter(kind="consumers.replaced").exists()

    assert run(path, "--replace", "--max-forget", "10")["consumers_forgotten"] == 3


@pytest.mark.parametrize("percent", ["29", "57", "58"])
def test_replace_may_forget_exactly_max_forget(
    broker: Broker, tmp_path: Path, percent: str
) -> None:
    """The guard refuses more than --max-forget, not as much: exactly 29 of 100 at 29 %
    passes (29 / 100 * 100 is 28.999999999999996 in floating point)."""
    run(full_file(tmp_path, range(100), "first.csv"))
    summary = run(
        full_file(tmp_path, range(int(percent), 100)), "--replace", "--max-forget", percent
    )
    assert summary["consumers_forgotten"] == int(percent)
    assert LedgerEvent.objects.get(kind="consumers.replaced").data["forced"] is False


def test_force_forgets_past_the_guard_and_says_so(
    broker: Broker, tmp_path: Path, forty: None
) -> None:
    summary = run(full_file(tmp_path, range(30)), "--replace", "--force")
    assert summary["consumers_forgotten"] == 10
    assert LedgerEvent.objects.get(kind="consumers.replaced").data["forced"] is True


def test_replace_refuses_a_file_with_a_bad_row(broker: Broker, tmp_path: Path, forty: None) -> None:
    path = tmp_path / "bad.csv"
    rows = "".join(f"C-{i},p{i}@example.com\n" for i in range(40))
    path.write_text("remote_identifier,email\n" + rows + ",x@example.com\n", encoding="utf-8")
    with pytest.raises(CommandError, match="1 of 41 rows rejected; --replace: nothing"):
        run(str(path), "--replace")
    assert len(pointers()) == 41


def test_max_forget_must_be_a_percentage(broker: Broker, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="not a percentage"):
        run(full_file(tmp_path, range(2)), "--replace", "--max-forget", "lots")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (["--force"], "--force"),
        (["--max-forget", "0"], "--max-forget"),
        (["--max-forget", "50", "--force"], "--force and --max-forget"),
    ],
)
def test_the_guards_options_without_replace_are_refused_not_ignored(
    broker: Broker, tmp_path: Path, given: list[str], named: str
) -> None:
    """Without --replace nothing is forgotten: taken silently, they would have the operator
    believe a limit held, or was lifted."""
    with pytest.raises(CommandError, match=rf"^{named} only go with --replace$"):
        run(full_file(tmp_path, range(2)), *given)
    assert not Consumer.objects.exists()
    assert not LedgerEvent.objects.filter(kind__startswith="consumers.").exists()


# --- A listed consumer keeps only the hashes the source gives it ---------------------------
# Hashes from the DROP simulator: 40 emails, 40 phones, and one phone more (Y).
EMAILS = list(work_items(40))
PHONES = list(work_items(41, start=40))


def hashed_file(
    tmp_path: Path, phones: dict[int, str], emails: range = range(40), name: str = "set.csv"
) -> str:
    """C-i with email EMAILS[i] for i in ``emails``, and the phone ``phones`` gives it."""
    rows = [f"C-{i},email,{EMAILS[i][1]}\n" for i in emails]
    rows += [f"C-{i},phone,{phone}\n" for i, phone in phones.items()]
    path = tmp_path / name
    path.write_text("remote_identifier,hash_type,hash\n" + "".join(rows), encoding="utf-8")
    return str(path)


def hashes_of(remote_identifier: str, hash_type: str) -> set[bytes]:
    return {
        bytes(h)
        for h in ConsumerHash.objects.filter(
            consumer__remote_identifier=remote_identifier, hash_type=hash_type
        ).values_list("hash", flat=True)
    }


def raw(hash_: str) -> bytes:
    return base64.b64decode(hash_)


@pytest.fixture
def phones_registered(broker: Broker, tmp_path: Path) -> dict[int, str]:
    """C-0 to C-39, each with an email and a phone."""
    phones = {i: PHONES[i][1] for i in range(40)}
    run(hashed_file(tmp_path, phones, name="first.csv"), "--hashed")
    return phones


def test_replace_forgets_a_listed_consumers_phone_the_source_no_longer_gives(
    broker: Broker, tmp_path: Path, phones_registered: dict[int, str]
) -> None:
    """C-1's phone X is now Y: a recycled X must not match C-1, and delete its data for
    someone else's request."""
    x, y = PHONES[1], PHONES[40]
    summary = run(hashed_file(tmp_path, {**phones_registered, 1: y[1]}), "--hashed", "--replace")
    assert hashes_of("C-1", "phone") == {raw(y[1])}
    assert (summary["hashes_forgotten"], summary["hashes_added"]) == (1, 1)
    assert summary["consumers_forgotten"] == 0
    assert hashes_of("C-1", "email") == {raw(EMAILS[1][1])}
    assert hashes_of("C-2", "phone") == {raw(PHONES[2][1])}
    event = LedgerEvent.objects.get(kind="consumers.replaced")
    assert (event.data["hashes_forgotten"], event.data["consumers_forgotten"]) == (1, 0)
    assert event.data["forced"] is False
    assert x[1] not in json.dumps(event.data)

    # A DROP list naming X matches nobody now; Y matches C-1.
    WebhookIntegrationFactory.create(broker=broker)
    package = drop_zip(broker, {"Phone": [x, y]})
    cycle = drop_zip_import(broker=broker, path=write_zip(tmp_path, package), actor="test").cycle
    assert cycle.matched == 1
    assert {r.identifier_hash for r in DeletionRequest.objects.all()} == {y[1]}

    # The same file again forgets nothing more.
    again = run(hashed_file(tmp_path, {**phones_registered, 1: y[1]}), "--hashed", "--replace")
    assert (again["hashes_forgotten"], again["hashes_added"]) == (0, 0)


def test_replace_without_a_phone_column_keeps_the_phones(
    broker: Broker, tmp_path: Path, phones_registered: dict[int, str]
) -> None:
    """A source that carries no phone says nothing of phones; of the emails it carries, each
    consumer keeps only the one it gives (a file of clear identifiers)."""
    path = tmp_path / "emails.csv"
    rows = "".join(f"C-{i},e{i}@example.com\n" for i in range(40))
    path.write_text("remote_identifier,email\n" + rows, encoding="utf-8")
    summary = run(str(path), "--replace", "--force")  # every email changes: 100 %
    assert summary["hashes_forgotten"] == 40
    for i in (0, 3, 39):
        assert hashes_of(f"C-{i}", "phone") == {raw(PHONES[i][1])}
        (email,) = hashes_of(f"C-{i}", "email")
        assert email != raw(EMAILS[i][1])
    assert ConsumerHash.objects.filter(hash_type="phone").count() == 40
    assert LedgerEvent.objects.get(kind="consumers.replaced").data["forced"] is True


def test_replace_forgetting_past_max_forget_of_the_hashes_is_refused_unless_forced(
    broker: Broker, tmp_path: Path, phones_registered: dict[int, str]
) -> None:
    """5 phones of 40 consumers changed: 5 of their 80 email and phone hashes (6.25 %)."""
    changed = {i: PHONES[40][1] if i == 0 else EMAILS[i][1] for i in range(5)}
    path = hashed_file(tmp_path, {**phones_registered, **changed})
    before = set(ConsumerHash.objects.values_list("consumer_id", "hash_type", "hash"))
    with pytest.raises(
        CommandError,
        match=r"would forget 5 of 80 hashes of the consumers it lists \(6\.2%\), more than "
        r"--max-forget 5\.0%; nothing was imported",
    ):
        run(path, "--hashed", "--replace")
    after = set(ConsumerHash.objects.values_list("consumer_id", "hash_type", "hash"))
    assert after == before
    assert not LedgerEvent.objects.filter(kind="consumers.replaced").exists()

    summary = run(path, "--hashed", "--replace", "--force")
    assert summary["hashes_forgotten"] == 5
    assert hashes_of("C-0", "phone") == {raw(PHONES[40][1])}
    event = LedgerEvent.objects.get(kind="consumers.replaced")
    assert (event.data["hashes_forgotten"], event.data["forced"]) == (5, True)


def test_the_summary_line_counts_the_hashes_forgotten(
    broker: Broker, tmp_path: Path, phones_registered: dict[int, str]
) -> None:
    out = io.StringIO()
    path = hashed_file(tmp_path, {**phones_registered, 1: PHONES[40][1]})
    call_command(
        "consumers", "import", "--broker", "4821", "--hashed", "--replace", path,
        stdout=out, stderr=io.StringIO(),
    )  # fmt: skip
    assert ", 1 hashes forgotten (--replace);" in out.getvalue()
