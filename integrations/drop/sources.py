"""Where a broker's consumer file comes from, and how its rows are read, a stream at a time.

A source is a path, ``-`` (standard input), ``s3://bucket/key`` or ``s3://bucket/prefix/``
(every object under the prefix, in name order). Each file's format is found from its name
(``.csv``, ``.csv.gz``, ``.parquet``) or given::

    for source in consumer_sources("s3://exports/consumers/", endpoint_url=None):
        with source.open_records(hashed=False) as batches:   # header checked here
            for batch in batches: ...                        # EncodedBatch, in file order

Nothing is read whole: CSV is decoded as it streams (gzip included), Parquet one record
batch at a time. An S3 object is read through boto3 (its usual credential chain); a seek,
which Parquet's footer and column chunks need, starts a ranged GET at the new offset, so
nothing is downloaded twice or spooled to disk. Standard input in Parquet is spooled to a
temporary file first (Parquet cannot be read without seeking).

A source that cannot be read raises ``SourceError`` with one line that says why. Pure
protocol code: no database, no Django settings (the caller passes the endpoint).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final

from integrations.drop.registration import (
    ConsumerCsvReader,
    ConsumerTableReader,
    RegistrationFileError,
)
from integrations.drop.registration_workers import EncodedBatch, encoded_batches

FORMATS: Final = ("csv", "csv.gz", "parquet")
PARQUET_BATCH_ROWS: Final = 65_536  # rows decoded at a time from a Parquet file
_READ_BLOCK: Final = 1 << 20


class SourceError(Exception):
    """The source cannot be read (missing, refused, unknown format): nothing is imported."""


def format_of(name: str, given: str | None) -> str:
    """The format given, else the one the name ends with."""
    if given:
        return given
    lower = name.lower()
    if lower.endswith((".csv.gz", ".gz")):
        return "csv.gz"
    if lower.endswith((".parquet", ".pq")):
        return "parquet"
    if lower.endswith((".csv", ".txt")) or name == "-":
        return "csv"
    raise SourceError(f"cannot tell the format of {name!r} from its name; use --format")


@dataclass
class ConsumerSource:
    """One file to read: its name (for reports and the ledger), size and format."""

    name: str
    size: int | None
    format: str
    _opener: Callable[[], Any]  # a binary file object: a file, a spool, an _S3Object
    sha256: Any = field(default_factory=hashlib.sha256)
    bytes_read: int = 0

    def open_raw(self, on_read: Callable[[int], None] | None = None) -> io.RawIOBase:
        """The file's bytes, counted (and hashed, for a sequential read) as they are read."""
        return _DigestingReader(self, self._opener(), on_read)

    @contextlib.contextmanager
    def open_records(
        self,
        *,
        hashed: bool,
        on_read: Callable[[int], None] | None = None,
        processes: int | None = None,
    ) -> Iterator[Iterator[EncodedBatch]]:
        """The file's records, hashed and encoded in batches (``encoded_batches``); its
        header is checked on entry (``RegistrationFileError``)."""
        with contextlib.ExitStack() as stack:
            raw: Any = stack.enter_context(self.open_raw(on_read))
            if self.format == "parquet":
                reader = _parquet_reader(raw, self.name, hashed=hashed, stack=stack)
                yield _read_records(reader, processes)
                return
            if self.format == "csv.gz":
                raw = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
            text = io.TextIOWrapper(
                io.BufferedReader(raw, buffer_size=_READ_BLOCK),
                encoding="utf-8-sig",
                errors="surrogateescape",  # a row with bytes that are not UTF-8 is rejected alone
                newline="",
            )
            yield _read_records(ConsumerCsvReader(text, hashed=hashed), processes)

    def finish_digest(self) -> str | None:
        """The SHA-256 of the whole file when it was read front to back (CSV), else None."""
        if self.format == "parquet":
            return None
        return self.sha256.hexdigest()


def _read_records(reader: ConsumerCsvReader, processes: int | None) -> Iterator[EncodedBatch]:
    try:
        yield from encoded_batches(reader, processes=processes)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise SourceError(f"read failed: {exc}") from None


class _DigestingReader(io.RawIOBase):
    """Counts and hashes the bytes read through it; a seek stops the hash (Parquet)."""

    def __init__(
        self, source: ConsumerSource, raw: IO[bytes], on_read: Callable[[int], None] | None
    ) -> None:
        self._source = source
        self._raw = raw
        self._on_read = on_read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readinto(self, buffer: Any) -> int:
        chunk = self._raw.read(len(buffer))
        count = len(chunk)
        buffer[:count] = chunk
        if count:
            self._source.bytes_read += count
            self._source.sha256.update(chunk)
            if self._on_read is not None:
                self._on_read(count)
        return count

    def close(self) -> None:
        self._raw.close()
        super().close()


# ---------------------------------------------------------------------------------------
# Finding the sources
# ---------------------------------------------------------------------------------------


def consumer_sources(
    spec: str, *, format: str | None = None, endpoint_url: str | None = None
) -> list[ConsumerSource]:
    """The files ``spec`` names, in the order they are read. Raises ``SourceError``."""
    if format is not None and format not in FORMATS:
        raise SourceError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if spec == "-":
        return [_stdin_source(format_of("-", format))]
    if spec.startswith("s3://"):
        return _s3_sources(spec, format=format, endpoint_url=endpoint_url)
    try:
        size = os.stat(spec).st_size
        if os.path.isdir(spec):
            raise SourceError(f"cannot read {spec}: is a directory")
        with open(spec, "rb"):
            pass
    except OSError as exc:
        raise SourceError(f"cannot read {spec}: {exc.strerror}") from None
    return [
        ConsumerSource(
            name=os.path.basename(spec),
            size=size,
            format=format_of(spec, format),
            _opener=lambda: open(spec, "rb", buffering=0),
        )
    ]


def _stdin_source(fmt: str) -> ConsumerSource:
    def opener() -> IO[bytes]:
        stdin = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
        if fmt != "parquet":
            return stdin
        # Parquet's footer is at the end: spool the stream to disk, then read it seekably.
        spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the caller)
        with stdin:
            shutil.copyfileobj(stdin, spool, _READ_BLOCK)
        spool.seek(0)
        return spool

    return ConsumerSource(name="stdin", size=None, format=fmt, _opener=opener)


def _s3_sources(spec: str, *, format: str | None, endpoint_url: str | None) -> list[ConsumerSource]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = spec.removeprefix("s3://").partition("/")
    if not bucket:
        raise SourceError(f"{spec}: no bucket; use s3://bucket/key or s3://bucket/prefix/")
    client = boto3.client("s3", endpoint_url=endpoint_url or None)
    try:
        if key and not key.endswith("/"):
            head = client.head_object(Bucket=bucket, Key=key)
            objects = [(key, int(head["ContentLength"]))]
        else:
            objects = []
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
            for page in pages:
                objects += [
                    (item["Key"], int(item["Size"]))
                    for item in page.get("Contents", [])
                    if not item["Key"].endswith("/")  # a folder marker, not a file
                ]
            objects.sort()  # name order (S3 lists in UTF-8 byte order; say so explicitly)
            if not objects:
                raise SourceError(f"{spec}: no objects under this prefix")
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise SourceError(
            f"{spec}: {error.get('Code') or 'error'}: {error.get('Message') or exc}"
        ) from None
    except BotoCoreError as exc:
        raise SourceError(f"{spec}: {exc}") from None
    return [
        ConsumerSource(
            name=f"s3://{bucket}/{name}",
            size=size,
            format=format_of(name, format),
            _opener=functools.partial(_S3Object, client, bucket, name, size),
        )
        for name, size in objects
    ]


class _S3Object(io.RawIOBase):
    """An S3 object as a seekable binary file: one streamed GET from the current offset,
    started again (with a Range) after a seek."""

    def __init__(self, client: Any, bucket: str, key: str, size: int) -> None:
        self._client = client
        self._bucket = bucket
        self._key = key
        self._size = size
        self._position = 0
        self._body: Any = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        target += offset
        if target != self._position:
            self._drop_body()
            self._position = target
        return self._position

    def readinto(self, buffer: Any) -> int:
        if self._position >= self._size:
            return 0
        if self._body is None:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                self._body = self._client.get_object(
                    Bucket=self._bucket, Key=self._key, Range=f"bytes={self._position}-"
                )["Body"]
            except (ClientError, BotoCoreError) as exc:
                raise OSError(f"s3://{self._bucket}/{self._key}: {exc}") from None
        chunk = self._body.read(len(buffer))
        buffer[: len(chunk)] = chunk
        self._position += len(chunk)
        return len(chunk)

    def _drop_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop_body()
        super().close()


# ---------------------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------------------


def _parquet_reader(
    raw: IO[bytes], name: str, *, hashed: bool, stack: contextlib.ExitStack
) -> ConsumerTableReader:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(raw)
    except (pa.ArrowException, OSError) as exc:
        raise RegistrationFileError(f"not a Parquet file: {exc}") from None
    stack.callback(parquet.close)
    columns = list(parquet.schema_arrow.names)

    def rows() -> Iterator[list[str]]:
        try:
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                # Every column as text: dates as YYYY-MM-DD, numbers as digits, nulls empty.
                cells = [
                    pc.fill_null(pc.cast(column, pa.string()), "").to_pylist()
                    for column in batch.columns
                ]
                yield from (list(row) for row in zip(*cells, strict=True))
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"read failed: {exc}") from None

    return ConsumerTableReader(columns, rows(), hashed=hashed)
