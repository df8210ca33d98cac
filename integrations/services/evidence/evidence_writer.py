"""Writing an evidence pack's ZIP member by member, each member's digest, size and row count
noted for the manifest as it streams::

    writer = PackWriter(out)
    writer.write(pack.LEDGER, chunks, rows=LineCounter())
    writer.write_raw(pack.MANIFEST, manifest_bytes)
    writer.close()
    writer.entries      # the manifest's "files"
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterable
from typing import IO, Any

from integrations.evidence import components, pack

_READ_BACK_CHUNK = 8 << 20

DESCRIPTIONS = {
    pack.OUTCOMES: "outcome history of the period's deletion requests, one row each (CSV)",
    pack.LEDGER: "the ledger range: the broker's events in full, other events as hashes",
    pack.SUMMARY: "a readable summary (HTML)",
    components.FILE: "the audit's components: per component its records, the tests run at "
    "export and their result",
}


class LineCounter:
    def __init__(self) -> None:
        self.rows = 0

    def feed(self, chunk: bytes) -> None:
        self.rows += chunk.count(b"\n")


class CsvRecordCounter:
    """CSV records (header excluded) as the bytes stream by: a line end inside quotes is
    part of a cell, not the end of a record."""

    def __init__(self) -> None:
        self.records = 0
        self.quoted = False

    def feed(self, chunk: bytes) -> None:
        if b'"' not in chunk and not self.quoted:
            self.records += chunk.count(b"\n")
            return
        for index, part in enumerate(chunk.split(b'"')):
            if index:
                self.quoted = not self.quoted
            if not self.quoted:
                self.records += part.count(b"\n")

    @property
    def rows(self) -> int:
        return max(self.records - 1, 0)


class PackWriter:
    """Writes members to ``out`` (seekable and readable: each member's stored bytes are read
    back for their digest)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.archive = zipfile.ZipFile(out, "w", compression=pack.COMPRESSION, compresslevel=1)
        self.entries: list[dict[str, Any]] = []

    def write(
        self,
        name: str,
        chunks: Iterable[bytes],
        *,
        rows: int | LineCounter | CsvRecordCounter | None,
        description: str | None = None,
    ) -> None:
        digest = hashlib.sha256()
        size = 0
        counter = rows if isinstance(rows, LineCounter | CsvRecordCounter) else None
        with self.archive.open(pack.member_info(name), "w", force_zip64=True) as member:
            for chunk in chunks:
                member.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if counter is not None:
                    counter.feed(chunk)
        self.entries.append(
            {
                "name": name,
                "description": description or DESCRIPTIONS[name],
                "sha256": digest.hexdigest(),
                "rows": counter.rows if counter is not None else rows,
                "bytes": size,
                "zip_sha256": self._stored_digest(),
            }
        )

    def _stored_digest(self) -> str:
        info = self.archive.filelist[-1]
        end = self.out.tell()
        # The local header: 30 bytes, the name, and the 20-byte ZIP64 field.
        self.out.seek(info.header_offset + 30 + len(info.filename.encode()) + 20)
        digest = hashlib.sha256()
        left = info.compress_size
        while left > 0:
            chunk = self.out.read(min(left, _READ_BACK_CHUNK))
            digest.update(chunk)
            left -= len(chunk)
        self.out.seek(end)
        return digest.hexdigest()

    def write_raw(self, name: str, content: bytes) -> None:
        with self.archive.open(pack.member_info(name), "w", force_zip64=True) as member:
            member.write(content)

    def close(self) -> None:
        self.archive.close()
