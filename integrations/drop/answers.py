"""What DROP's answers say, once read: the results of a download and of an upload, the
package's file name, DROP's error text, a Retry-After. The client (``drop.client``) decides
what each status means; this module reads the bodies and headers::

    name = attachment_name(response.headers.get("Content-Disposition"), redact)
    result = upload_result(202, json_body(response), sent_names, redact)
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

import requests

from integrations.drop.errors import DropProtocolError
from integrations.drop.transport import Received
from integrations.outbound_http import retry_after_seconds

# A Retry-After of 0 must not turn the wait loop into a busy loop.
MIN_RETRY_AFTER = 1.0
_SAFE_FILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_ALREADY_UPLOADED_RE = re.compile(r"already\s+(?:been\s+)?uploaded", re.IGNORECASE)
_MESSAGE_LIMIT = 500
_ERROR_BODY_LIMIT = 64 * 1024
_CHUNK = 1 << 16


@dataclass(frozen=True)
class DownloadResult:
    """What ``download`` got: a package saved to disk, or nothing new."""

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


def upload_result(
    status: int, body: dict[str, Any], sent_names: tuple[str, ...], redact: Callable[[str], str]
) -> UploadResult:
    """DROP's JSON answer to an upload or amend (``body``), its texts passed through
    ``redact``; "already uploaded" rejections count as accepted."""
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
        reason = redact(str(entry.get("message") or "rejected"))
        if _ALREADY_UPLOADED_RE.search(reason):
            if name not in already:
                already.append(name)
        else:
            rejected[name] = reason
    accepted_count = body.get("acceptedCount")
    rejected_count = body.get("rejectedCount")
    return UploadResult(
        status=status,
        message=redact(str(body.get("message") or "")),
        sent_names=sent_names,
        newly_accepted=newly_accepted,
        rejected=rejected,
        already_uploaded_names=tuple(already),
        accepted_count=accepted_count if isinstance(accepted_count, int) else None,
        rejected_count=rejected_count if isinstance(rejected_count, int) else None,
    )


def error_text(response: requests.Response, redact: Callable[[str], str]) -> str:
    """DROP's error text: JSON ``{"message"}`` or plain text (401s come both ways), on one
    line, passed through ``redact`` and then cut at 500 characters (cut first, a key echoed
    across the cut would survive in part)."""
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
        except (ValueError, RecursionError):  # nested deeper than Python's parser follows
            body = None
        if isinstance(body, dict) and body.get("message"):
            message = str(body["message"])
    message = redact(" ".join(message.split()))
    if len(message) > _MESSAGE_LIMIT:
        message = message[:_MESSAGE_LIMIT] + "..."
    return message or response.reason or f"HTTP {response.status_code}"


def media_type(response: requests.Response) -> str:
    """The Content-Type without its parameters, in lower case ("" when absent)."""
    return response.headers.get("Content-Type", "").split(";")[0].strip().lower()


def json_body(response: requests.Response) -> Any:
    try:
        return json.loads(response.content)
    except (ValueError, RecursionError, requests.RequestException):
        return None


def retry_after(response: requests.Response, default: float) -> float:
    """Retry-After as seconds (``default`` when absent or unreadable), never below one."""
    seconds = retry_after_seconds(response.headers.get("Retry-After"))
    return max(default if seconds is None else seconds, MIN_RETRY_AFTER)


def package_result(file_name: str, received: Received) -> DownloadResult:
    return DownloadResult(
        kind="package",
        file_name=file_name,
        path=received.path,
        size_bytes=received.size_bytes,
        sha256=received.sha256,
    )


def attachment_name(header: str | None, redact: Callable[[str], str]) -> str:
    """The package's file name from Content-Disposition, refusing anything path-like (a
    refused name is shown passed through ``redact``, before it is cut)."""
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
            f"refusing package file name {redact(name)[:80]!r}: expected a plain name ending "
            "in .zip"
        )
    return name
