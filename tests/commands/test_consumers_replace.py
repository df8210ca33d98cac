"""``consumers import --replace``: a full file makes the broker's set of a kind, within the
--max-forget guard unless --force."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.models import Broker, Consumer, ConsumerHash, LedgerEvent
from tests.builders import ConsumerFactory

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
