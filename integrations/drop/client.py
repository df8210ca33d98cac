"""The DROP Data Broker API client: download packages, upload and amend response CSVs.

This module is the protocol: DROP's endpoints and what each status means (the bodies and
headers are read by ``drop.answers``: the package's file name, the per-file answers of an
upload). Every response of docs/contracts.md §9 is handled here, so callers see a result
or one of a few exceptions (all ``DropApiError``)::

    client = DropClient(base_url_for(broker.mode, settings.DROP_API_URL), api_key,
                        limits=DropLimits(stall_timeout=120), on_call=ledger_hook)
    result = client.download(var_dir / "downloads")   # waits through 202 and 429, retries 5xx
    if result.kind == "package":
        import_zip(result.path)
    upload = client.upload([(name, csv_bytes)])
    upload.accepted_names, upload.rejected, upload.already_uploaded_names

The API key travels only in the ``X-API-KEY`` header: it is never put in a URL, an
exception message, a repr or a log record, and a server that echoes it back is redacted.
Redirects are not followed, so the header can never be replayed to another host.

How the calls travel (attempts, waits, retries, bounded time, the package on disk) is
``drop.transport``, within its ``DropLimits``, over the one outbound stack
(``outbound_http``): its sessions filter the target address (no loopback, private or reserved
address; and ``target_urls`` refuses plain http) unless ``allow_private``
(``DROPPORTAL_ALLOW_PRIVATE_TARGETS``) opens them, use its TLS settings, and every attempt's
answer begins within ``total_timeout`` by the wall clock, whatever DROP (or the network)
does; a package's body then streams to disk for as long as it takes, cut only when no byte
comes for ``stall_timeout``, and the next attempt asks for the rest (HTTP Range) when DROP
honours it, for the whole otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import requests

from integrations.drop.answers import (
    DownloadResult,
    UploadResult,
    attachment_name,
    error_text,
    json_body,
    media_type,
    package_result,
    retry_after,
    upload_result,
)
from integrations.drop.errors import (
    DropApiError,
    DropAuthError,
    DropBadRequest,
    DropConflict,
    DropPending,
    DropProtocolError,
    DropThrottled,
    DropUnavailable,
)
from integrations.drop.files import REMOVED, DropFileError, parse_file_name
from integrations.drop.transport import (
    Decision,
    Done,
    DropLimits,
    Fail,
    OnCall,
    OnProgress,
    PartialBody,
    Retry,
    Transport,
    Wait,
)
from integrations.outbound_http import build_session
from integrations.redaction import text_redacted
from integrations.storable_text import storable
from integrations.target_urls import TargetUrlProblem, target_url_problem, url_has_extras
from integrations.url_extras import without_url_extras

__all__ = [
    "PRODUCTION_URL",
    "SANDBOX_URL",
    "DownloadResult",
    "DropApiError",
    "DropAuthError",
    "DropBadRequest",
    "DropClient",
    "DropConflict",
    "DropLimits",
    "DropPending",
    "DropProtocolError",
    "DropThrottled",
    "DropUnavailable",
    "UploadResult",
    "base_url_for",
    "drop_api_key_problem",
    "drop_base_url_problem",
]

PRODUCTION_URL = "https://api.drop.privacy.ca.gov"
SANDBOX_URL = "https://api.drop.privacy.ca.gov/sandbox"
DOWNLOAD_PATH = "/data/download"
UPLOAD_PATH = "/data/upload"
AMEND_PATH = "/data/amend"

# DROP's documented examples (§9.2); used when a 202 or 429 comes without a usable Retry-After.
DEFAULT_PENDING_RETRY_AFTER = 60.0
DEFAULT_THROTTLED_RETRY_AFTER = 30.0

_ZIP_CONTENT_TYPES = frozenset(
    {"application/zip", "application/x-zip-compressed", "application/octet-stream", ""}
)
_RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})


def base_url_for(mode: str, override: str | None = None) -> str:
    """DROP's base URL for a broker's mode (``production`` or ``test``); an override wins."""
    if override:
        return override.rstrip("/")
    if mode == "production":
        return PRODUCTION_URL
    if mode == "test":
        return SANDBOX_URL
    raise ValueError(f"unknown broker mode {mode!r}: expected 'production' or 'test'")


def drop_base_url_problem(base_url: str, *, allow_private: bool) -> str | None:
    """Why ``DropClient`` refuses ``base_url``, in one line; None when it takes it. The one
    home of the rule: where staff store a base URL, it is checked with this too."""
    problem = target_url_problem(base_url, allow_private=allow_private)
    if problem in (TargetUrlProblem.UNREADABLE, TargetUrlProblem.NOT_ABSOLUTE):
        # Printed and logged: a token in its query or a password stays out.
        return (
            f"DROP base URL must be an http(s) URL (a port is a number up to 65535), got "
            f"{without_url_extras(base_url)!r}"
        )
    if problem is TargetUrlProblem.PLAIN_HTTP:
        return (
            "DROP base URL must use https (plain http only with DROPPORTAL_ALLOW_PRIVATE_TARGETS)"
        )
    if problem is TargetUrlProblem.CREDENTIALS or url_has_extras(base_url):
        return "DROP base URL must not carry a query, fragment, ; parameters or credentials"
    return None


def drop_api_key_problem(api_key: object) -> str | None:
    """Why ``DropClient`` refuses ``api_key`` (it goes in a header as it is), in one line
    that never echoes it; None when it takes it. Checked where staff store a key too."""
    if (
        not isinstance(api_key, str)
        or not api_key
        or not all(33 <= ord(char) <= 126 for char in api_key)
    ):
        # The value is deliberately not echoed: it may be a real key with a typo.
        return "DROP API key must be non-empty printable ASCII without spaces"
    return None


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


class DropClient:
    """DROP's Data Broker API for one broker key; see the module docstring.

    ``limits`` bounds the time of each call and its retries (``DropLimits``; production's by
    default). ``allow_private`` lets the base URL be plain http or a loopback/private address
    (development and tests only). ``on_call`` is called after every HTTP attempt, with no
    header or body; an exception it raises propagates. ``sleep`` and ``clock`` are
    injectable so tests never wait.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        limits: DropLimits | None = None,
        allow_private: bool = False,
        on_call: OnCall | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        problem = drop_base_url_problem(base_url, allow_private=allow_private)
        problem = problem or drop_api_key_problem(api_key)
        if problem:
            raise ValueError(problem)
        self.base_url = base_url.rstrip("/")
        self._api_key = _Secret(api_key)
        self.session = build_session(allow_private)
        self.user_agent = _user_agent()
        self.transport = Transport(
            session=self.session,
            limits=limits or DropLimits(),
            on_call=on_call,
            sleep=sleep,
            clock=clock,
            redact=self._redact,
        )

    def __repr__(self) -> str:
        return f"DropClient(base_url={self.base_url!r})"

    @property
    def _max_wait(self) -> float:
        return self.transport.limits.max_wait_seconds

    # ---------------------------------------------------------------- download

    def download(
        self, dest: str | os.PathLike[str], *, on_progress: OnProgress | None = None
    ) -> DownloadResult:
        """Fetch the current package into the directory ``dest``, under the name from
        Content-Disposition (placed atomically: see ``transport.place_atomically``). A body cut
        short is resumed by the next attempt (``Range``) when DROP honours it; whatever the
        end, no part of a body is left behind. ``on_progress(received, announced)`` follows
        the body.
        """
        dest_dir = Path(dest)
        if not dest_dir.is_dir():
            raise ValueError(f"download destination {dest_dir} is not a directory")
        partial = PartialBody()

        def send() -> requests.Response:
            return self.session.get(
                self.base_url + DOWNLOAD_PATH,
                headers=self._headers(
                    {
                        "Accept": "application/zip, application/json",
                        "Accept-Encoding": "identity",
                        **partial.request_headers(),
                    }
                ),
                timeout=self.transport.limits.timeout,
                stream=True,
                allow_redirects=False,
            )

        def handle(response: requests.Response) -> Decision:
            return self._handle_download(response, dest_dir, on_progress, partial)

        try:
            result: DownloadResult = self._run("GET", DOWNLOAD_PATH, send, handle)
        finally:
            partial.discard()
        return result

    def _handle_download(
        self,
        response: requests.Response,
        dest_dir: Path,
        on_progress: OnProgress | None,
        partial: PartialBody,
    ) -> Decision:
        status = response.status_code
        if status == 416 and partial.size:
            return partial.refused("DROP refused the range", status)  # ask for the whole
        if status in (200, 206):
            content_type = media_type(response)
            is_json = content_type == "application/json" or content_type.endswith("+json")
            if status == 200 and is_json:
                body = json_body(response)
                if not isinstance(body, dict):
                    return Fail(
                        DropProtocolError("200 JSON answer without a message", status=status),
                        "unexpected",
                    )
                message = self._redact(str(body.get("message") or "nothing new"))
                return Done(DownloadResult(kind="nothing_new", message=message), "nothing_new")
            if content_type not in _ZIP_CONTENT_TYPES:
                return Fail(
                    DropProtocolError(
                        f"{status} answer with content type {content_type!r}, expected a ZIP",
                        status=status,
                    ),
                    "unexpected",
                )
            disposition = response.headers.get("Content-Disposition")
            try:
                # The rest of a package without a name is the rest of the one kept.
                if status == 206 and not disposition and partial.file_name:
                    file_name = partial.file_name
                else:
                    file_name = attachment_name(disposition, self._redact)
            except DropProtocolError as exc:
                exc.status = status
                return Fail(exc, "unexpected")
            received = self.transport.receive_file(
                response, dest_dir, file_name, on_progress, partial
            )
            if isinstance(received, Retry):
                return received
            return Done(package_result(file_name, received), "package")
        if status == 202:
            return Wait(
                retry_after(response, DEFAULT_PENDING_RETRY_AFTER),
                "pending",
                DropPending(
                    f"DROP still prepares the package after {self._max_wait:g} s of waiting: "
                    "try again later",
                    status=status,
                ),
            )
        return self._handle_common(
            response,
            conflict="DROP: the previous download still has work items without a status; "
            "report them first",
        )

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
                timeout=self.transport.limits.timeout,
                allow_redirects=False,
            )

        def handle(response: requests.Response) -> Decision:
            status = response.status_code
            if status in (202, 400):
                body = json_body(response)
                if isinstance(body, dict) and isinstance(body.get("rejected"), list):
                    result = upload_result(status, body, sent_names, self._redact)
                    return Done(result, "accepted" if status == 202 else "rejected")
                if status == 202:
                    return Fail(
                        DropProtocolError(
                            "DROP accepted the upload but its answer is unreadable; uploading "
                            "again is safe (a repeat counts as already uploaded)",
                            status=status,
                        ),
                        "unexpected",
                    )
                return Fail(
                    DropBadRequest(self._error_message(response), status=status), "bad_request"
                )
            return self._handle_common(response, conflict=conflict)

        result: UploadResult = self._run("POST", path, send, handle)
        return result

    # ---------------------------------------------------------------- shared machinery

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        return {"X-API-KEY": self._api_key.value, "User-Agent": self.user_agent, **extra}

    def _redact(self, text: str) -> str:
        # Every text of DROP's answers passes here on its way to a row and a ledger event:
        # one PostgreSQL cannot store (a NUL, an unpaired surrogate, both valid JSON escapes)
        # would make recording DROP's answer fail, a file DROP took never recorded as taken.
        return storable(text_redacted(text, [self._api_key.value]))

    def _error_message(self, response: requests.Response) -> str:
        return error_text(response, self._redact)

    def _handle_common(self, response: requests.Response, *, conflict: str) -> Decision:
        """The statuses every endpoint shares: 401/403, 409, 429, 5xx, anything else."""
        status = response.status_code
        if status in (401, 403):
            what = "bad API key" if status == 401 else "broker not eligible or no list selected"
            return Fail(
                DropAuthError(
                    f"DROP refused the call ({what}): {self._error_message(response)}",
                    status=status,
                ),
                "auth_error",
            )
        if status == 409:
            return Fail(
                DropConflict(f"{conflict}: {self._error_message(response)}", status=status),
                "conflict",
            )
        if status == 429:
            return Wait(
                retry_after(response, DEFAULT_THROTTLED_RETRY_AFTER),
                "throttled",
                DropThrottled(
                    f"DROP kept throttling for {self._max_wait:g} s: try again later",
                    status=status,
                ),
            )
        if status in _RETRYABLE_STATUSES:
            return Retry("server_error", self._error_message(response), status)
        return Fail(
            DropProtocolError(
                f"unexpected answer from DROP: {self._error_message(response)}", status=status
            ),
            "unexpected",
        )

    def _run(
        self,
        method: str,
        path: str,
        send: Callable[[], requests.Response],
        handle: Callable[[requests.Response], Decision],
    ) -> Any:
        """``transport.run``, with the attempts counted in the result and the key redacted
        from whatever is raised (the last line of defence: whatever DROP echoed)."""
        try:
            value, attempts = self.transport.run(method, path, send, handle)
        except DropApiError as error:
            error.message = self._redact(error.message)
            error.args = (error.message,)
            raise
        if isinstance(value, DownloadResult | UploadResult):
            value = dataclasses.replace(value, attempts=attempts)
        return value
