"""``manage.py consumers import``: register a broker's consumers from a CSV file.

    manage.py consumers import --broker 4821 consumers.csv [--hashed] [--strict] [--json]

Clear files have ``remote_identifier`` first, then any of ``remote_identifier_kind, email,
phone, first_name, last_name, dob, zip, vin, maid, ctvid``; ``--hashed`` files have
``remote_identifier, hash_type, hash`` (Base64). ``-`` reads standard input.

The header is checked before anything is written. Each bad row is reported on stderr with
its line number and reason (never its values); the good rows are imported, unless
``--strict``, where one bad row refuses the whole file. The whole file is one transaction,
and importing it again changes nothing. A progress bar (bytes read) shows on a terminal.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

from django.core.management.base import CommandError
from tqdm import tqdm

from integrations.drop.registration import (
    ConsumerCsvReader,
    ConsumerRecord,
    RegistrationFileError,
    RejectedRecord,
)
from integrations.management.base import DropportalCommand, broker_or_error
from integrations.services.consumers import (
    ConsumerRegistration,
    RegistrationRefused,
    consumers_register,
)


class _CountingReader(io.RawIOBase):
    """A binary file that advances a progress bar by the bytes read through it."""

    def __init__(self, raw: IO[bytes], bar: tqdm) -> None:
        self._raw = raw
        self._bar = bar

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if count:
            self._bar.update(count)
        return count or 0


class Command(DropportalCommand):
    help = "Register a broker's consumers from a CSV file."

    def add_subcommands(self, subparsers: Any) -> None:
        imports = subparsers.add_parser(
            "import", help="import consumers from a CSV file (clear or --hashed)"
        )
        imports.add_argument("--broker", required=True, help="broker id, 4 digits")
        imports.add_argument("file", help="CSV file, or - for standard input")
        imports.add_argument(
            "--hashed",
            action="store_true",
            help="columns remote_identifier, hash_type, hash (44-character Base64)",
        )
        imports.add_argument(
            "--strict", action="store_true", help="refuse the whole file if any row is bad"
        )
        imports.add_argument("--json", action="store_true")

    def handle_import(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        path: str = options["file"]
        name = "stdin" if path == "-" else os.path.basename(path)
        raw, size = self._open(path)
        err = getattr(self.stderr, "_out", sys.stderr)  # tqdm draws with \r: the bare stream
        # disable=None: no bar unless stderr is a terminal.
        with (
            raw,
            tqdm(
                total=size,
                unit="B",
                unit_scale=True,
                desc=name,
                file=err,
                disable=None,
                leave=False,
            ) as bar,
        ):
            text = io.TextIOWrapper(
                io.BufferedReader(_CountingReader(raw, bar), buffer_size=1 << 20),
                encoding="utf-8-sig",
                errors="surrogateescape",  # a row with bytes that are not UTF-8 is rejected alone
                newline="",
            )
            try:
                reader = ConsumerCsvReader(text, hashed=options["hashed"])
            except RegistrationFileError as exc:
                raise CommandError(f"{name}: {exc}; nothing was imported") from None
            try:
                result = consumers_register(
                    broker=broker,
                    rows=self._reporting(reader, bar, err),
                    actor=self.actor(),
                    source=f"file:{name}",
                    strict=options["strict"],
                )
            except RegistrationRefused as refused:
                raise CommandError(
                    f"{name}: {refused.result.rows_rejected} of {refused.result.rows_read} "
                    "rows rejected; --strict: nothing was imported"
                ) from None
            except OSError as exc:
                raise CommandError(f"{name}: read failed: {exc}; nothing was imported") from None
        self._summary(result, name, broker.broker_id, options["json"])

    def _open(self, path: str) -> tuple[IO[bytes], int | None]:
        if path == "-":
            return os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0), None
        try:
            raw = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by handle_import)
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        return raw, os.fstat(raw.fileno()).st_size

    @staticmethod
    def _reporting(
        records: ConsumerCsvReader, bar: tqdm, err: IO[str]
    ) -> Iterator[ConsumerRecord | RejectedRecord]:
        """Pass the records on, reporting each rejected one as it is read."""
        for record in records:
            if isinstance(record, RejectedRecord):
                bar.write(f"line {record.position}: {record.reason}", file=err)
            yield record

    def _summary(
        self, result: ConsumerRegistration, name: str, broker_id: str, as_json: bool
    ) -> None:
        if as_json:
            self.print_json(
                {
                    "file": name,
                    "broker_id": broker_id,
                    "strict": result.strict,
                    **result.counts(),
                    "rejected": [
                        {
                            "line": r.position,
                            "remote_identifier": r.remote_identifier,
                            "errors": r.errors,
                        }
                        for r in result.rejected
                    ],
                }
            )
            return
        self.stdout.write(
            f"{name}: {result.rows_read:,} rows read, {result.rows_accepted:,} imported, "
            f"{result.rows_rejected:,} rejected; {result.consumers_created:,} new consumers, "
            f"{result.hashes_added:,} hashes added, {result.hashes_unchanged:,} already "
            f"registered"
            + (f", {result.kinds_changed:,} kinds changed" if result.kinds_changed else "")
            + "."
        )
