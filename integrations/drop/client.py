"""The DROP Data Broker API client: download packages, upload and amend response CSVs.

Every response of ``spec/drop-platform.md`` section 1 is handled here, so callers see a
result or one of a few exceptions (all ``DropApiError``)::

    client = DropClient(base_url_for(broker.mode, settings.DROP_API_URL), api_key,
                        on_call=ledger_hook)
    result = client.download(var_dir / "downloads")   # waits through 202 and 429, retries 5xx
    if result.kind == "package":
        import_zip(result.path)
    upload = client.upload([(name, csv_bytes)])
    upload.accepted_names, upload.rejected, upload.already_uploaded_names

The API key travels only in the ``X-API-KEY`` header: it is never put in a URL, an
exception message, a repr or a log record, and a server that echoes it back is redacted.
Redirects are not followed, so the header can never be replayed to another host.

Calls go through the one outbound stack (``outbound_http``): its sessions filter the target
address (no loopback, private or reserved address, no plain http) unless ``allow_private``
(``DROPPORTAL_ALLOW_PRIVATE_TARGETS``) opens them, use its TLS settings, and every attempt
ends within ``total_timeout`` by the wall clock, whatever DROP (or the network) does.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import unquote, urlsplit

import requests
from requests_hardened.ip_filter import InvalidIPAddress

from integrations.drop.files import REMOVED, DropFileError, parse_file_name
from integrations.outbound_http import Bound, bounded, build_session, describe_failure, tls_context

__all__ = [
    "PRODUCTION_URL",
    "SANDBOX_URL",
    "DownloadResult",
    "DropApiError",
    "DropAuthError",
    "DropBadRequest",
    "DropClient",
    "DropConflict",
    "DropPending",
    "DropProtocolError",
    "DropThrottled",
    "DropUnavailable",
    "UploadResult",
    "base_url_for",
    "tls_context",
]

log = logging.getLogger(__name__)

PRODUCTION_URL = "https://api.drop.privacy.ca.gov"
SANDBOX_URL = "https://api.drop.privacy.ca.gov/sandbox"
DOWNLOAD_PATH = "/data/download"
UPLOAD_PATH = "/data/upload"
AMEND_PATH = "/data/amend"

# The spec's examples; used when a 202 or 429 comes without a usable Retry-After.
DEFAULT_PENDING_RETRY_AFTER = 60.0
DEFAULT_THROTTLED_RETRY_AFTER = 30.0
# A Retry-After of 0 must not turn the wait loop into a busy loop.
MIN_RETRY_AFTER = 1.0

_ZIP_CONTENT_TYPES = frozenset(
    {"application/zip", "application/x-zip-compressed", "application/octet-stream", ""}
)
_RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})
_SAFE_FILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_ALREADY_UPLOADED_RE = re.compile(r"already\s+(?:been\s+)?uploaded", re.IGNORECASE)
_MESSAGE_LIMIT = 500
_ERROR_BODY_LIMIT = 64 * 1024
_CHUNK = 1 << 16

OnCall = Callable[[str, str, int | None, int, str], None]
"""``on_call(method, path, status, duration_ms, outcome)``: one call per HTTP attempt."""


class DropApiError(Exception):
    """DROP answered in a way the caller must act on; ``status`` is the HTTP status if any."""

    default_message = "DROP API error"

    def __init__(self, message: str | None = None, *, status: int | None = None) -> None:
        self.message = message or self.default_message
        self.status = status
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status})" if self.status else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, message={self.message!r})"


class DropAuthError(DropApiError):
    """401/403: the key is wrong, or the broker is not eligible or selected no list.

    Retrying cannot help: stop and alert staff.
    """

    default_message = "DROP refused the API key or the broker is not eligible"


class DropConflict(DropApiError):
    """409: on download, the previous download still has work items without a status
    (report first); on upload, no download waits for responses; on amend, not possible now."""

    default_message = "DROP reports a conflict with the current cycle"


class DropPending(DropApiError):
    """202 kept coming: DROP is still building the package after ``max_wait_seconds``."""

    default_message = "DROP is still preparing the package"


class DropUnavailable(DropApiError):
    """DROP or the network kept failing (5xx, timeouts, cut bodies) after bounded retries."""

    default_message = "DROP is unavailable"


class DropThrottled(DropUnavailable):
    """429 kept coming within ``max_wait_seconds``."""

    default_message = "DROP is throttling this broker"


class DropBadRequest(DropApiError):
    """400 without DROP's per-file answer: the request itself was malformed."""

    default_message = "DROP rejected the request"


class DropProtocolError(DropApiError):
    """DROP answered something the spec does not describe (unknown status, bad body)."""

    default_message = "DROP sent an unexpected response"


@dataclass(frozen=True)
class DownloadResult:
    """What ``download`` got: a package saved to disk (or a file object), or nothing new."""

    kind: Literal["package", "nothing_new"]
    message: str | None = None
    file_name: str | None = None
    path: Path | None = None
    size_bytes: int = 0
    sha256: str | None = None
    attempts: int = 1


@dataclass(frozen=True)
class UploadResult:
    """DROP's answer to an upload or amend, with earlier-uploaded names counted as accepted.

    ``rejected`` maps a file name to DROP's reason and leaves out "already uploaded"
    rejections, which are in ``already_uploaded_names`` (a retried upload lands there).
    """

    status: int
    message: str
    sent_names: tuple[str, ...]
    newly_accepted: dict[str, int | None]
    rejected: dict[str, str]
    already_uploaded_names: tuple[str, ...]
    accepted_count: int | None = None
    rejected_count: int | None = None
    attempts: int = 1

    @property
    def accepted_names(self) -> tuple[str, ...]:
        return (*self.newly_accepted, *self.already_uploaded_names)

    @property
    def unanswered_names(self) -> tuple[str, ...]:
        """Sent files DROP's answer does not mention at all."""
        answered = {*self.accepted_names, *self.rejected}
        return tuple(name for name in self.sent_names if name not in answered)

    @property
    def all_accepted(self) -> bool:
        accepted = set(self.accepted_names)
        return all(name in accepted for name in self.sent_names)


def base_url_for(mode: str, override: str | None = None) -> str:
    """DROP's base URL for a broker's mode (``production`` or ``test``); an override wins."""
    if override:
        return override.rstrip("/")
    if mode == "production":
        return PRODUCTION_URL
    if mode == "test":
        return SANDBOX_URL
    raise ValueError(f"unknown broker mode {mode!r}: expected 'production' or 'test'")


def _user_agent() -> str:
    try:
        version = metadata.version("dropportal")
    except metadata.PackageNotFoundError:
        version = "dev"
    return f"dropportal/{version}"


class _Secret:
    """Holds the API key so that no repr, debugger or traceback-with-locals shows it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<redacted>"


# What handling one HTTP attempt decided: finish, fail, wait (202/429) or retry (transient).
@dataclass
class _Done:
    value: Any
    outcome: str


@dataclass
class _Fail:
    error: DropApiError
    outcome: str


@dataclass
class _Wait:
    seconds: float
    outcome: str
    exhausted: DropApiError


@dataclass
class _Retry:
    outcome: str
    reason: str
    status: int | None = None


_Decision = _Done | _Fail | _Wait | _Retry


@dataclass
class _Budget:
    """Waiting and retry allowance of one ``download``/``upload``/``amend`` call."""

    started: float
    waited: float = 0.0
    failures: int = 0
    attempts: int = 0


class DropClient:
    """DROP's Data Broker API for one broker key; see the module docstring.

    Bounds, per ``download``/``upload``/``amend`` call: all waiting (202 and 429 Retry-After,
    backoff) stays within ``max_wait_seconds`` (a wait that would pass it raises at once
    instead of sleeping); transient failures (500/502/503/504, connection errors, timeouts,
    bodies cut short) are retried ``max_retries`` times with backoff ``backoff_seconds``,
    doubling, capped at ``max_backoff_seconds``. ``sleep`` and ``clock`` are injectable so
    tests never wait. ``timeout`` is (connect, each read); ``total_timeout`` bounds one
    attempt, body included, by the wall clock. ``allow_private`` lets the base URL be plain
    http or a loopback/private address (development and tests only).
    ``on_call`` is called after every HTTP attempt, with no header or body; an exception it
    raises propagates.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | tuple[float, float] = (5, 60),
        total_timeout: float = 300,
        max_wait_seconds: float = 600,
        max_retries: int = 4,
        backoff_seconds: float = 2.0,
        max_backoff_seconds: float = 60.0,
        allow_private: bool = False,
        on_call: OnCall | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"DROP base URL must be an http(s) URL, got {base_url!r}")
        if parts.scheme == "http" and not allow_private:
            raise ValueError(
                "DROP base URL must use https (plain http only with "
                "DROPPORTAL_ALLOW_PRIVATE_TARGETS)"
            )
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("DROP base URL must not carry a query, fragment or credentials")
        if (
            not isinstance(api_key, str)
            or not api_key
            or not all(33 <= ord(char) <= 126 for char in api_key)
        ):
            # The value is deliberately not echoed: it may be a real key with a typo.
            raise ValueError("DROP API key must be non-empty printable ASCII without spaces")
        self.base_url = base_url.rstrip("/")
        self._api_key = _Secret(api_key)
        self.timeout = timeout
        self.total_timeout = total_timeout
        self.max_wait_seconds = max_wait_seconds
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.on_call = on_call
        self._sleep = sleep
        self._clock = clock
        self.session = build_session(allow_private)
        self._bound: Bound | None = None  # the attempt in flight
        self.user_agent = _user_agent()

    def __repr__(self) -> str:
        return f"DropClient(base_url={self.base_url!r})"

    # ---------------------------------------------------------------- download

    def download(self, dest: str | os.PathLike[str] | IO[bytes]) -> DownloadResult:
        """Fetch the current package into a directory (atomically) or a binary file object.

        A directory gets the file under the name from Content-Disposition; a different file
        already under that name is kept and the new one gets ``-1``, ``-2``... appended; the
        same bytes under the same name are not stored twice. A body cut short leaves no file
        behind (a file object is truncated back, so it must be seekable to retry).
        """
        dest_dir: Path | None = None
        fileobj: IO[bytes] | None = None
        if isinstance(dest, str | os.PathLike):
            dest_dir = Path(dest)
            if not dest_dir.is_dir():
                raise ValueError(f"download destination {dest_dir} is not a directory")
        else:
            fileobj = dest

        def send() -> requests.Response:
            return self.session.get(
                self.base_url + DOWNLOAD_PATH,
                headers=self._headers(
                    {"Accept": "application/zip, application/json", "Accept-Encoding": "identity"}
                ),
                timeout=self.timeout,
                stream=True,
                allow_redirects=False,
            )

        def handle(response: requests.Response) -> _Decision:
            return self._handle_download(response, dest_dir, fileobj)

        result: DownloadResult = self._run("GET", DOWNLOAD_PATH, send, handle)
        return result

    def _handle_download(
        self, response: requests.Response, dest_dir: Path | None, fileobj: IO[bytes] | None
    ) -> _Decision:
        status = response.status_code
        if status == 200:
            content_type = _content_type(response)
            if content_type == "application/json" or content_type.endswith("+json"):
                body = _json_body(response)
                if not isinstance(body, dict):
                    return _Fail(
                        DropProtocolError("200 JSON answer without a message", status=status),
                        "unexpected",
                    )
                message = self._redact(str(body.get("message") or "nothing new"))
                return _Done(DownloadResult(kind="nothing_new", message=message), "nothing_new")
            if content_type not in _ZIP_CONTENT_TYPES:
                return _Fail(
                    DropProtocolError(
                        f"200 answer with content type {content_type!r}, expected a ZIP",
                        status=status,
                    ),
                    "unexpected",
                )
            try:
                file_name = _attachment_name(response.headers.get("Content-Disposition"))
            except DropProtocolError as exc:
                exc.status = status
                return _Fail(exc, "unexpected")
            return self._save_package(response, file_name, dest_dir, fileobj)
        if status == 202:
            return _Wait(
                _retry_after(response, DEFAULT_PENDING_RETRY_AFTER),
                "pending",
                DropPending(
                    f"DROP still prepares the package after {self.max_wait_seconds:g} s of "
                    "waiting: try again later",
                    status=status,
                ),
            )
        return self._handle_common(
            response,
            conflict="DROP: the previous download still has work items without a status; "
            "report them first",
        )

    def _save_package(
        self,
        response: requests.Response,
        file_name: str,
        dest_dir: Path | None,
        fileobj: IO[bytes] | None,
    ) -> _Decision:
        expected = _content_length(response)
        digest = hashlib.sha256()
        size = 0
        temp_path: Path | None = None
        start = None
        if fileobj is not None:
            try:
                start = fileobj.tell() if fileobj.seekable() else None
            except OSError:
                start = None
        try:
            if dest_dir is not None:
                fd, temp_name = tempfile.mkstemp(
                    dir=dest_dir, prefix=".drop-download-", suffix=".part"
                )
                temp_path = Path(temp_name)
                out: IO[bytes] = os.fdopen(fd, "wb")
            else:
                assert fileobj is not None
                out = fileobj
            try:
                for chunk in response.iter_content(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                if self._bound is not None and self._bound.expired:
                    raise _BodyCutShort(f"timed out after {self.total_timeout:g} s")
                out.flush()
                if temp_path is not None:
                    os.fsync(out.fileno())
            finally:
                if temp_path is not None:
                    out.close()
            if expected is not None and size != expected:
                raise _BodyCutShort(f"got {size} of {expected} bytes")
            path = None
            if dest_dir is not None and temp_path is not None:
                path = _place_atomically(temp_path, dest_dir, file_name, digest.hexdigest())
                temp_path = None
        except (requests.RequestException, _BodyCutShort) as exc:
            self._discard(temp_path, fileobj, start)
            if fileobj is not None and start is None and size:
                return _Fail(
                    DropUnavailable(
                        "download cut short and the destination cannot be rewound to retry"
                    ),
                    "truncated",
                )
            return _Retry("truncated", f"download cut short: {self._redact(str(exc))}")
        except BaseException:
            self._discard(temp_path, fileobj, start)
            raise
        return _Done(
            DownloadResult(
                kind="package",
                file_name=file_name,
                path=path,
                size_bytes=size,
                sha256=digest.hexdigest(),
            ),
            "package",
        )

    @staticmethod
    def _discard(temp_path: Path | None, fileobj: IO[bytes] | None, start: int | None) -> None:
        if temp_path is not None:
            temp_path.unlink(missing_ok=True)
        if fileobj is not None and start is not None:
            fileobj.seek(start)
            fileobj.truncate()

    # ---------------------------------------------------------------- upload / amend

    def upload(self, files: Sequence[tuple[str, bytes | str | os.PathLike[str]]]) -> UploadResult:
        """POST response CSVs to ``/data/upload`` (new statuses for the current download)."""
        return self._post_files(
            UPLOAD_PATH, files, conflict="DROP: no active download waits for responses"
        )

    def amend(self, files: Sequence[tuple[str, bytes | str | os.PathLike[str]]]) -> UploadResult:
        """POST response CSVs to ``/data/amend`` (corrections of statuses already sent)."""
        return self._post_files(
            AMEND_PATH, files, conflict="DROP: an amendment is not possible in the current state"
        )

    def _post_files(
        self,
        path: str,
        files: Sequence[tuple[str, bytes | str | os.PathLike[str]]],
        *,
        conflict: str,
    ) -> UploadResult:
        if not files:
            raise ValueError("nothing to upload: give at least one response CSV")
        parts: list[tuple[str, bytes]] = []
        for name, content in files:
            try:
                parsed = parse_file_name(name)
            except DropFileError as exc:
                raise ValueError(f"cannot upload {name!r}: {exc.reason}") from None
            if parsed.data_type == REMOVED:
                raise ValueError(f"cannot upload {name!r}: no status is owed for Removed")
            if any(name == seen for seen, _ in parts):
                raise ValueError(f"cannot upload {name!r} twice in one call")
            body = content if isinstance(content, bytes) else Path(content).read_bytes()
            parts.append((name, body))
        sent_names = tuple(name for name, _ in parts)

        def send() -> requests.Response:
            return self.session.post(
                self.base_url + path,
                headers=self._headers({"Accept": "application/json"}),
                files=[("files", (name, body, "text/csv")) for name, body in parts],
                timeout=self.timeout,
                allow_redirects=False,
            )

        def handle(response: requests.Response) -> _Decision:
            status = response.status_code
            if status in (202, 400):
                body = _json_body(response)
                if isinstance(body, dict) and isinstance(body.get("rejected"), list):
                    result = self._upload_result(status, body, sent_names)
                    return _Done(result, "accepted" if status == 202 else "rejected")
                if status == 202:
                    return _Fail(
                        DropProtocolError(
                            "DROP accepted the upload but its answer is unreadable; uploading "
                            "again is safe (a repeat counts as already uploaded)",
                            status=status,
                        ),
                        "unexpected",
                    )
                return _Fail(
                    DropBadRequest(self._error_message(response), status=status), "bad_request"
                )
            return self._handle_common(response, conflict=conflict)

        result: UploadResult = self._run("POST", path, send, handle)
        return result

    def _upload_result(
        self, status: int, body: dict[str, Any], sent_names: tuple[str, ...]
    ) -> UploadResult:
        newly_accepted: dict[str, int | None] = {}
        for entry in body.get("accepted") or []:
            if isinstance(entry, dict) and isinstance(entry.get("fileName"), str):
                size = entry.get("fileSizeBytes")
                newly_accepted[entry["fileName"]] = size if isinstance(size, int) else None
        rejected: dict[str, str] = {}
        already: list[str] = []
        for entry in body.get("rejected") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("fileName"), str):
                continue
            name = entry["fileName"]
            reason = self._redact(str(entry.get("message") or "rejected"))
            if _ALREADY_UPLOADED_RE.search(reason):
                if name not in already:
                    already.append(name)
            else:
                rejected[name] = reason
        accepted_count = body.get("acceptedCount")
        rejected_count = body.get("rejectedCount")
        return UploadResult(
            status=status,
            message=self._redact(str(body.get("message") or "")),
            sent_names=sent_names,
            newly_accepted=newly_accepted,
            rejected=rejected,
            already_uploaded_names=tuple(already),
            accepted_count=accepted_count if isinstance(accepted_count, int) else None,
            rejected_count=rejected_count if isinstance(rejected_count, int) else None,
        )

    # ---------------------------------------------------------------- shared machinery

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        return {"X-API-KEY": self._api_key.value, "User-Agent": self.user_agent, **extra}

    def _failure(self, exc: requests.RequestException) -> str:
        """What kept the request from DROP, in a few words (``connection refused``)."""
        connect, total = self.timeout if isinstance(self.timeout, tuple) else (self.timeout,) * 2
        return describe_failure(exc, timeout_connect=connect, timeout_total=total)

    def _timed_out(self, exc: requests.RequestException | None, bound: Bound) -> str:
        if bound.expired:
            return f"DROP did not answer within {self.total_timeout:g} s"
        return f"DROP did not answer in time: {exc}"

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key.value, "[redacted]")

    def _redacted(self, error: DropApiError) -> DropApiError:
        """The last line of defence: whatever DROP echoed, the key leaves no exception."""
        error.message = self._redact(error.message)
        error.args = (error.message,)
        return error

    def _error_message(self, response: requests.Response) -> str:
        """DROP's error text: JSON ``{"message"}`` or plain text (401s come both ways)."""
        raw = b""
        try:
            for chunk in response.iter_content(_CHUNK):
                raw += chunk
                if len(raw) >= _ERROR_BODY_LIMIT:
                    break
        except requests.RequestException:
            pass
        text = raw.decode("utf-8", errors="replace").strip()
        message: str = text
        if text.startswith("{"):
            try:
                body = json.loads(text)
            except ValueError:
                body = None
            if isinstance(body, dict) and body.get("message"):
                message = str(body["message"])
        message = " ".join(message.split())
        if len(message) > _MESSAGE_LIMIT:
            message = message[:_MESSAGE_LIMIT] + "..."
        return self._redact(message or response.reason or f"HTTP {response.status_code}")

    def _handle_common(self, response: requests.Response, *, conflict: str) -> _Decision:
        """The statuses every endpoint shares: 401/403, 409, 429, 5xx, anything else."""
        status = response.status_code
        if status in (401, 403):
            what = "bad API key" if status == 401 else "broker not eligible or no list selected"
            return _Fail(
                DropAuthError(
                    f"DROP refused the call ({what}): {self._error_message(response)}",
                    status=status,
                ),
                "auth_error",
            )
        if status == 409:
            return _Fail(
                DropConflict(f"{conflict}: {self._error_message(response)}", status=status),
                "conflict",
            )
        if status == 429:
            return _Wait(
                _retry_after(response, DEFAULT_THROTTLED_RETRY_AFTER),
                "throttled",
                DropThrottled(
                    f"DROP kept throttling for {self.max_wait_seconds:g} s: try again later",
                    status=status,
                ),
            )
        if status in _RETRYABLE_STATUSES:
            return _Retry("server_error", self._error_message(response), status)
        return _Fail(
            DropProtocolError(
                f"unexpected answer from DROP: {self._error_message(response)}", status=status
            ),
            "unexpected",
        )

    def _report(
        self, method: str, path: str, status: int | None, began: float, outcome: str
    ) -> None:
        duration_ms = int((self._clock() - began) * 1000)
        log.info(
            "DROP %s %s -> %s in %d ms (%s)",
            method,
            path,
            status if status is not None else "no answer",
            duration_ms,
            outcome,
        )
        if self.on_call is not None:
            self.on_call(method, path, status, duration_ms, outcome)

    def _run(
        self,
        method: str,
        path: str,
        send: Callable[[], requests.Response],
        handle: Callable[[requests.Response], _Decision],
    ) -> Any:
        """Attempt, report each attempt to ``on_call``, and wait or retry within bounds."""
        budget = _Budget(started=self._clock())
        while True:
            budget.attempts += 1
            began = self._clock()
            status: int | None = None
            decision: _Decision
            with bounded(self.total_timeout) as bound:
                self._bound = bound
                try:
                    response = send()
                except InvalidIPAddress as exc:
                    decision = _Fail(
                        DropApiError(f"DROP base URL refused: {self._failure(exc)}"), "refused"
                    )
                except requests.RequestException as exc:
                    if bound.expired or isinstance(exc, requests.Timeout):
                        decision = _Retry("timeout", self._timed_out(exc, bound))
                    else:
                        reason = f"cannot reach DROP: {self._failure(exc)}"
                        decision = _Retry("connection_error", reason)
                except BaseException:
                    self._report(method, path, None, began, "error")
                    raise
                else:
                    with response:
                        if bound.expired:  # cut while the answer was coming in
                            decision = _Retry("timeout", self._timed_out(None, bound))
                        else:
                            status = response.status_code
                            try:
                                decision = handle(response)
                            except BaseException:
                                # A local failure (disk full, interrupted): still one attempt.
                                self._report(method, path, status, began, "error")
                                raise
                finally:
                    self._bound = None
            self._report(method, path, status, began, decision.outcome)

            if isinstance(decision, _Done):
                value = decision.value
                if isinstance(value, DownloadResult | UploadResult):
                    value = dataclasses.replace(value, attempts=budget.attempts)
                return value
            if isinstance(decision, _Fail):
                raise self._redacted(decision.error)
            if isinstance(decision, _Wait):
                delay = decision.seconds
                exhausted = decision.exhausted
            else:
                budget.failures += 1
                reason = self._redact(decision.reason)
                times = "once" if budget.failures == 1 else f"{budget.failures} times"
                exhausted = DropUnavailable(
                    f"DROP {method} {path} failed {times}; last: {reason}",
                    status=decision.status,
                )
                if budget.failures > self.max_retries:
                    raise self._redacted(exhausted)
                delay = min(
                    self.backoff_seconds * 2 ** (budget.failures - 1), self.max_backoff_seconds
                )
            elapsed = max(self._clock() - budget.started, budget.waited)
            if elapsed + delay > self.max_wait_seconds:
                raise self._redacted(exhausted)
            log.info("DROP %s %s: waiting %.1f s before the next attempt", method, path, delay)
            self._sleep(delay)
            budget.waited += delay


class _BodyCutShort(Exception):
    pass


def _content_type(response: requests.Response) -> str:
    return response.headers.get("Content-Type", "").split(";")[0].strip().lower()


def _content_length(response: requests.Response) -> int | None:
    if response.headers.get("Content-Encoding", "identity").lower() != "identity":
        return None  # the length is of the encoded body; urllib3 checks that one
    raw = response.headers.get("Content-Length")
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw)


def _json_body(response: requests.Response) -> Any:
    try:
        return json.loads(response.content)
    except (ValueError, requests.RequestException):
        return None


def _retry_after(response: requests.Response, default: float) -> float:
    """Retry-After as seconds (delta-seconds or an HTTP date), never below one second."""
    raw = (response.headers.get("Retry-After") or "").strip()
    seconds = default
    if raw.isdigit():
        seconds = float(raw)
    elif raw:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            when = None
        if when is not None and when.tzinfo is not None:
            seconds = when.timestamp() - time.time()
    return max(seconds, MIN_RETRY_AFTER)


def _attachment_name(header: str | None) -> str:
    """The package's file name from Content-Disposition, refusing anything path-like."""
    if not header:
        return time.strftime("%Y%m%d_DROP_download_%H%M%S.zip", time.gmtime())
    name: str | None = None
    star = re.search(r"filename\*\s*=\s*(?:UTF-8|utf-8)''([^;\s]+)", header)
    if star:
        name = unquote(star.group(1))
    else:
        plain = re.search(r'filename\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]+))', header)
        if plain:
            name = plain.group(1) if plain.group(1) is not None else plain.group(2)
            name = re.sub(r"\\(.)", r"\1", name)
    if not name:
        raise DropProtocolError("Content-Disposition names no file")
    if not _SAFE_FILE_NAME_RE.fullmatch(name) or ".." in name or not name.endswith(".zip"):
        raise DropProtocolError(
            f"refusing package file name {name[:80]!r}: expected a plain name ending in .zip"
        )
    return name


def _place_atomically(temp_path: Path, dest_dir: Path, file_name: str, sha256: str) -> Path:
    """Give the finished temp file its name without ever replacing a different file."""
    stem, suffix = os.path.splitext(file_name)
    for n in range(1000):
        candidate = dest_dir / (file_name if n == 0 else f"{stem}-{n}{suffix}")
        try:
            os.link(temp_path, candidate)
        except FileExistsError:
            if _file_sha256(candidate) == sha256:
                temp_path.unlink()
                return candidate
            continue
        except OSError:
            # No hard links here (some network or FUSE file systems): rename instead.
            if candidate.exists():
                continue
            os.replace(temp_path, candidate)
            _fsync_dir(dest_dir)
            return candidate
        temp_path.unlink()
        _fsync_dir(dest_dir)
        return candidate
    raise DropProtocolError(f"too many files named like {file_name} in {dest_dir}")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as existing:
        while chunk := existing.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
