"""An optional ``--broker`` left out means every broker; given empty (``--broker ""``, a shell
variable that was never set) it names none, and is refused like any broker id that is not
registered, never read as "every broker"."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.models import Broker, LedgerEvent

pytestmark = pytest.mark.django_db

EMPTY = r"^the broker id is empty: give the broker's 4-digit DROP id$"


@pytest.mark.parametrize(
    "args",
    [
        ["ledger", "export"],
        ["outcomes", "export"],
        ["drop", "doctor"],
        ["providers", "list"],
        ["saas", "list"],
        ["integrations", "list"],
        ["drop", "notice", "--sent", "2026-01-05", "--reference", "X"],  # a required --broker
    ],
)
def test_an_empty_broker_id_is_refused_not_read_as_every_broker(
    broker: Broker, args: list[str]
) -> None:
    out = io.StringIO()
    with pytest.raises(CommandError, match=EMPTY):
        call_command(*args, "--broker", "", stdout=out, stderr=io.StringIO())
    assert out.getvalue() == ""
    assert not LedgerEvent.objects.filter(kind__endswith="exported").exists()
