"""``manage.py outcomes export``: the outcome history, one row per deletion request.

    manage.py outcomes export --broker 4821 --since 2026-03-01 --format jsonl --out h.jsonl

Streams (memory stays flat at any size); in CSV a free-text cell (``error_message``) a
spreadsheet would run as a formula is defused, hashes, ids and codes are written verbatim;
JSONL keeps every value exact. Columns: ``selectors.outcomes.OUTCOME_COLUMNS``.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from integrations import exports
from integrations.management.base import (
    DropportalCommand,
    add_period_arguments,
    broker_or_every,
    file_written_recorded,
    open_output,
    out_path_checked,
    period_bounds,
)
from integrations.selectors.outcomes import (
    OUTCOME_COLUMNS,
    deletion_outcomes,
    deletion_outcomes_csv,
)
from integrations.services.evidence.audit import outcome_export_record


class Command(DropportalCommand):
    help = "Export the outcome history of deletion requests."

    def add_subcommands(self, subparsers: Any) -> None:
        export = subparsers.add_parser(
            "export", help="stream one row per deletion request as CSV or JSONL"
        )
        export.add_argument("--format", choices=exports.FORMATS, default="csv")
        export.add_argument("--broker", help="only this broker's requests")
        add_period_arguments(export, what="matched ")
        export.add_argument("--out", help="write to this file instead of stdout")

    def handle_export(self, **options: Any) -> None:
        out = options["out"]
        if out is not None:
            out_path_checked(out)
        broker_id = options["broker"]
        broker_or_every(broker_id)  # a typo is an error, not an empty export
        since, until = period_bounds(options)
        filters = {"broker_id": broker_id, "since": since, "until": until}

        def record() -> None:
            outcome_export_record(
                actor=self.actor(),
                via="command",
                broker_id=broker_id or "",
                fmt=options["format"],
                filters={"since": options["since"], "until": options["until"], "out": out},
            )

        # To a file, the event is appended in the file's transaction: committed only once
        # the file is in place, so a failed export records nothing.
        if options["format"] == "csv" and out is not None:
            # PostgreSQL's UTF-8 bytes go to the file as they come.
            with file_written_recorded(out, "wb") as binary:
                record()
                for chunk in deletion_outcomes_csv(**filters):
                    binary.write(chunk)
        else:
            with open_output(out, self.stdout._out) as stream:
                record()
                if options["format"] == "csv":
                    _write_text(stream, deletion_outcomes_csv(**filters))
                else:
                    rows = deletion_outcomes(**filters)
                    exports.write_rows(stream, fmt="jsonl", columns=OUTCOME_COLUMNS, rows=rows)
        if out is not None:
            size = Path(out).stat().st_size
            self.stderr.write(f"Wrote the outcome history to {out} ({size:,} bytes).")


def _write_text(stream: TextIO, chunks: Iterable[bytes]) -> None:
    # An incremental decoder: a chunk may end inside a multi-byte character.
    decoder = codecs.getincrementaldecoder("utf-8")()
    for chunk in chunks:
        stream.write(decoder.decode(chunk))
    stream.write(decoder.decode(b"", final=True))
