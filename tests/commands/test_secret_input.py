"""Secrets read by the commands from a file or standard input (``--<name>-file``, ``-``):
refused in one line, nothing stored, when what was read cannot be the secret."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.models import Broker, LedgerEvent
from integrations.services.staff.brokers import broker_create
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db


def piped(data: bytes) -> io.TextIOWrapper:
    """Standard input as a process gets it under a UTF-8 locale: bytes that are not UTF-8
    read as surrogates rather than failing the read."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")


def webhook_secret_from_stdin(stdin: io.TextIOBase) -> None:
    call_command("brokers", "drop-webhook-secret", "4821", "-", stdin=stdin, stdout=io.StringIO())


def nothing_stored(broker: Broker) -> bool:
    broker.refresh_from_db()
    return (
        not broker.drop_webhook_secret
        and not LedgerEvent.objects.filter(kind="broker.updated").exists()
    )


@pytest.mark.parametrize(
    "stdin",
    [piped(b"\xff\xfesecret\n"), io.StringIO("\udcff\udcfesecret\n")],
    ids=["bytes", "text"],
)
def test_a_webhook_secret_on_stdin_that_is_not_utf8_is_refused(
    broker: Broker, stdin: io.TextIOBase
) -> None:
    with pytest.raises(CommandError, match=r"^cannot read standard input: not UTF-8 text$"):
        webhook_secret_from_stdin(stdin)

    assert nothing_stored(broker)


def test_a_utf8_webhook_secret_on_stdin_is_stored(broker: Broker) -> None:
    webhook_secret_from_stdin(piped("s3cret-é".encode() + b"\n"))

    broker.refresh_from_db()
    assert broker.drop_webhook_secret == "s3cret-é"


@pytest.mark.django_db(transaction=True)
def test_bytes_that_are_not_utf8_on_a_real_stdin_are_one_line(settings) -> None:
    broker_create(broker_id="4821", name="Acme Data", mode="test", actor="test")

    result = subprocess.run(
        [sys.executable, "manage.py", "brokers", "drop-webhook-secret", "4821", "-"],
        input=b"\xff\xfesecret\n",
        capture_output=True,
        env=subprocess_env(),
        cwd=settings.BASE_DIR,
        check=False,
    )

    assert result.returncode != 0
    assert result.stderr.decode().strip().splitlines() == [
        "CommandError: cannot read standard input: not UTF-8 text"
    ]
    assert nothing_stored(Broker.objects.get())


def test_a_secret_file_that_is_not_utf8_is_refused(broker: Broker, tmp_path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"\xff\xfesecret\n")

    with pytest.raises(CommandError, match="not UTF-8 text"):
        call_command("brokers", "drop-webhook-secret", "4821", "--secret-file", str(path))

    assert nothing_stored(broker)
