"""``manage.py drop suppression export`` and ``drop reappearances``: the suppression list
for a warehouse filter, and the consumers registered again after DROP sent them.

    manage.py drop suppression export --broker 4821                  # CSV on stdout
    manage.py drop suppression export --broker 4821 --format parquet --out suppressed.parquet
    manage.py drop suppression export --broker 4821 --out s3://warehouse/drop/suppressed.csv
    manage.py drop reappearances --broker 4821 [--since 2027-01-01] [--json]

The export writes ``hash_type,hash`` for every hash DROP sent and did not remove, each
once, streamed at flat memory. A file is written under a temporary name and renamed when
whole, an S3 object is a multipart upload completed only when whole: a failed export
leaves nothing that looks finished. Once written it is one ledger event (how many hashes,
the SHA-256 of what was written). The ``drop`` command mixes this in.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from collections.abc import Iterator
from typing import IO, Any

from django.conf import settings
from django.core.management.base import CommandError

from integrations import exports
from integrations.consumers.sources import SourceError, s3_upload
from integrations.management.base import (
    DropportalCommand,
    broker_or_error,
    date_bound,
    file_written_whole,
    out_path_checked,
)
from integrations.selectors.suppression import (
    SUPPRESSION_COLUMNS,
    reappearances_by_source_month,
    suppressed_hashes_csv,
)
from integrations.services.cycle.suppression import suppression_export_record

SUPPRESSION_FORMATS = ("csv", "parquet")


class _CountingSink:
    """Passes bytes on, taking their SHA-256 and counting them as they go (a write-only
    file to Parquet's writer)."""

    closed = False

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: Any) -> int:
        self._out.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self._out.flush()


class SuppressionSubcommands(DropportalCommand):
    def add_suppression_subcommands(self, subparsers: Any) -> None:
        suppression = subparsers.add_parser(
            "suppression", help="the suppression list: every hash DROP sent and did not remove"
        )
        actions = suppression.add_subparsers(
            dest="suppression_action", required=True, metavar="ACTION"
        )
        export = actions.add_parser(
            "export", help="write hash_type,hash of every suppressed hash, for a warehouse"
        )
        export.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        export.add_argument("--format", choices=SUPPRESSION_FORMATS, default="csv")
        export.add_argument(
            "--out",
            help="a file, or s3://bucket/key (DROPPORTAL_S3_ENDPOINT_URL, boto3's credentials); "
            "default: stdout",
        )

        reappearances = subparsers.add_parser(
            "reappearances",
            help="consumers registered again after DROP sent them, by source and month",
        )
        reappearances.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        reappearances.add_argument(
            "--since", help="from this date (YYYY-MM-DD, DROP's calendar) or ISO time"
        )
        reappearances.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle_suppression(self, **options: Any) -> None:
        action = options.pop("suppression_action")
        assert action == "export"  # the only one
        fmt, out = options["format"], options["out"]
        if out is not None and not out.startswith("s3://"):
            out_path_checked(out)
        broker = broker_or_error(options["broker"])
        if fmt == "parquet" and not out and sys.stdout.isatty():
            raise CommandError("Parquet is binary: give --out FILE or s3://bucket/key")
        destination = out or "stdout"
        try:
            with self._sink(out) as raw:
                sink = _CountingSink(raw)
                if fmt == "csv":
                    hashes = -1  # the header line
                    for chunk in suppressed_hashes_csv(broker=broker):
                        sink.write(chunk)
                        hashes += chunk.count(b"\n")
                else:
                    hashes = exports.csv_to_parquet(
                        suppressed_hashes_csv(broker=broker, header=False),
                        sink,
                        columns=SUPPRESSION_COLUMNS,
                    )
                sink.flush()
        except SourceError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write {destination}: {exc.strerror or exc}") from None
        suppression_export_record(
            broker=broker,
            actor=self.actor(),
            fmt=fmt,
            destination=destination,
            hashes=hashes,
            sha256=sink.sha256.hexdigest(),
        )
        if out:
            self.stderr.write(f"Wrote {hashes:,} suppressed hashes to {out} ({sink.size:,} bytes).")

    def _sink(self, out: str | None) -> Any:
        if out and out.startswith("s3://"):
            return s3_upload(out, endpoint_url=settings.DROPPORTAL_S3_ENDPOINT_URL)
        if out:
            return file_written_whole(out)
        return _stdout_bytes(self.stdout._out)

    def handle_reappearances(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        since = date_bound(options["since"]) if options["since"] else None
        rows = reappearances_by_source_month(broker=broker, since=since)
        if options["json"]:
            self.print_json(
                {
                    "broker_id": broker.broker_id,
                    "since": since.isoformat() if since else None,
                    "reappearances": sum(row.reappearances for row in rows),
                    "by_source_and_month": [
                        {
                            "month": row.month,
                            "source": row.source,
                            "source_sha256": row.source_sha256,
                            "reappearances": row.reappearances,
                            "work_items": row.work_items,
                        }
                        for row in rows
                    ],
                }
            )
            return
        if not rows:
            self.stdout.write(f"No reappearance for broker {broker.broker_id}.")
            return
        self.stdout.write(f"{'month':<8} {'reappearances':>13} {'work items':>10}  source")
        for row in rows:
            sha = f" (SHA-256 {row.source_sha256})" if row.source_sha256 else ""
            self.stdout.write(
                f"{row.month:<8} {row.reappearances:>13,} {row.work_items:>10,}  {row.source}{sha}"
            )


@contextlib.contextmanager
def _stdout_bytes(stream: Any) -> Iterator[Any]:
    """Standard output as bytes: its binary buffer (a text stream, in tests, gets text)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        yield _TextBytes(stream)
        return
    stream.flush()
    yield buffer
    buffer.flush()


class _TextBytes:
    """Bytes written to a text stream, as UTF-8 text."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: Any) -> int:
        self.stream.write(bytes(data).decode("utf-8", errors="surrogateescape"))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()
