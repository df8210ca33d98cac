"""A loopback stand-in for DROP's Data Broker API, for tests and demos. Not product code.

It speaks the wire format of docs/contracts.md §9 and §10 on 127.0.0.1, lets a test
script what DROP answers next, and records every request for assertions::

    with DropSimulator(api_key="sim-key") as drop:
        drop.queue_pending(times=2, retry_after=5)         # 202, 202, then ...
        drop.queue_package(build_drop_zip("4821", "20260312", {"Email": [(wid, h)]}))
        client = DropClient(drop.url, "sim-key", allow_private=True)
        client.download(tmp_path)
        client.upload([("20260312_4821_Email.csv", b"Id,Status\\r\\n" + ...)])
        drop.requests[-1].files                            # {"20260312_4821_Email.csv": b"..."}

Unscripted calls get DROP's default behaviour: a download answers "nothing new" (409 after a
package it served, until a response to it is uploaded: DROP's "report first"), an upload
or amend checks each file (name, ``Id,Status`` header, not uploaded or amended before for
the current download) and answers 202 or 400 in DROP's shape. An amendment before any
upload, or of a download DROP no longer amends (its date in ``closed_downloads``), gets 409
"not possible in the current state". A wrong ``X-API-KEY`` gets a plain-text 401.

It also plays DROP's side of the notification webhook (API 1.2.0)::

    drop.notify(url, "whsec_...", "download.ready", "download ready")   # the status answered

Run it by hand for a demo (``--zip`` queues a package; Ctrl-C stops)::

    python -m devtools.drop_simulator --port 8765 --api-key sim-key --zip 20260312_4821_DROP.zip

Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import email.message
import hashlib
import hmac
import io
import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any

from devtools.loopback import LoopbackServer, serve_in_thread

__all__ = [
    "ALREADY_UPLOADED_MESSAGE",
    "DropSimulator",
    "RecordedRequest",
    "build_drop_zip",
    "package_file_name",
    "work_items",
]

ALREADY_UPLOADED_MESSAGE = "A file with this name was already uploaded for the current download."
AMEND_CONFLICT_MESSAGE = "An amendment is not possible in the current state."
NOTHING_NEW_MESSAGE = "No new data is available since your last completed download."
STATUSES_OWED_MESSAGE = (
    "The previous download still has work items without a status. Report them first."
)
_RESPONSE_NAME_RE = re.compile(
    r"(?P<date>[0-9]{8})_(?P<broker>[0-9]{4})_(?:NDZ|Email|Phone|MAID|NameVIN|CTVID)"
    r"(?:_[A-Za-z0-9]{1,10})?\.csv"
)
_BASE62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


@dataclass
class RecordedRequest:
    """One request the simulator received, as it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class _Scripted:
    status: int
    headers: dict[str, str]
    body: bytes
    path: str | None = None
    delay: float = 0.0
    cut_after: int | None = None
    starts_download: bool = False
    # A slow body: ``chunk`` bytes every ``pace`` seconds; and a silence of ``stall_for``
    # seconds once ``stall_after`` bytes are out.
    pace: float = 0.0
    chunk: int = 1 << 16
    stall_after: int | None = None
    stall_for: float = 0.0
    # Answer a ``Range: bytes=N-`` (with an ``If-Range`` naming this body, or none) with a 206
    # of the rest; otherwise a Range is ignored (the whole body, 200).
    ranges: bool = False


def _json(status: int, payload: Mapping[str, Any], **kwargs: Any) -> _Scripted:
    headers = {"Content-Type": "application/json"}
    headers.update(kwargs.pop("headers", {}) or {})
    return _Scripted(status, headers, json.dumps(payload).encode(), **kwargs)


class DropSimulator:
    """A DROP API on a loopback port, in a background thread; use it as a context manager."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        api_key: str = "sim-key",
        broker_id: str | None = None,
        active_download: bool = False,
    ) -> None:
        self.host = host
        self.api_key = api_key
        self.broker_id = broker_id
        self.active_download = active_download
        self.requests: list[RecordedRequest] = []
        self.uploaded: dict[str, bytes] = {}
        self.amended: dict[str, bytes] = {}
        # Downloads (YYYYMMDD, as response file names start) whose amendments get 409.
        self.closed_downloads: set[str] = set()
        self._lock = threading.Lock()
        self._script: list[_Scripted] = []
        self._names_this_download: set[str] = set()
        self._ever_uploaded = False
        # A package served and no response uploaded for it yet: DROP refuses the next
        # download (409) until its work items have statuses; the first upload stands in for
        # "every one has a status".
        self._statuses_owed = False
        handler = type("DropSimulatorHandler", (_Handler,), {"simulator": self})
        self._server = LoopbackServer((host, port), handler)
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def sandbox_url(self) -> str:
        """The same server under DROP's sandbox prefix, as ``base_url_for("test")`` shapes it."""
        return self.url + "/sandbox"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> DropSimulator:
        if self._thread is None:
            self._thread = serve_in_thread(self._server, name="drop-simulator")
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> DropSimulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ scripting

    def queue_response(
        self,
        status: int,
        *,
        body: bytes | str | Mapping[str, Any] = b"",
        headers: Mapping[str, str] | None = None,
        times: int = 1,
        path: str | None = None,
        delay: float = 0.0,
    ) -> None:
        """Answer the next ``times`` calls (to ``path``, or to any path) with this response.

        A mapping body is sent as JSON, a str as plain text. ``delay`` sleeps before
        answering (to trip a client's read timeout).
        """
        all_headers: dict[str, str] = {}
        if isinstance(body, Mapping):
            raw = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
        elif isinstance(body, str):
            raw = body.encode()
            all_headers["Content-Type"] = "text/plain; charset=utf-8"
        else:
            raw = body
        all_headers.update(headers or {})
        for _ in range(times):
            self._push(_Scripted(status, dict(all_headers), raw, path=path, delay=delay))

    def queue_package(
        self,
        zip_bytes: bytes,
        filename: str | None = None,
        *,
        cut_after: int | None = None,
        content_disposition: str | None = None,
        pace: float = 0.0,
        chunk: int = 1 << 16,
        stall_after: int | None = None,
        stall_for: float = 0.0,
        ranges: bool = False,
    ) -> None:
        """Serve a ZIP package on the next download; it starts a new download cycle.

        ``cut_after=n`` announces the full Content-Length but sends only ``n`` bytes and
        closes the connection, as a network failure mid-body would. A slow line: ``pace``
        seconds between pieces of ``chunk`` bytes; a stalled one: nothing for ``stall_for``
        seconds once ``stall_after`` bytes are out (then the rest, if the client still
        listens). ``ranges``: a ``Range: bytes=N-`` gets a 206 with the bytes from N (the
        counts above are then of the bytes sent), announced by ``Accept-Ranges`` and a strong
        ``ETag``; without it a Range is ignored, as a server that does not honour it does.
        """
        name = filename or _package_name_from_zip(zip_bytes)
        headers = {
            "Content-Type": "application/zip",
            "Content-Disposition": content_disposition or f'attachment; filename="{name}"',
        }
        self._push(
            _Scripted(
                200,
                headers,
                zip_bytes,
                path="/data/download",
                cut_after=cut_after,
                starts_download=True,
                pace=pace,
                chunk=chunk,
                stall_after=stall_after,
                stall_for=stall_for,
                ranges=ranges,
            )
        )

    def queue_nothing_new(self, message: str = NOTHING_NEW_MESSAGE) -> None:
        self._push(_json(200, {"message": message}, path="/data/download"))

    def queue_pending(self, times: int = 1, retry_after: int | str = 60) -> None:
        """Answer the next ``times`` downloads with 202 and ``Retry-After``."""
        for _ in range(times):
            self._push(
                _json(
                    202,
                    {"message": "Your download is being prepared."},
                    headers={"Retry-After": str(retry_after)},
                    path="/data/download",
                )
            )

    def _push(self, scripted: _Scripted) -> None:
        with self._lock:
            self._script.append(scripted)

    def calls(self, path: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if path is None or r.path == path]

    # ------------------------------------------------------------ notifying the broker

    def notify(
        self,
        url: str,
        secret: str,
        event_type: str,
        message: str,
        *,
        event_id: str | None = None,
        now: datetime.datetime | None = None,
    ) -> int:
        """POST one notification to the broker's webhook ``url`` as DROP 1.2.0 does, signed
        with ``secret`` (the one DROP's portal shows); returns the HTTP status it got.

        Pass the same ``event_id`` again for a redelivery of one event.
        """
        body = json.dumps({"message": message}, separators=(",", ":")).encode()
        moment = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
        # ISO 8601 UTC with 7 fractional digits, as DROP writes it.
        timestamp = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}0Z"
        digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
        request = urllib.request.Request(  # noqa: S310  (a loopback URL the caller gives)
            url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "X-Webhook-Event-Id": event_id or str(uuid.uuid4()),
                "X-Webhook-Event-Type": event_type,
                "X-Webhook-Delivery-Id": str(uuid.uuid4()),
                "X-Webhook-Timestamp": timestamp,
                "X-Webhook-Version": "1.0",
                "X-Webhook-Signature": "sha256=" + digest.hexdigest(),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    # ------------------------------------------------------------ answering

    def _answer(self, request: RecordedRequest) -> _Scripted:
        if request.headers.get("X-API-KEY") != self.api_key:
            return _Scripted(401, {"Content-Type": "text/plain"}, b"Unauthorized")
        path = request.path
        with self._lock:
            for index, scripted in enumerate(self._script):
                if scripted.path is None or scripted.path == path:
                    del self._script[index]
                    if scripted.starts_download:
                        self.active_download = True
                        self._statuses_owed = True
                        self._names_this_download.clear()
                    return scripted
            statuses_owed = self._statuses_owed
        if request.method == "GET" and path == "/data/download":
            if statuses_owed:
                return _json(409, {"message": STATUSES_OWED_MESSAGE})
            return _json(200, {"message": NOTHING_NEW_MESSAGE})
        if request.method == "POST" and path in {"/data/upload", "/data/amend"}:
            return self._accept_files(request)
        return _json(404, {"message": "Not found."})

    def _accept_files(self, request: RecordedRequest) -> _Scripted:
        amend = request.path == "/data/amend"
        with self._lock:
            if amend and (
                not self._ever_uploaded
                or any(name[:8] in self.closed_downloads for name in request.files)
            ):
                return _json(409, {"message": AMEND_CONFLICT_MESSAGE})
            if not amend and not self.active_download:
                return _json(409, {"message": "No active download is waiting for responses."})
            accepted: list[dict[str, Any]] = []
            rejected: list[dict[str, str]] = []
            for name, content in request.files.items():
                reason = self._check_file(name, content, amend=amend)
                if reason:
                    rejected.append({"fileName": name, "message": reason})
                    continue
                accepted.append({"fileName": name, "fileSizeBytes": len(content)})
                (self.amended if amend else self.uploaded)[name] = content
                self._names_this_download.add(name)
                if not amend:
                    self._ever_uploaded = True
                    self._statuses_owed = False
        body = {
            "message": f"{len(accepted)} file(s) accepted, {len(rejected)} rejected."
            if request.files
            else "No files were provided in the 'files' field.",
            "acceptedCount": len(accepted),
            "rejectedCount": len(rejected),
            "accepted": accepted,
            "rejected": rejected,
        }
        return _json(202 if accepted else 400, body)

    def _check_file(self, name: str, content: bytes, *, amend: bool) -> str | None:
        match = _RESPONSE_NAME_RE.fullmatch(name)
        if match is None:
            return (
                "Invalid file name: expected <YYYYMMDD>_<DataBrokerId>_<DataType>[_<Suffix>].csv."
            )
        if self.broker_id is not None and match["broker"] != self.broker_id:
            return "The data broker id in the file name does not match your account."
        if content.split(b"\n", 1)[0].rstrip(b"\r") != b"Id,Status":
            return "Invalid file header: expected Id,Status."
        if name in self._names_this_download:
            return ALREADY_UPLOADED_MESSAGE
        return None


class _Handler(BaseHTTPRequestHandler):
    simulator: DropSimulator
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # headers and body leave in one write

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        if path.startswith("/sandbox/"):
            path = path[len("/sandbox") :]
        request = RecordedRequest(
            method=self.command,
            path=path,
            headers=dict(self.headers.items()),
            body=body,
            files=_multipart_files(self.headers.get("Content-Type", ""), body),
        )
        simulator = self.simulator
        with simulator._lock:
            simulator.requests.append(request)
        answer = _ranged(simulator._answer(request), request.headers)
        if answer.delay:
            time.sleep(answer.delay)
        try:
            self.send_response(answer.status)
            headers = {"Content-Length": str(len(answer.body)), **answer.headers}
            for name, value in headers.items():
                self.send_header(name, value)
            if answer.cut_after is not None:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            sent = answer.body if answer.cut_after is None else answer.body[: answer.cut_after]
            self._write_body(answer, sent)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _write_body(self, answer: _Scripted, body: bytes) -> None:
        if not answer.pace and answer.stall_after is None:
            self.wfile.write(body)
            self.wfile.flush()
            return
        position = 0
        while position < len(body):
            end = min(position + answer.chunk, len(body))
            if answer.stall_after is not None and position < answer.stall_after < end:
                end = answer.stall_after
            self.wfile.write(body[position:end])
            self.wfile.flush()
            position = end
            if position == answer.stall_after:
                time.sleep(answer.stall_for)
            elif answer.pace and position < len(body):
                time.sleep(answer.pace)


def package_etag(body: bytes) -> str:
    """The strong ``ETag`` a package queued with ``ranges`` is served with."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _ranged(answer: _Scripted, headers: Mapping[str, str]) -> _Scripted:
    """``answer`` as served for a request with these headers: its rest (206) for a Range the
    answer honours, else itself."""
    if not answer.ranges:
        return answer
    etag = package_etag(answer.body)
    served = replace(answer, headers={**answer.headers, "Accept-Ranges": "bytes", "ETag": etag})
    asked = re.fullmatch(r"bytes=([0-9]+)-", headers.get("Range", "").strip())
    if_range = headers.get("If-Range")
    if asked is None or (if_range is not None and if_range != etag):
        return served
    first, size = int(asked[1]), len(answer.body)
    if first >= size:
        return _Scripted(416, {"Content-Range": f"bytes */{size}"}, b"", path=answer.path)
    served.headers["Content-Range"] = f"bytes {first}-{size - 1}/{size}"
    return replace(served, status=206, body=answer.body[first:])


def _multipart_files(content_type: str, body: bytes) -> dict[str, bytes]:
    """The ``files`` parts of a multipart/form-data body, as {file name: exact bytes}."""
    header = email.message.Message()
    header["Content-Type"] = content_type
    if header.get_content_type() != "multipart/form-data":
        return {}
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        return {}
    files: dict[str, bytes] = {}
    for part in body.split(b"--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break
        part = part.removeprefix(b"\r\n")
        raw_headers, _, content = part.partition(b"\r\n\r\n")
        content = content.removesuffix(b"\r\n")
        part_headers = email.message.Message()
        for line in raw_headers.decode("utf-8", "replace").split("\r\n"):
            key, _, value = line.partition(":")
            if value:
                part_headers[key.strip()] = value.strip()
        field_name = part_headers.get_param("name", header="content-disposition")
        file_name = part_headers.get_param("filename", header="content-disposition")
        if field_name == "files" and isinstance(file_name, str):
            # A repeated name keeps its first part here; the simulator answers both anyway.
            files.setdefault(file_name, content)
    return files


def _package_name_from_zip(zip_bytes: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(zip_bytes)) as archive:
            for name in archive.namelist():
                match = re.match(r"([0-9]{8})_([0-9]{4})_", name)
                if match:
                    return f"{match[1]}_{match[2]}_DROP.zip"
    except zipfile.BadZipFile:
        pass
    return "DROP.zip"


# ---------------------------------------------------------------- building packages


def package_file_name(broker_id: str, date: datetime.date | str) -> str:
    return f"{_yyyymmdd(date)}_{broker_id}_DROP.zip"


def _yyyymmdd(date: datetime.date | str) -> str:
    return date.strftime("%Y%m%d") if isinstance(date, datetime.date) else date


def build_drop_zip(
    broker_id: str,
    date: datetime.date | str,
    lists: Mapping[str, Iterable[tuple[str, str]]],
    removed: Iterable[tuple[str, str, str]] | None = None,
    *,
    line_ending: str = "\r\n",
) -> bytes:
    """A DROP download ZIP: one ``ID,Hash`` CSV per list, and a Removed CSV if given.

    ``lists`` maps a DROP data type (``"Email"``) to ``(work item id, hash)`` pairs; an
    empty iterable gives a header-only file. ``removed`` holds ``(id, hash, list type)``.
    Rows are written as given, unvalidated, so tests can build bad packages too.
    """
    day = _yyyymmdd(date)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for data_type, rows in lists.items():
            with archive.open(f"{day}_{broker_id}_{data_type}.csv", "w") as member:
                _write_csv(member, ("ID", "Hash"), rows, line_ending)
        if removed is not None:
            with archive.open(f"{day}_{broker_id}_Removed.csv", "w") as member:
                _write_csv(member, ("ID", "Hash", "ListType"), removed, line_ending)
    return buffer.getvalue()


def _write_csv(
    member: Any, header: tuple[str, ...], rows: Iterable[tuple[str, ...]], line_ending: str
) -> None:
    pending = [",".join(header) + line_ending]
    for row in rows:
        pending.append(",".join(row) + line_ending)
        if len(pending) >= 8192:
            member.write("".join(pending).encode())
            pending.clear()
    member.write("".join(pending).encode())


def work_items(count: int, *, start: int = 0) -> Iterator[tuple[str, str]]:
    """Deterministic, unique ``(work item id, hash)`` pairs for tests and benches."""
    for number in range(start, start + count):
        digits = []
        value = number
        for _ in range(12):
            value, digit = divmod(value, 62)
            digits.append(_BASE62[digit])
        work_item_id = "".join(reversed(digits))
        digest = hashlib.sha256(work_item_id.encode()).digest()
        yield work_item_id, base64.b64encode(digest).decode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a loopback DROP stand-in.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--api-key", default="sim-key")
    parser.add_argument("--zip", action="append", default=[], help="a package to serve")
    args = parser.parse_args(argv)
    with DropSimulator(args.host, args.port, api_key=args.api_key) as drop:
        for path in args.zip:
            with open(path, "rb") as package:
                drop.queue_package(package.read(), path.rsplit("/", 1)[-1])
        print(f"DROP simulator on {drop.url} (Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
