"""Where a broker's consumer file comes from, and how its rows are read, a stream at a time.

A source is a path, ``-`` (standard input), ``s3://bucket/key`` or ``s3://bucket/prefix/``
(every object under the prefix, in name order). Each file's format is found from its name
(``.csv``, ``.csv.gz``, ``.parquet``) or given::

    found = consumer_sources("s3://exports/consumers/", endpoint_url=None)
    for source in found.files:                               # found.skipped: markers
        with source.open_records(hashed=False) as batches:   # header checked here
            for batch in batches: ...                        # EncodedBatch, in file order
        source.finish_digest()                               # the file's SHA-256

Nothing is read whole: CSV is decoded as it streams (gzip included), a line at most
``CSV_LINE_MAX`` characters, Parquet one record batch at a time, each about
``PARQUET_BATCH_BYTES`` decoded and at most ``PARQUET_BATCH_MAX_BYTES``. An S3 object is read
through boto3 (its usual credential chain); a seek, which Parquet's footer and column chunks
need, starts a ranged GET at the new offset, each pinned to the ETag the object had when it
was listed, so an object replaced mid-read fails instead of mixing two versions. A plain
``http://`` endpoint is refused except on loopback. Standard input in Parquet is spooled to a
temporary file first (Parquet cannot be read without seeking).

Under an S3 prefix, marker objects are skipped, not read: empty objects and names whose
last segment starts with ``_`` or ``.`` (Spark's and Glue's ``_SUCCESS``, ``.crc``
checksums); ``consumer_sources`` names them in ``Sources.skipped``.

Each file's SHA-256 is taken as it is read (``finish_digest``); Parquet's reads jump
about, so the bytes its reader skipped are read once more at the end (usually just the
footer).

``s3_object_put`` writes one object through the same client and endpoint rule (a directive
to a service provider's prefix).

A source that cannot be read raises ``SourceError`` with one line that says why. Pure
protocol code: no database, no Django settings (the caller passes the endpoint).

The same store takes an export (``drop suppression export --out s3://bucket/key``), under
the same endpoint rules, streamed as a multipart upload that only completes when the whole
file was written (``s3_upload``)::

    with s3_upload("s3://warehouse/suppressed.csv", endpoint_url=None) as out:
        out.write(chunk)                     # any error: the upload is aborted, no object
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
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final

from integrations.client_address import is_loopback_host
from integrations.consumers.readers import (
    CSV_LINE_MAX,
    ConsumerCsvReader,
    ConsumerTableReader,
    RegistrationFileError,
)
from integrations.consumers.workers import EncodedBatch, encoded_batches
from integrations.url_extras import without_url_extras

__all__ = [
    "CSV_LINE_MAX",
    "FORMATS",
    "PARQUET_BATCH_BYTES",
    "PARQUET_BATCH_MAX_BYTES",
    "PARQUET_BATCH_ROWS",
    "ConsumerSource",
    "SourceError",
    "Sources",
    "consumer_sources",
    "format_of",
    "s3_upload",
]

FORMATS: Final = ("csv", "csv.gz", "parquet")
PARQUET_BATCH_ROWS: Final = 65_536  # rows decoded at a time from a Parquet file, at most
# A record batch is decoded whole, then turned into Python strings (several times its Arrow
# size), so its rows are also capped by bytes: a file of wide rows (a free-text column, a
# blob) would otherwise take gigabytes per batch. The row count is sized from the row
# groups' uncompressed sizes to about PARQUET_BATCH_BYTES; a batch that still decodes to
# more than PARQUET_BATCH_MAX_BYTES (rows far wider than their row group's average) is
# refused, naming its rows. A consumer row is well under 1 KiB: 64 MiB is ~65,536 of them.
PARQUET_BATCH_BYTES: Final = 64 << 20
PARQUET_BATCH_MAX_BYTES: Final = 256 << 20
_READ_BLOCK: Final = 1 << 20
# Parquet's reader seeks past a few bytes (the leading magic number, page padding): a gap up
# to this size is read through, so that the file's SHA-256 can go on in order instead of
# reading the gap again at the end.
_DIGEST_GAP: Final = 1 << 20


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
    unused_columns: str = ""  # the reader's note on columns that give no hash, once opened

    def open_raw(self, on_read: Callable[[int], None] | None = None) -> _DigestingReader:
        """The file's bytes, counted and hashed in order as they are read."""
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
            digesting = stack.enter_context(self.open_raw(on_read))
            raw: Any = digesting
            if self.format == "parquet":
                reader = _parquet_reader(raw, self.name, hashed=hashed, stack=stack)
                self.unused_columns = reader.unused_columns
                yield _read_records(reader, processes)
                # Read to the end what the Parquet reader skipped or read out of order
                # (its footer, first): the digest covers the whole file, in order.
                try:
                    digesting.digest_rest()
                except OSError as exc:
                    raise SourceError(f"read failed: {exc}") from None
                return
            if self.format == "csv.gz":
                raw = stack.enter_context(_Gunzipped(raw))
            else:
                raw = _CheckedCsv(raw)
            text = io.TextIOWrapper(
                io.BufferedReader(raw, buffer_size=_READ_BLOCK),
                encoding="utf-8-sig",
                errors="surrogateescape",  # a row with bytes that are not UTF-8 is rejected alone
                newline="",
            )
            csv_reader = ConsumerCsvReader(text, hashed=hashed)
            self.unused_columns = csv_reader.unused_columns
            yield _read_records(csv_reader, processes)

    def finish_digest(self) -> str:
        """The SHA-256 of the whole file, once its records have all been read."""
        return self.sha256.hexdigest()


# A file's first bytes, for what is surely not CSV text: without this a gzip file read as
# CSV is refused as "not UTF-8 text (a UTF-16 file?)", which hides the way to read it.
_NOT_CSV: Final = (
    (b"\x1f\x8b", "gzip-compressed: read it with --format csv.gz (or name it .csv.gz)"),
    (b"PAR1", "a Parquet file: read it with --format parquet (or name it .parquet)"),
    (b"PK\x03\x04", "a ZIP archive, which no format reads: unzip it and import the CSV in it"),
)


class _CheckedCsv(io.RawIOBase):
    """``raw`` as it is, its first bytes checked (``_NOT_CSV``) as the first read returns
    them: no read of its own, so the file is read, and its digest taken, as before."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if count and not self._checked:
            self._checked = True
            head = bytes(memoryview(buffer)[: min(count, 4)])
            for magic, what in _NOT_CSV:
                if head.startswith(magic):
                    raise SourceError(f"not CSV text: the file is {what}")
        return int(count or 0)


def _read_records(reader: ConsumerCsvReader, processes: int | None) -> Iterator[EncodedBatch]:
    try:
        yield from encoded_batches(reader, processes=processes)
    except OSError as exc:
        raise SourceError(f"read failed: {exc}") from None


class _Gunzipped(io.RawIOBase):
    """A gzip file's decompressed bytes. Damaged or cut gzip data raises ``SourceError``
    wherever it is met (the header's read or a row's): zlib raises its own error for a
    damaged deflate stream and gzip an ``EOFError`` for a cut one, neither an ``OSError``."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._gzip = gzip.GzipFile(fileobj=raw, mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._gzip.readinto(buffer)
        except (zlib.error, EOFError, gzip.BadGzipFile) as exc:
            raise SourceError(
                f"read failed: the gzip data is damaged or cut short: {exc}"
            ) from None

    def close(self) -> None:
        self._gzip.close()
        super().close()


class _DigestingReader(io.RawIOBase):
    """Counts the bytes read through it, and hashes them in file order: a read that goes on
    from the bytes hashed so far extends the hash, one elsewhere (Parquet's footer, first)
    does not, and ``digest_rest`` reads what is left. ``source.bytes_read`` is the length
    hashed: the file's size once the digest is complete."""

    def __init__(
        self, source: ConsumerSource, raw: IO[bytes], on_read: Callable[[int], None] | None
    ) -> None:
        self._source = source
        self._raw = raw
        self._on_read = on_read
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = self._raw.seek(offset, whence)
        hashed = self._source.bytes_read
        if hashed < target <= hashed + _DIGEST_GAP:
            self._raw.seek(hashed)  # read the gap through: the hash goes on in order
            self._position = hashed
            while self._position < target:
                if not self._read(min(target - self._position, _READ_BLOCK)):
                    break
            return self._position
        self._position = target
        return target

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        chunk = self._read(len(buffer))
        buffer[: len(chunk)] = chunk
        if chunk and self._on_read is not None:
            self._on_read(len(chunk))
        return len(chunk)

    def _read(self, size: int) -> bytes:
        chunk = self._raw.read(size)
        start, end = self._position, self._position + len(chunk)
        hashed = self._source.bytes_read
        if start <= hashed < end:
            self._source.sha256.update(memoryview(chunk)[hashed - start :])
            self._source.bytes_read = end
        self._position = end
        return chunk

    def digest_rest(self) -> None:
        """Hash the file to its end from where the hash stopped (after a seekable read)."""
        self._raw.seek(self._source.bytes_read)
        self._position = self._source.bytes_read
        while self._read(_READ_BLOCK):
            pass

    def close(self) -> None:
        self._raw.close()
        super().close()


# ---------------------------------------------------------------------------------------
# Finding the sources
# ---------------------------------------------------------------------------------------


@dataclass
class Sources:
    """The files to read, in order, and the marker objects skipped under an S3 prefix."""

    files: list[ConsumerSource]
    skipped: list[str] = field(default_factory=list)


def consumer_sources(
    spec: str, *, format: str | None = None, endpoint_url: str | None = None
) -> Sources:
    """The files ``spec`` names, in the order they are read. Raises ``SourceError``."""
    if format is not None and format not in FORMATS:
        raise SourceError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if spec == "-":
        return Sources([_stdin_source(format_of("-", format))])
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
    return Sources(
        [
            ConsumerSource(
                name=os.path.basename(spec),
                size=size,
                format=format_of(spec, format),
                _opener=lambda: open(spec, "rb", buffering=0),
            )
        ]
    )


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


def _endpoint_check(endpoint_url: str | None) -> None:
    """Refuse a plain-http S3 endpoint unless it is on loopback (a local MinIO, a test
    server): over http, the consumers' identifiers would cross the network in clear."""
    if not endpoint_url:
        return
    url = urllib.parse.urlsplit(endpoint_url)
    if url.scheme == "https":
        return
    host = url.hostname or ""
    if not host:  # "minio:9000": no scheme, so no host either
        raise SourceError("S3 endpoint: not a URL with a host; use https://host[:port]")
    try:
        port = url.port
    except ValueError:
        raise SourceError("S3 endpoint: its port is not a number") from None
    # Shown without any user:password the URL may carry.
    shown = f"{url.scheme}://{host}" + (f":{port}" if port else "")
    if url.scheme != "http":
        raise SourceError(f"S3 endpoint {shown}: use an https:// URL")
    if not is_loopback_host(host):
        raise SourceError(
            f"S3 endpoint {shown}: plain http is refused except on loopback "
            "(the consumer file would cross the network in clear); use https://"
        )


def _store_refusal(where: str, exc: Exception) -> SourceError:
    """The one line an S3 error becomes: the store's code and message, or the client's. The
    client's names the endpoint URL whole, ``user:password@`` included: cut to its place,
    since the line is kept and shown (a directive's delivery error)."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        said = f"{error.get('Code') or 'error'}: {error.get('Message') or exc}"
    else:
        said = str(exc)
    # One line: botocore's parameter errors run over several ("Invalid bucket name ...").
    return SourceError(f"{where}: {without_url_extras(' '.join(said.split()))}")


def _s3_client(where: str, endpoint_url: str | None) -> Any:
    """boto3's S3 client, or ``SourceError``: making it reads the credential chain's files
    and may refuse (``AWS_PROFILE`` naming no profile)."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.client("s3", endpoint_url=endpoint_url or None)
    except BotoCoreError as exc:
        raise _store_refusal(where, exc) from None


def _object_of(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key); a prefix or a bucket alone is refused."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket or not key or key.endswith("/"):
        raise SourceError(f"{uri}: name an object, s3://bucket/key")
    return bucket, key


def _is_marker(key: str, size: int, *, prefix: str) -> bool:
    """Whether an object under ``prefix`` is a marker, not a consumer file: empty, or named
    ``_...`` or ``.…`` (Spark's and Glue's ``_SUCCESS``, ``_committed_…``, ``.crc``), or in
    a folder so named below the prefix (a job's work in progress: Spark's ``_temporary/``,
    Hive's ``.hive-staging…/``, whose files a replacement must not take for the set)."""
    below = key[len(prefix) :] if key.startswith(prefix) else key
    return size == 0 or any(part.startswith(("_", ".")) for part in below.split("/"))


def _s3_sources(spec: str, *, format: str | None, endpoint_url: str | None) -> Sources:
    from botocore.exceptions import BotoCoreError, ClientError

    _endpoint_check(endpoint_url)
    bucket, _, key = spec.removeprefix("s3://").partition("/")
    if not bucket:
        raise SourceError(f"{spec}: no bucket; use s3://bucket/key or s3://bucket/prefix/")
    client = _s3_client(spec, endpoint_url)
    skipped: list[str] = []
    try:
        if key and not key.endswith("/"):
            head = client.head_object(Bucket=bucket, Key=key)
            objects = [(key, int(head["ContentLength"]), head["ETag"])]
        else:
            objects = []
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
            for page in pages:
                for item in page.get("Contents", []):
                    name, size = item["Key"], int(item["Size"])
                    if name.endswith("/"):
                        continue  # a folder marker, not a file
                    if _is_marker(name, size, prefix=key):
                        skipped.append(f"s3://{bucket}/{name}")
                        continue
                    objects.append((name, size, item["ETag"]))
            objects.sort()  # name order (S3 lists in UTF-8 byte order; say so explicitly)
            skipped.sort()
            if not objects:
                also = f" (skipped {len(skipped)} marker objects)" if skipped else ""
                raise SourceError(f"{spec}: no objects under this prefix{also}")
    except (BotoCoreError, ClientError) as exc:
        raise _store_refusal(spec, exc) from None
    files = [
        ConsumerSource(
            name=f"s3://{bucket}/{name}",
            size=size,
            format=format_of(name, format),
            _opener=functools.partial(_S3Object, client, bucket, name, size, etag),
        )
        for name, size, etag in objects
    ]
    return Sources(files, skipped)


def s3_object_put(uri: str, content: bytes, *, endpoint_url: str | None = None) -> None:
    """Write ``content`` to the object ``s3://bucket/key`` through the same client, endpoint
    rule and credential chain as the reads (a directive to a provider's prefix). Raises
    ``SourceError`` with one line."""
    from botocore.exceptions import BotoCoreError, ClientError

    _endpoint_check(endpoint_url)
    bucket, key = _object_of(uri)
    client = _s3_client(uri, endpoint_url)
    try:
        client.put_object(Bucket=bucket, Key=key, Body=content)
    except (BotoCoreError, ClientError) as exc:
        raise _store_refusal(uri, exc) from None


class _S3Object(io.RawIOBase):
    """An S3 object as a seekable binary file: one streamed GET from the current offset,
    started again (with a Range) after a seek. Every GET is pinned to the ETag the object
    was listed with (If-Match): an object replaced between two ranged reads fails the read
    instead of mixing two versions."""

    def __init__(self, client: Any, bucket: str, key: str, size: int, etag: str) -> None:
        self._client = client
        self._bucket = bucket
        self._key = key
        self._size = size
        self._etag = etag
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
        from botocore.exceptions import BotoCoreError, ClientError

        if self._position >= self._size:
            return 0
        name = f"s3://{self._bucket}/{self._key}"
        if self._body is None:
            try:
                self._body = self._client.get_object(
                    Bucket=self._bucket,
                    Key=self._key,
                    Range=f"bytes={self._position}-",
                    IfMatch=self._etag,
                )["Body"]
            except ClientError as exc:
                error = exc.response.get("Error", {})
                if error.get("Code") in ("PreconditionFailed", "412"):
                    raise OSError(
                        f"{name} changed while it was being read (its ETag is no longer "
                        f"{self._etag}); import it again"
                    ) from None
                raise OSError(f"{name}: {exc}") from None
            except BotoCoreError as exc:
                raise OSError(f"{name}: {exc}") from None
        try:
            chunk = self._body.read(len(buffer))
        except BotoCoreError as exc:
            # The connection lost mid-object (IncompleteReadError, ResponseStreamingError):
            # not an OSError, so a reader would end in a traceback.
            self._drop_body()
            raise OSError(f"{name}: {exc}") from None
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
# Writing to S3
# ---------------------------------------------------------------------------------------

# Parts of a multipart upload: S3 takes at least 5 MiB a part (but the last), at most
# 10,000 parts; 16 MiB parts carry 160 GB, and memory holds one part.
S3_PART_BYTES: Final = 16 << 20


@contextlib.contextmanager
def s3_upload(spec: str, *, endpoint_url: str | None) -> Iterator[io.RawIOBase]:
    """A binary stream whose bytes become the object ``spec`` (``s3://bucket/key``) once
    the block ends without error; on an error the upload is aborted and no object is left.
    Raises ``SourceError`` (one line) when the store refuses."""
    from botocore.exceptions import BotoCoreError, ClientError

    _endpoint_check(endpoint_url)
    bucket, key = _object_of(spec)
    client = _s3_client(spec, endpoint_url)
    try:
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    except (BotoCoreError, ClientError) as exc:
        raise _store_refusal(spec, exc) from None
    writer = _S3PartWriter(client, bucket, key, upload_id)
    try:
        yield writer
        writer.complete()
    except BaseException as exc:
        with contextlib.suppress(BotoCoreError, ClientError):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        if isinstance(exc, (BotoCoreError, ClientError)):
            raise _store_refusal(spec, exc) from None
        raise


class _S3PartWriter(io.RawIOBase):
    """Bytes written, sent as the parts of a multipart upload, one part held at a time."""

    def __init__(self, client: Any, bucket: str, key: str, upload_id: str) -> None:
        self._client = client
        self._where = {"Bucket": bucket, "Key": key, "UploadId": upload_id}
        self._part = bytearray()
        self._parts: list[dict[str, Any]] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._part += data
        if len(self._part) >= S3_PART_BYTES:
            self._send()
        return len(data)

    def _send(self) -> None:
        number = len(self._parts) + 1
        answer = self._client.upload_part(**self._where, PartNumber=number, Body=bytes(self._part))
        self._parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        self._part.clear()

    def complete(self) -> None:
        if self._part or not self._parts:  # the last part (an empty file: one empty part)
            self._send()
        self._client.complete_multipart_upload(
            **self._where, MultipartUpload={"Parts": self._parts}
        )


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
    batch_rows = _parquet_batch_rows(parquet.metadata)
    # A timestamp date of birth (a warehouse's DATE exported as TIMESTAMP) is read as its
    # date, in its own time zone when it has one: as text it would be "1985-07-04 00:00:00",
    # which is not a date, and the NDZ hash would be lost.
    dob = [column.strip().lower() == "dob" for column in columns]

    def cells(column: Any) -> list[str]:
        # Decoded cell by cell as a CSV file is (surrogateescape), so the readers reject
        # just the rows holding bytes that are not UTF-8 (not_utf8).
        binary = pc.fill_null(pc.cast(column, pa.large_binary()), b"")
        return [cell.decode("utf-8", "surrogateescape") for cell in binary.to_pylist()]

    def text(column: Any, is_dob: bool) -> list[str]:
        if is_dob and pa.types.is_timestamp(column.type):
            column = pc.cast(column, pa.date32())
        kind = column.type
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            # Strings written as bytes with no UTF-8 annotation (Impala, older Hive): a cast
            # to text checks every cell and refuses the whole column for one bad cell.
            return cells(column)
        # Every column as text: dates as YYYY-MM-DD, integers as digits, nulls empty.
        column = pc.fill_null(pc.cast(column, pa.string()), "")
        try:
            return column.to_pylist()
        except UnicodeDecodeError:
            # A writer that does not check UTF-8 left bytes that are not in a text column.
            # Valid columns never come here.
            return cells(column)

    def rows() -> Iterator[tuple[str, ...]]:
        first = 1
        try:
            for batch in parquet.iter_batches(batch_size=batch_rows):
                if batch.nbytes > PARQUET_BATCH_MAX_BYTES:
                    raise SourceError(
                        f"rows {first}-{first + batch.num_rows - 1} decode to "
                        f"{batch.nbytes:,} bytes, more than the {PARQUET_BATCH_MAX_BYTES:,} "
                        "a batch may take; rows this wide are not consumer records"
                    )
                first += batch.num_rows
                cells = [text(column, d) for column, d in zip(batch.columns, dob, strict=True)]
                yield from zip(*cells, strict=True)  # ConsumerTableReader lists each row
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"read failed: {exc}") from None

    reader = ConsumerTableReader(columns, rows(), hashed=hashed)  # the header checked first
    for column in parquet.schema_arrow:
        kind = column.type
        if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
            # As text a float is "1.4155551234e+10" or "91790.0": a wrong hash, stored.
            raise RegistrationFileError(
                f"column {column.name!r} is of type {kind}, which does not read back as the "
                "digits written; write it as text or integer (pandas writes an integer "
                "column with empty cells as float64: make it Int64 or text)"
            )
    return reader


def _parquet_batch_rows(metadata: Any) -> int:
    """Rows per record batch: ``PARQUET_BATCH_ROWS``, fewer when the widest row group's
    rows would make a batch of more than about ``PARQUET_BATCH_BYTES``."""
    widest = max(
        (
            group.total_byte_size / group.num_rows
            for group in map(metadata.row_group, range(metadata.num_row_groups))
            if group.num_rows
        ),
        default=0.0,
    )
    if widest <= 0:
        return PARQUET_BATCH_ROWS
    return max(1, min(PARQUET_BATCH_ROWS, int(PARQUET_BATCH_BYTES // widest)))
