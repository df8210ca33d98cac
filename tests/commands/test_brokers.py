"""``brokers add``: validation, duplicates, ledger events, and one-line errors."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys

import pytest
from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection

from integrations.management.commands import brokers as brokers_command
from integrations.models import Broker, LedgerEvent
from tests.conftest import subprocess_env

pytestmark = pytest.mark.django_db


def add(broker_id: str, *extra: str) -> None:
    call_command(
        "brokers", "add", "--broker-id", broker_id, "--name", "Acme", "--mode", "test", *extra
    )


def test_add_registers_the_broker_and_writes_an_event(capsys) -> None:
    add("4821", "--drop-api-key", "drop-secret-key")
    broker = Broker.objects.get(broker_id="4821")
    assert broker.drop_api_key == "drop-secret-key"
    event = LedgerEvent.objects.get(kind="broker.created")
    assert event.broker_id == "4821"
    assert event.actor.startswith("cli")
    assert "drop-secret-key" not in str(event.data)
    assert "Registered broker 4821" in capsys.readouterr().out


def test_add_can_turn_approve_uploads_on(capsys) -> None:
    add("4821", "--approve-uploads", "--json")
    add("1234")

    assert Broker.objects.get(broker_id="4821").approve_uploads is True
    assert Broker.objects.get(broker_id="1234").approve_uploads is False
    assert '"approve_uploads": true' in capsys.readouterr().out
    created = LedgerEvent.objects.get(kind="broker.created", broker_id="4821")
    assert created.data["approve_uploads"] is True


def test_drop_api_key_is_encrypted_at_rest() -> None:
    add("4821", "--drop-api-key", "drop-secret-key")
    with connection.cursor() as cursor:
        cursor.execute("SELECT drop_api_key FROM integrations_broker")
        (stored,) = cursor.fetchone()
    assert "drop-secret-key" not in stored
    assert stored.startswith("gAAAA")  # a Fernet token


@pytest.mark.parametrize("bad_id", ["482", "48210", "48a1", "٤٨٢١", "4821\n"])
def test_broker_id_must_be_four_digits(bad_id: str) -> None:
    with pytest.raises(CommandError, match="exactly four digits"):
        add(bad_id)
    assert not Broker.objects.exists()
    assert not LedgerEvent.objects.exists()


def test_second_broker_with_the_same_id_is_refused() -> None:
    add("4821")
    with pytest.raises(CommandError, match="already exists"):
        add("4821")
    assert Broker.objects.count() == 1
    assert LedgerEvent.objects.count() == 1


def test_database_refuses_a_bad_id_too() -> None:
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        Broker.objects.create(broker_id="12a4", name="x", mode="test")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        # Pasted with its trailing space: DROP's client would refuse it at every call.
        (["--drop-api-key", "dk_live_4821 "], "drop_api_key: DROP API key must be non-empty"),
        (["--drop-base-url", "http://drop.acme.test"], "drop_base_url: DROP base URL must use"),
        (["--drop-base-url", "https://drop.acme.test/?v=2"], "must not carry a query"),
        # Its paths are appended: after an empty "?" they would be the query itself.
        (["--drop-base-url", "https://drop.acme.test/drop?"], "must not carry a query"),
        (["--drop-base-url", "https://drop.acme.test/drop;v=2"], "; parameters"),
    ],
)
def test_a_drop_key_or_base_url_the_drop_client_refuses_is_refused_when_added(
    given: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=re.escape(message)) as refused:
        add("4821", *given)
    assert "dk_live_4821" not in str(refused.value)  # the key is never echoed
    assert not Broker.objects.exists()
    assert not LedgerEvent.objects.exists()


ONE_LINE_ERRORS = [
    ["brokers", "add", "--broker-id", "4821", "--name", "A", "--mode", "test", "--bogus"],
    ["brokers", "add", "--broker-id", "4821", "--name", "A", "--mode", "staging"],
    ["brokers", "add", "--broker-id", "482", "--name", "A", "--mode", "test"],
    ["brokers"],
]


@pytest.mark.parametrize("argv", ONE_LINE_ERRORS)
# Transactional: the command line's end closes the connections, and its start writes the
# encryption canary, which only a flush takes away again.
@pytest.mark.django_db(transaction=True)
def test_errors_are_one_line_on_stderr_with_non_zero_exit(
    argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # What manage.py runs once Django is set up (as it is here): the command from its argv.
    caplog.set_level(logging.INFO)
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(["manage.py", *argv]).fetch_command(argv[0]).run_from_argv(
            ["manage.py", *argv]
        )
    captured = capsys.readouterr()
    assert exited.value.code != 0
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    # Nothing logged either: a process's log lines go to the same stderr.
    assert not caplog.records, caplog.text


@pytest.mark.django_db(transaction=True)
def test_an_error_is_one_line_on_the_stderr_of_a_real_process(settings) -> None:
    # Nothing else of a process's start (its settings, checks, warnings) writes there.
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *ONE_LINE_ERRORS[2]],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=settings.BASE_DIR,
        check=False,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("raised", "said", "code"),
    [
        (
            OperationalError(
                'connection failed: connection to server at "127.0.0.1", port 5432 failed:'
                '\n    FATAL:  database "gone" does not exist\n'
            ),
            'database: connection failed: connection to server at "127.0.0.1", port 5432 '
            'failed: FATAL: database "gone" does not exist',
            1,
        ),
        (KeyboardInterrupt(), "interrupted", 130),
    ],
    ids=["database", "ctrl-c"],
)
def test_a_database_error_or_ctrl_c_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, raised: BaseException, said: str, code: int
) -> None:
    def fails(self: object, **options: object) -> None:
        raise raised

    monkeypatch.setattr(brokers_command.Command, "handle_list", fails)

    with pytest.raises(CommandError) as error:
        call_command("brokers", "list")

    assert (str(error.value), error.value.returncode) == (said, code)


def test_the_drop_api_key_can_come_from_a_file(tmp_path) -> None:
    key_file = tmp_path / "drop.key"
    key_file.write_text("drop-secret-key\n")

    add("4821", "--drop-api-key-file", str(key_file))

    assert Broker.objects.get(broker_id="4821").drop_api_key == "drop-secret-key"


def test_the_drop_api_key_can_come_from_standard_input() -> None:
    call_command(
        "brokers", "add", "--broker-id", "4821", "--name", "Acme", "--mode", "test",
        "--drop-api-key-file", "-", stdin=io.StringIO("drop-secret-key\n"),
    )  # fmt: skip

    assert Broker.objects.get(broker_id="4821").drop_api_key == "drop-secret-key"


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "cannot read --drop-api-key-file"),
        ("", "gave an empty drop api key"),
        ("one\ntwo\n", "on one line"),
    ],
)
def test_an_unusable_key_file_is_one_clear_error_and_writes_nothing(
    tmp_path, content: str | None, error: str
) -> None:
    key_file = tmp_path / "drop.key"
    if content is not None:
        key_file.write_text(content)

    with pytest.raises(CommandError, match=error):
        add("4821", "--drop-api-key-file", str(key_file))

    assert not Broker.objects.exists()


def test_the_key_and_its_file_are_not_both_accepted(tmp_path) -> None:
    with pytest.raises(CommandError, match="not allowed with argument"):
        add("4821", "--drop-api-key", "k", "--drop-api-key-file", str(tmp_path / "k"))
