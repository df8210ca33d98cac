"""The base of dropportal's commands: subcommands, ``--json``, and one-line errors.

Every failure ends as one line on stderr and a non-zero exit::

    class Command(DropportalCommand):
        def add_subcommands(self, sub): ...
        def handle_add(self, **options): ...
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import pwd
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError, OperationalError, transaction

from integrations.drop.calendar import drop_moment
from integrations.drop.download_zip import escaped
from integrations.encryption import DecryptionError
from integrations.models import Broker, DropCycle
from integrations.services.staff.secrets import ENCRYPTION_KEYS_WRONG, encryption_keys_check
from integrations.validators import first_control_character


def validation_message(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(
            f"{field}: {' '.join(str(m) for m in messages)}"
            for field, messages in error.message_dict.items()
        )
    return " ".join(error.messages)


def terminal_text(text: str) -> str:
    """Text another party wrote (a provider's reference), to print: its control characters
    escaped (``\\x1b``), so the terminal shows them instead of obeying them."""
    return escaped(text, 10 * len(text))  # 10: the longest escape (\U0010ffff), so none is cut


def date_bound(text: str, *, end: bool = False) -> dt.datetime:
    """``--since``/``--until`` values (and other moments typed on the command line), in UTC,
    as ``drop_moment`` reads them: a date is a day of DROP's calendar (``--until`` includes
    the whole day), an ISO time without an offset is read there too."""
    try:
        return drop_moment(text, end=end)
    except ValueError:
        pass
    # A date or time that reads but cannot be held once moved to UTC (or, ending a
    # period, once a day is added): at the very edges of the calendar, not a typo.
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        try:
            day = dt.datetime.fromisoformat(text.upper()).date()
        except ValueError:
            raise CommandError(
                f"not a date: {text!r} (use YYYY-MM-DD or an ISO 8601 time)"
            ) from None
    edge = "past the last" if day.year > 1 else "before the first"
    raise CommandError(
        f"{text!r} is {edge} date supported: give one from {_FIRST_DAY} to {_LAST_DAY}"
    )


# The days whose bounds every zone can hold in UTC, an ending bound's next day included.
_FIRST_DAY = dt.date.min + dt.timedelta(days=1)
_LAST_DAY = dt.date.max - dt.timedelta(days=1)


def add_period_arguments(parser: Any, *, what: str = "") -> None:
    """``--since`` and ``--until`` as ``date_bound`` reads them; ``what`` ("matched ") says
    which time of a row they filter on."""
    zone = "DROPPORTAL_DROP_TIMEZONE, California's"
    parser.add_argument(
        "--since",
        help=f"{what}from this date or ISO time (inclusive); dates, and times without an "
        f"offset, are DROP's calendar ({zone})",
    )
    parser.add_argument(
        "--until", help=f"{what}up to this date (inclusive: the whole day) or ISO time (exclusive)"
    )


def period_bounds(options: dict[str, Any]) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The ``--since`` and ``--until`` of ``add_period_arguments`` in UTC (None when not
    given); an ``--until`` not after ``--since`` is refused, not an empty result."""
    since = date_bound(options["since"]) if options["since"] else None
    until = date_bound(options["until"], end=True) if options["until"] else None
    if since and until and until <= since:
        raise CommandError("--until must be after --since")
    return since, until


def out_path_checked(path: str, option: str = "--out") -> Path:
    """A command's ``--out FILE``, checked before the command does anything (reads, appends
    an event, calls out): a file's path, in a folder that exists and can be written in.
    Found only at the end, a bad path has by then cost the export's work, and an export
    recorded before its file could be written is a false record."""
    if not path.strip():
        raise CommandError(f"{option} is empty: give the path of the file to write")
    out = Path(path)
    if path.endswith(("/", os.sep)) or out.is_dir():
        raise CommandError(f"{option} {path} is a folder: give the path of a file to write in it")
    if out.exists() and not out.is_file():  # /dev/null: the rename would replace the device
        raise CommandError(f"{option} {path} is not a regular file")
    folder = out.parent
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "no such folder"
        raise CommandError(f"{option} {path}: {what}: {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CommandError(f"{option} {path}: cannot write in the folder {folder}")
    return out


def out_folder_checked(path: str, option: str = "--out") -> Path:
    """A command's ``--out FOLDER``, made (with its parents) and checked writable before the
    command does anything: a run that fails only at saving has by then done its work (and
    recorded it, or sent it)."""
    if not path.strip():
        raise CommandError(f"{option} is empty: give the folder to save the files in")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise CommandError(f"{option} {path} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"{option} {path}: cannot make the folder: {exc.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CommandError(f"{option} {path}: cannot write in the folder")
    return out


def _partial_opened(path: str | Path, mode: str) -> tuple[Path, IO[Any]]:
    """``path``'s own partial file, ``<path>.<random>.partial``, created exclusively (the
    caller closes it), and its name."""
    partial = Path(f"{path}.{secrets.token_hex(4)}.partial")
    encoding, newline = (None, None) if "b" in mode else ("utf-8", "")
    try:
        return partial, open(partial, "x" + mode[1:], encoding=encoding, newline=newline)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror}") from None


class PartialOutput:
    """A file being written under its partial name (``file``), until ``put_in_place``."""

    def __init__(self, path: str | Path, mode: str) -> None:
        self.path = Path(path)
        self.partial, self.file = _partial_opened(path, mode)
        self.placed = False

    def put_in_place(self) -> None:
        """Close the file and rename it to its path; one line (CommandError) when it cannot."""
        self.file.close()
        try:
            os.replace(self.partial, self.path)
        except OSError as exc:  # a directory of that name, say: the written file goes too
            raise CommandError(f"cannot write {self.path}: {exc.strerror}") from None
        self.placed = True


@contextlib.contextmanager
def partial_output(path: str | Path, mode: str = "wb") -> Iterator[PartialOutput]:
    """A ``PartialOutput`` for the block to write and put in place; when the block does not
    get that far, the partial file is removed. When the block fails after putting it in
    place (the transaction that records the export did not commit), the file is removed too:
    no finished-looking file of an export the ledger does not hold."""
    output = PartialOutput(path, mode)
    try:
        with output.file:
            yield output
    except BaseException:
        if output.placed:
            output.path.unlink(missing_ok=True)
        raise
    finally:
        if not output.placed:
            output.partial.unlink(missing_ok=True)


@contextlib.contextmanager
def file_written_whole(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """A file written under ``<path>.<random>.partial`` and renamed to ``path`` when the
    block ends without error, removed otherwise: a failed export never leaves a file that
    looks finished. The name is its own (created exclusively): two exports to one path at
    once each write their own file, and one that fails cannot write into the file the other
    finished. Text modes write UTF-8, newlines as given (``mode`` begins with ``w``)."""
    with partial_output(path, mode) as output:
        yield output.file
        output.put_in_place()


@contextlib.contextmanager
def file_written_recorded(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """``file_written_whole`` in one transaction with what the block records: the ledger
    event of the export commits only once the file is in place, and the file stays only if
    the event commits. An export that fails leaves no event of a file never written."""
    with partial_output(path, mode) as output, transaction.atomic():
        yield output.file
        output.put_in_place()


@contextlib.contextmanager
def files_written_whole(*paths: Path) -> Iterator[list[IO[bytes]]]:
    """Binary files that belong together (a file and its signature), each written under a
    partial name as ``file_written_whole`` writes one, and put in place, in the order given,
    only once all are written. When one cannot be put in place, those already put in place
    are taken back (the file each replaced, if any, restored): a failure never leaves one
    beside another's earlier or missing companion, such as a signature of no file there."""
    partials: list[Path] = []
    try:
        with contextlib.ExitStack() as opened:
            files: list[IO[bytes]] = []
            for path in paths:
                partial, file = _partial_opened(path, "wb")
                partials.append(partial)
                files.append(opened.enter_context(file))
            yield files
        _put_in_place(list(zip(partials, paths, strict=True)))
    finally:
        for partial in partials:  # each one not put in place
            partial.unlink(missing_ok=True)


def _put_in_place(moves: list[tuple[Path, Path]]) -> None:
    placed: list[tuple[Path, Path | None]] = []  # each path put in place, and its earlier file
    aside: list[Path] = []
    try:
        for partial, path in moves:
            kept = Path(f"{path}.{secrets.token_hex(4)}.earlier")
            earlier: Path | None = kept
            try:
                # The file it replaces (a link as it is), kept aside until all are placed.
                os.link(path, kept, follow_symlinks=False)
            except OSError:  # none (or a directory, which the replace below refuses)
                earlier = None
            else:
                aside.append(kept)
            try:
                os.replace(partial, path)
            except OSError as exc:
                for done, before in reversed(placed):
                    if before is None:
                        done.unlink(missing_ok=True)
                    else:
                        os.replace(before, done)
                raise CommandError(f"cannot write {path}: {exc.strerror}") from None
            placed.append((path, earlier))
    finally:
        for kept_aside in aside:
            kept_aside.unlink(missing_ok=True)


def open_output(path: str | None, stdout: Any) -> Any:
    """The ``--out`` file (UTF-8, written whole or not at all, with the events the block
    appends: ``file_written_recorded``) or stdout."""
    if path is None:
        return contextlib.nullcontext(stdout)
    return file_written_recorded(path, "w")


def broker_or_error(broker_id: str) -> Broker:
    if not broker_id:
        raise CommandError("the broker id is empty: give the broker's 4-digit DROP id")
    try:
        return Broker.objects.get(broker_id=broker_id)
    except Broker.DoesNotExist:
        raise CommandError(f"no broker with id {broker_id!r}") from None


def broker_or_every(broker_id: str | None) -> Broker | None:
    """An optional ``--broker``: None (every broker) only when it is not given at all. Given,
    even as ``--broker ""``, it must name a broker: an empty value read as "every broker"
    would widen an export or a list past what was asked."""
    return None if broker_id is None else broker_or_error(broker_id)


def cycle_or_error(broker: Broker, drop_session_id: str) -> DropCycle:
    try:
        return DropCycle.objects.get(broker=broker, drop_session_id=drop_session_id)
    except DropCycle.DoesNotExist:
        raise CommandError(f"broker {broker.broker_id} has no cycle {drop_session_id!r}") from None


def add_secret_argument(parser: Any, name: str, what: str) -> None:
    """``--<name> VALUE``, or ``--<name>-file PATH`` (``-``: standard input), not both.

    A value on the command line shows in the process list and the shell's history; from a
    file or a pipe it does not.
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        f"--{name}",
        default="",
        help=f"{what} (seen in the process list and shell history: prefer --{name}-file)",
    )
    group.add_argument(
        f"--{name}-file",
        default=None,
        metavar="PATH",
        help=f"read the {what} from PATH, or from standard input with '-'",
    )


def _stdin_bytes(stream: Any) -> bytes:
    """All of ``stream`` (standard input) as bytes, for ``secret_value`` to decode strictly:
    read as text, bytes that are not UTF-8 become surrogates (``surrogateescape``), which
    pass as a secret and fail only when it is encrypted."""
    data = getattr(stream, "buffer", stream).read()
    if isinstance(data, bytes):
        return data
    # A text stream with no bytes under it (call_command's stdin=io.StringIO(...)): its
    # surrogates, if any, come out as bytes that are not UTF-8, and are refused as such.
    return str(data).encode("utf-8", "surrogatepass")


def _utf8_text(data: bytes, source: str) -> str:
    """``data`` decoded strictly, without the byte order mark some editors write first: kept,
    it would be the secret's first character, and every signature made with it wrong."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CommandError(f"cannot read {source}: not UTF-8 text") from None


def secret_value(options: dict[str, Any], name: str) -> str:
    """The secret given by ``add_secret_argument``'s options: one line, without its newline
    (or a leading byte order mark), and no control character in it."""
    dest = name.replace("-", "_")
    what = name.replace("-", " ")
    path = options.get(f"{dest}_file")
    if path is None:
        given = str(options.get(dest) or "")
        if not given:
            return ""
        source = f"--{name}"
        # An argument's bytes that are not UTF-8 arrive as surrogates (as from stdin above).
        value = _utf8_text(given.encode("utf-8", "surrogatepass"), source)
    else:
        if path == "-":
            source = "standard input"
            data = _stdin_bytes(options.get("stdin") or sys.stdin)
        else:
            source = f"--{name}-file {path}"
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise CommandError(f"cannot read {source}: {exc.strerror}") from None
        value = _utf8_text(data, source).removesuffix("\n").removesuffix("\r")
        if not value.strip():
            raise CommandError(f"{source} gave an empty {what}")
        if "\n" in value or "\r" in value:
            raise CommandError(f"{source} must hold the {what} on one line")
    control = first_control_character(value)
    if control is not None:
        # Which one, escaped, says what to remove; the secret itself is never shown.
        raise CommandError(
            f"{source} gave a {what} with a control character ({terminal_text(control)}) in it"
        )
    return value


def refuse_unreadable_secrets() -> None:
    """One line and a non-zero exit, at a command's start, when ``DROPPORTAL_ENCRYPTION_KEYS``
    cannot read the stored secrets (rather than a traceback from the first one read). An
    unreachable database is left to the command, which says so its own way."""
    try:
        problem = encryption_keys_check()
    except DatabaseError:
        return
    if problem:
        raise CommandError(problem)


class _OneLineErrors(CommandParser):
    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
            sys.exit(2)
        raise CommandError(f"{self.prog}: {message}")


def one_line_errors(parser: CommandParser) -> None:
    """Have ``parser`` (a command's, from ``add_arguments``) refuse a bad argument in one
    line, without argparse's usage block; its subparsers, which take ``type(parser)``, too."""
    parser.__class__ = _OneLineErrors


class DropportalCommand(BaseCommand):
    """A command whose first argument picks a subcommand, dispatched to ``handle_<name>``."""

    stealth_options = ("stdin",)  # call_command(..., stdin=...) for secrets read from "-"

    def add_arguments(self, parser: CommandParser) -> None:
        one_line_errors(parser)
        subparsers = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        self.add_subcommands(subparsers)

    def add_subcommands(self, subparsers: Any) -> None:
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        action = options.pop("action").replace("-", "_")
        try:
            refuse_unreadable_secrets()
            getattr(self, f"handle_{action}")(**options)
        except ValidationError as exc:
            raise CommandError(validation_message(exc)) from exc
        except DecryptionError as exc:  # a secret stored under a key dropped since the start
            raise CommandError(ENCRYPTION_KEYS_WRONG) from exc
        except (OperationalError, InterfaceError) as exc:
            # The database unreachable, gone mid-run, or a lock or statement timeout: what
            # the operator acts on is the server's words, not a traceback.
            raise CommandError(f"database: {' '.join(str(exc).split())}") from exc
        except KeyboardInterrupt:
            # Every transaction under way was rolled back on the way out.
            raise CommandError("interrupted", returncode=130) from None

    @staticmethod
    def actor() -> str:
        """``cli:`` and the OS user the process runs as, from the system's user table: never
        from ``LOGNAME`` or ``USER`` (which ``getpass.getuser`` reads first), which the caller
        sets at will, and a second person's approval rests on this name."""
        uid = os.geteuid()
        try:
            return f"cli:{pwd.getpwuid(uid).pw_name}"
        except KeyError:  # a user id with no name on this system (a container's)
            return f"cli:uid {uid}"

    def print_json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, default=str))
