"""Secrets read by the commands from a file or standard input (``--<name>-file``, ``-``):
refused in one line, nothing stored, when what was read cannot be the secret."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from integrations.models import Broker, LedgerEvent
from integrations.services.staff.brokers import broker_create, broker_drop_webhook_secret_set
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


@pytest.mark.parametrize("where", ["file", "stdin"])
def test_a_byte_order_mark_before_the_webhook_secret_is_not_stored(
    broker: Broker, tmp_path, where: str
) -> None:
    # What Notepad and some editors write first; kept, every notification's signature fails.
    data = b"\xef\xbb\xbfs3cret-token\r\n"
    if where == "file":
        path = tmp_path / "secret"
        path.write_bytes(data)
        call_command(
            "brokers", "drop-webhook-secret", "4821", "--secret-file", str(path),
            stdout=io.StringIO(),
        )  # fmt: skip
    else:
        webhook_secret_from_stdin(piped(data))

    broker.refresh_from_db()
    assert broker.drop_webhook_secret == "s3cret-token"


@pytest.mark.parametrize(
    ("data", "shown"),
    [(b"s3cret\x00token\n", r"\x00"), (b"s3cret\ttoken\n", r"\x09"), (b"\x1b[31ms3cret", r"\x1b")],
)
def test_a_webhook_secret_with_a_control_character_is_refused_in_one_line(
    broker: Broker, data: bytes, shown: str
) -> None:
    with pytest.raises(CommandError) as refused:
        webhook_secret_from_stdin(piped(data))

    assert str(refused.value) == (
        f"standard input gave a secret with a control character ({shown}) in it"
    )
    assert nothing_stored(broker)


def test_an_empty_stdin_is_named_as_what_was_read(broker: Broker) -> None:
    with pytest.raises(CommandError) as refused:
        webhook_secret_from_stdin(piped(b"\n"))

    assert str(refused.value) == "standard input gave an empty secret"
    assert nothing_stored(broker)


def test_a_secret_value_with_a_control_character_is_refused(tmp_path) -> None:
    with pytest.raises(CommandError, match=r"^--drop-api-key gave a drop api key with a control"):
        call_command(
            "brokers", "add", "--broker-id", "4821", "--name", "Acme", "--mode", "test",
            "--drop-api-key", "dk_live\x07",
        )  # fmt: skip

    assert not Broker.objects.exists()


@pytest.mark.parametrize("secret", ["\ufeffs3cret", "s3cret\x00", "s3\x1b[2Jcret", "s3\x85cret"])
def test_the_service_refuses_a_webhook_secret_with_a_bom_or_control_character(
    broker: Broker, secret: str
) -> None:
    # The admin's form checks the secret with the same rule.
    with pytest.raises(ValidationError, match="printable characters"):
        broker_drop_webhook_secret_set(broker=broker, secret=secret, actor="test")

    assert nothing_stored(broker)
