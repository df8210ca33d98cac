"""``manage.py consumers import``: register a broker's consumers from files or a bucket.

    manage.py consumers import --broker 4821 consumers.csv [--hashed] [--strict] [--json]
    manage.py consumers import --broker 4821 s3://exports/consumers/ [--format parquet]
    manage.py consumers canary --broker 4821 TEST-0001 [--remove]   # name (or remove) a canary
    manage.py consumers canary --broker 4821                        # list the broker's canaries

SOURCE is a path, ``-`` (standard input), ``s3://bucket/key`` or ``s3://bucket/prefix/``
(every object under it, in name order, as one import; marker objects, empty or named
``_…`` or ``.…`` like ``_SUCCESS`` and ``.crc`` files, are skipped and named in the
summary). Formats: CSV, gzip CSV, Parquet,
from each name or ``--format``. Clear files have ``remote_identifier`` first, then any of
``remote_identifier_kind, email, phone, first_name, last_name, dob, zip, vin, maid, ctvid``;
``--hashed`` files have ``remote_identifier, hash_type, hash`` (Base64). Columns that can
give no hash (names without ``dob`` and ``zip`` or ``vin``, ``dob`` or ``zip`` alone) are
ignored and named in a line before the summary.

Each header is checked before its rows are read. Each bad row is reported on stderr with
its line (Parquet: row) and reason (never its values); the good rows are imported, unless
``--strict``, where one bad row refuses the whole import. The whole import is one
transaction, and importing it again changes nothing. A progress bar shows on a terminal.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from typing import IO, Any

from django.conf import settings
from django.core.management.base import CommandError
from tqdm import tqdm

from integrations.consumers.readers import RegistrationFileError
from integrations.consumers.sources import FORMATS, ConsumerSource, SourceError, consumer_sources
from integrations.consumers.workers import EncodedBatch
from integrations.drop.calendar import drop_date
from integrations.management.base import DropportalCommand, broker_or_error
from integrations.models import Canary
from integrations.services.cycle.canaries import canary_add, canary_remove
from integrations.services.cycle.consumers import (
    DEFAULT_MAX_FORGET,
    ConsumerRegistration,
    RegistrationRefused,
    ReplaceRefused,
    consumers_import,
    consumers_replace,
)


def _percentage(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100, not {text!r}")
    return value


log = logging.getLogger(__name__)
_LOG_EVERY_ROWS = 1_000_000  # without a size (standard input): a log line per this many rows


class _Progress:
    """How far the import has read: a bar on a terminal (bytes, with rows per second),
    otherwise a log line each time the bytes read pass a further 10 % of the size (per
    million rows when the size is unknown)."""

    def __init__(self, bar: tqdm, name: str, total: int | None, err: IO[str], files: int) -> None:
        self.bar = bar
        self.name = name
        self.total = total
        self.err = err
        self.files = files
        self.current: ConsumerSource | None = None  # the file being read
        self.bytes = 0
        self.rows = 0
        self.started = time.monotonic()
        self._next_tenth = 1

    def file_started(self, source: ConsumerSource) -> None:
        self.current = source

    def batch_read(self, source: ConsumerSource, batch: EncodedBatch) -> None:
        """Count the batch's rows and report each rejected one (never its values)."""
        self.rows_read(batch.records)
        # Several files: a rejected row is named by its file too.
        prefix = f"{source.name} " if self.files > 1 else ""
        where = "row" if source.format == "parquet" else "line"
        for record in batch.rejected:
            self.bar.write(f"{prefix}{where} {record.position}: {record.reason}", file=self.err)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.rows / elapsed if elapsed > 0 else 0.0

    def bytes_read(self, count: int) -> None:
        self.bar.update(count)
        self.bytes += count

    def rows_read(self, count: int) -> None:
        before, self.rows = self.rows, self.rows + count
        if not self.bar.disable:
            self.bar.set_postfix_str(f"{self.rate():,.0f} rows/s", refresh=False)
        elif self.total:
            self._log_tenth(self.total)
        elif before // _LOG_EVERY_ROWS != self.rows // _LOG_EVERY_ROWS:
            log.info(
                "%s: %s rows hashed, %s rows/s", self.name, f"{self.rows:,}", f"{self.rate():,.0f}"
            )

    def _log_tenth(self, total: int) -> None:
        # Written as rows are counted, not as bytes arrive: the bytes run ahead of the rows
        # (read in blocks, hashed in other processes), and a line said "100 % read, 0 rows".
        # Tenths passed at once (a small file is one block) make one line.
        tenth = min(10, self.bytes * 10 // total)
        if tenth < self._next_tenth:
            return
        log.info(
            "%s: %d %% read, %s rows hashed, %s rows/s",
            self.name,
            tenth * 10,
            f"{self.rows:,}",
            f"{self.rate():,.0f}",
        )
        self._next_tenth = tenth + 1


def _reading(progress: _Progress) -> str:
    """The file being read when the import failed."""
    return progress.current.name if progress.current is not None else progress.name


class Command(DropportalCommand):
    help = "Register a broker's consumers from a file, standard input or an S3 bucket."

    def add_subcommands(self, subparsers: Any) -> None:
        imports = subparsers.add_parser(
            "import", help="import consumers from CSV, gzip CSV or Parquet (clear or --hashed)"
        )
        imports.add_argument("--broker", required=True, help="broker id, 4 digits")
        imports.add_argument(
            "source",
            help="a file, - for standard input, s3://bucket/key, or s3://bucket/prefix/ "
            "(every object under it, in name order)",
        )
        imports.add_argument(
            "--format",
            choices=FORMATS,
            help="the files' format (default: from each name; standard input: csv)",
        )
        imports.add_argument(
            "--hashed",
            action="store_true",
            help="columns remote_identifier, hash_type, hash (44-character Base64)",
        )
        imports.add_argument(
            "--strict", action="store_true", help="refuse the whole import if any row is bad"
        )
        imports.add_argument(
            "--replace",
            action="store_true",
            help="the source is the broker's whole set of the kinds it carries: consumers "
            "of those kinds missing from it are forgotten, and so are a listed consumer's "
            "hashes of the list types it carries that it does not give (implies --strict)",
        )
        imports.add_argument(
            "--max-forget",
            type=_percentage,
            default=None,  # None: not given, which a command without --replace must not be
            metavar="PCT",
            help="--replace refuses to forget more than this share of the set, or of "
            "its listed consumers' hashes "
            f"(default {DEFAULT_MAX_FORGET * 100:g} %%)",
        )
        imports.add_argument(
            "--force", action="store_true", help="--replace: forget past --max-forget"
        )
        imports.add_argument("--json", action="store_true")

        canary = subparsers.add_parser(
            "canary",
            help="name a registered consumer a canary: a consumer the broker keeps only for "
            "testing, sent a deletion every cycle (drop_session_id 0); without one, list them",
        )
        canary.add_argument("--broker", required=True, help="broker id, 4 digits")
        canary.add_argument(
            "remote_identifier",
            nargs="?",
            metavar="REMOTE_IDENTIFIER",
            help="the consumer's remote_identifier, as the broker registered it",
        )
        canary.add_argument(
            "--remove", action="store_true", help="it is no longer a canary (stays registered)"
        )

    def handle_canary(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        name = options["remote_identifier"]
        if name is None:
            if options["remove"]:
                raise CommandError("--remove needs the REMOTE_IDENTIFIER of the canary")
            canaries = Canary.objects.filter(broker=broker)
            for canary in canaries:
                self.stdout.write(
                    f"{canary.remote_identifier}  (added by {canary.added_by}, "
                    f"{drop_date(canary.created_at)})"
                )
            if not canaries:
                self.stdout.write(f"Broker {broker.broker_id} has no canary.")
            return
        if options["remove"]:
            canary_remove(broker=broker, remote_identifier=name, actor=self.actor())
            self.stdout.write(f"{name} is no longer a canary of broker {broker.broker_id}.")
            return
        canary_add(broker=broker, remote_identifier=name, actor=self.actor())
        self.stdout.write(
            f"{name} is a canary of broker {broker.broker_id}: every cycle (and `drop canary`) "
            "sends it a deletion to every target, with drop_session_id 0; only `deleted` "
            f"within {settings.DROPPORTAL_CANARY_HOURS} hours passes."
        )

    def handle_import(self, **options: Any) -> None:
        # Without --replace nothing is forgotten: ignored, they would let the operator believe
        # a limit held, or was lifted.
        replace_only = {
            "--force": options["force"],
            "--max-forget": options["max_forget"] is not None,
        }
        given = [name for name, on in replace_only.items() if on]
        if given and not options["replace"]:
            raise CommandError(f"{' and '.join(given)} only go with --replace")
        percent = options["max_forget"]
        max_forget = DEFAULT_MAX_FORGET if percent is None else percent / 100
        broker = broker_or_error(options["broker"])
        spec: str = options["source"]
        try:
            found = consumer_sources(
                spec, format=options["format"], endpoint_url=settings.DROPPORTAL_S3_ENDPOINT_URL
            )
        except SourceError as exc:
            raise CommandError(f"{exc}; nothing was imported") from None
        sources = found.files
        name = sources[0].name if len(sources) == 1 else spec
        sizes = [source.size for source in sources]
        total = None if None in sizes else sum(s or 0 for s in sizes)
        err = getattr(self.stderr, "_out", sys.stderr)  # tqdm draws with \r: the bare stream
        started = time.monotonic()
        # disable=None: no bar unless stderr is a terminal.
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=name,
            file=err,
            disable=None,
            leave=False,
        ) as bar:
            progress = _Progress(bar, name, total, err, len(sources))
            common: dict[str, Any] = {
                "broker": broker,
                "files": sources,
                "hashed": options["hashed"],
                "actor": self.actor(),
                "source": f"file:{name}" if not spec.startswith("s3://") else spec,
                "progress": progress,
            }
            try:
                if options["replace"]:
                    result = consumers_replace(
                        **common, max_forget=max_forget, force=options["force"]
                    )
                else:
                    result = consumers_import(**common, strict=options["strict"])
            except RegistrationRefused as refused:
                raise CommandError(
                    f"{name}: {refused.result.rows_rejected} of {refused.result.rows_read} "
                    f"rows rejected; {'--replace' if options['replace'] else '--strict'}: "
                    "nothing was imported"
                ) from None
            except ReplaceRefused as refused:
                raise CommandError(
                    f"{name}: {refused}; nothing was imported (--force forgets them)"
                ) from None
            except (RegistrationFileError, SourceError) as exc:
                raise CommandError(f"{_reading(progress)}: {exc}; nothing was imported") from None
            except BrokenProcessPool as exc:
                raise CommandError(
                    f"{_reading(progress)}: a hashing worker process stopped ({exc}); "
                    "nothing was imported"
                ) from None
            except OSError as exc:  # a read the source itself did not turn into one line
                raise CommandError(
                    f"{_reading(progress)}: read failed: {exc}; nothing was imported"
                ) from None
        seconds = time.monotonic() - started
        self._summary(result, name, broker.broker_id, options["json"], seconds, found.skipped)

    def _summary(
        self,
        result: ConsumerRegistration,
        name: str,
        broker_id: str,
        as_json: bool,
        seconds: float,
        skipped: list[str],
    ) -> None:
        rate = result.rows_read / seconds if seconds > 0 else 0.0
        if as_json:
            self.print_json(
                {
                    "file": name,
                    "broker_id": broker_id,
                    "strict": result.strict,
                    **result.counts(),
                    "seconds": round(seconds, 3),
                    "rows_per_second": round(rate),
                    "skipped": skipped,
                    "unused_columns": result.unused_columns,
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
        for note in result.unused_columns:
            self.stdout.write(f"{note}.")
        self.stdout.write(
            f"{name}: {result.rows_read:,} rows read, {result.rows_accepted:,} imported, "
            f"{result.rows_rejected:,} rejected; {result.consumers_created:,} new consumers, "
            f"{result.hashes_added:,} hashes added, {result.hashes_unchanged:,} already "
            f"registered"
            + (f", {result.kinds_changed:,} kinds changed" if result.kinds_changed else "")
            + (
                f", {result.consumers_forgotten:,} forgotten (--replace)"
                if result.consumers_forgotten
                else ""
            )
            + (
                f", {result.hashes_forgotten:,} hashes forgotten (--replace)"
                if result.hashes_forgotten
                else ""
            )
            + f"; {seconds:,.1f} s, {rate:,.0f} rows/s."
            + (
                f" Skipped {len(skipped)} marker object{'' if len(skipped) == 1 else 's'} "
                f"(empty, or named _… or .…, or in a folder so named): {', '.join(skipped)}."
                if skipped
                else ""
            )
        )
