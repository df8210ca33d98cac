"""How the DROP client's calls travel: attempts, waits, retries, bounded time, files on disk.

The protocol (``drop.client``) says what to send and what an answer means, as a decision;
this module sends it through the one outbound stack (``outbound_http``) and acts on the
decision::

    transport = Transport(session=build_session(allow_private), limits=DropLimits(), ...)
    value, attempts = transport.run("GET", "/data/download", send, handle)
    # handle(response) -> Done(value) | Fail(error) | Wait(seconds) | Retry(reason)

Each attempt's answer begins within ``total_timeout`` by the wall clock
(``outbound_deadline.bounded``) and is reported to ``on_call``; no attempt sees the API key
(``send`` carries it). A package is streamed to a temporary file (never held in memory),
bounded by a stall rather than a total (no byte for ``stall_timeout`` cuts it: a large
package on a slow line still arrives), checked against its announced length and given its
name atomically (``receive_file``). A body cut short or stalled is kept (``PartialBody``) and
the next attempt asks for the rest (``Range: bytes=<received>-``); when DROP sends the whole
again instead (200, not 206), the kept part is dropped and the body starts over.

The waits are our own loop rather than tenacity's: a 202 or 429 waits as long as DROP asks
without using up a retry, while failures back off and count; both share one budget measured
on the injected clock, which the time spent receiving a package's body never uses up (a large
package takes as long as it takes; its cut attempts are bounded by their number). Tenacity's
waits and stops count every attempt on its own clock, so it would bring only the loop, with
every policy still ours as callbacks.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import urllib3
from requests_hardened.ip_filter import InvalidIPAddress

from integrations.ascii_integers import ascii_integer
from integrations.drop.errors import DropApiError, DropProtocolError, DropUnavailable
from integrations.outbound_deadline import Bound, bounded
from integrations.outbound_http import describe_failure

# The client's logger: one name for everything a DROP call logs.
log = logging.getLogger("integrations.drop.client")

_CHUNK = 1 << 16

OnCall = Callable[[str, str, int | None, int, str], None]
"""``on_call(method, path, status, duration_ms, outcome)``: one call per HTTP attempt."""

OnProgress = Callable[[int, int | None], None]
"""``on_progress(bytes_received, bytes_announced)``: as a package's body arrives (a resumed
attempt goes on from the bytes kept; one DROP answers with the whole body starts again at 0)."""


# What handling one HTTP attempt decided: finish, fail, wait (202/429) or retry (transient).
@dataclass
class Done:
    value: Any
    outcome: str


@dataclass
class Fail:
    error: DropApiError
    outcome: str


@dataclass
class Wait:
    seconds: float
    outcome: str
    exhausted: DropApiError


@dataclass
class Retry:
    outcome: str
    reason: str
    status: int | None = None
    # A package's body cut short or stalled (or a resume DROP refused): retried within
    # ``max_body_retries``, outside the waiting budget.
    body: bool = False


Decision = Done | Fail | Wait | Retry


@dataclass(frozen=True)
class Received:
    """A package received whole and given its name in the destination directory."""

    path: Path
    size_bytes: int
    sha256: str


class _BodyCutShort(Exception):
    pass


class _BodyStalled(Exception):
    pass


class PartialBody:
    """A package's body as far as it came, kept between the attempts of one download so that a
    cut attempt resumes where it stopped (HTTP Range) rather than from the first byte.

    The caller owns it for the whole call: ``request_headers`` for each attempt,
    ``receive_file`` fills and uses it, ``discard`` at the call's end (whatever the end).
    """

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self.path: Path | None = None
        self.file_name = ""
        self.size = 0
        self.total: int | None = None  # the whole body's length, when DROP announced it
        self.validator: str | None = None  # its strong ETag or Last-Modified, for If-Range
        self.digest = hashlib.sha256()

    def request_headers(self) -> dict[str, str]:
        """``Range`` (and ``If-Range``, when DROP gave a validator) for the bytes still owed."""
        if not self.size:  # bytes are only ever kept in ``path``
            return {}
        headers = {"Range": f"bytes={self.size}-"}
        if self.validator is not None:
            headers["If-Range"] = self.validator
        return headers

    def discard(self) -> None:
        """Drop the kept bytes: the next attempt asks for the whole body."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        self._forget()

    def refused(self, reason: str, status: int) -> Retry:
        """DROP's answer to the Range does not continue the kept bytes: drop them, and the
        next attempt asks for the whole body."""
        self.discard()
        return Retry("resume_refused", f"download not resumed: {reason}", status, body=True)

    def placed(self) -> None:
        """The kept file became the package (``place_atomically``): nothing is kept any more."""
        self._forget()


@dataclass
class _Attempt:
    bound: Bound
    status: int | None = None


@dataclass(frozen=True)
class DropLimits:
    """How long a DROP call may take and how often it is tried: the one home of these
    numbers, the defaults being production's (``DROPPORTAL_DROP_STALL_SECONDS`` sets the
    stall there).

    Per attempt: ``connect_timeout`` and ``read_timeout`` (each read); ``total_timeout``, by
    the wall clock until DROP's answer begins (the whole of a small answer); ``stall_timeout``
    bounds a package's body: no byte for that long cuts it (and the attempt is retried),
    however long the whole body takes. Per call (``download``, ``upload``, ``amend``): all
    waiting (202 and 429 Retry-After, backoff, attempts that got no body) stays within
    ``max_wait_seconds`` (a wait that would pass it raises at once instead of sleeping); the
    time spent receiving a package's body is not waiting and never counts. Transient failures
    are retried ``max_retries`` times with backoff ``backoff_seconds``, doubling, capped at
    ``max_backoff_seconds``; a package's body cut short or stalled is retried (resumed where
    it stopped when DROP honours Range) ``max_body_retries`` times, with the same backoff.
    """

    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    total_timeout: float = 300.0
    stall_timeout: float = 120.0
    max_wait_seconds: float = 600.0
    max_retries: int = 4
    max_body_retries: int = 8
    backoff_seconds: float = 2.0
    max_backoff_seconds: float = 60.0

    @property
    def timeout(self) -> tuple[float, float]:
        """(connect, each read), as requests takes it."""
        return (self.connect_timeout, self.read_timeout)


@dataclass
class Transport:
    """Attempts of one DROP client, within ``limits``; ``sleep`` and ``clock`` are injectable
    so tests never wait."""

    session: requests.Session
    limits: DropLimits
    on_call: OnCall | None
    sleep: Callable[[float], None]
    clock: Callable[[], float]
    # What of DROP's own text a message quotes goes through it, before it is cut.
    redact: Callable[[str], str] = field(repr=False)
    _current: _Attempt | None = field(default=None, init=False, repr=False)  # in flight
    # Seconds spent receiving package bodies in the call in flight: not waiting for DROP.
    _receiving: float = field(default=0.0, init=False, repr=False)

    def run(
        self,
        method: str,
        path: str,
        send: Callable[[], requests.Response],
        handle: Callable[[requests.Response], Decision],
    ) -> tuple[Any, int]:
        """Attempt until ``handle`` decides Done (its value and the number of attempts) or
        Fail, or the retries or the waiting budget run out (raises)."""
        limits = self.limits
        started = self.clock()
        self._receiving = 0.0
        waited = 0.0
        failures = 0
        body_failures = 0
        attempts = 0
        while True:
            attempts += 1
            decision = self._attempt(method, path, send, handle)
            if isinstance(decision, Done):
                return decision.value, attempts
            if isinstance(decision, Fail):
                raise decision.error
            if isinstance(decision, Wait):
                delay, exhausted = decision.seconds, decision.exhausted
            else:
                if decision.body:
                    body_failures += 1
                    count, most = body_failures, limits.max_body_retries
                else:
                    failures += 1
                    count, most = failures, limits.max_retries
                times = "once" if count == 1 else f"{count} times"
                exhausted = DropUnavailable(
                    f"DROP {method} {path} failed {times}; last: {decision.reason}",
                    status=decision.status,
                )
                if count > most:
                    raise exhausted
                delay = min(limits.backoff_seconds * 2 ** (count - 1), limits.max_backoff_seconds)
                if decision.body:
                    # Bounded by their number: the pause after a cut body is no wait for DROP.
                    self._pause(method, path, delay)
                    self._receiving += delay
                    continue
            # Waiting so far: the clock since the call began, less the bodies received.
            elapsed = self.clock() - started - self._receiving
            if max(elapsed, waited) + delay > limits.max_wait_seconds:
                raise exhausted
            self._pause(method, path, delay)
            waited += delay

    def _pause(self, method: str, path: str, delay: float) -> None:
        log.info("DROP %s %s: waiting %.1f s before the next attempt", method, path, delay)
        self.sleep(delay)

    def _attempt(
        self,
        method: str,
        path: str,
        send: Callable[[], requests.Response],
        handle: Callable[[requests.Response], Decision],
    ) -> Decision:
        """One bounded attempt, reported to ``on_call`` whatever happens (``error``: a local
        failure, such as a full disk, raised on)."""
        began = self.clock()
        with bounded(self.limits.total_timeout) as bound:
            attempt = self._current = _Attempt(bound)
            try:
                decision = self._exchange(attempt, send, handle)
            except BaseException:
                self._report(method, path, attempt.status, began, "error")
                raise
            finally:
                self._current = None
        self._report(method, path, attempt.status, began, decision.outcome)
        return decision

    def _exchange(
        self,
        attempt: _Attempt,
        send: Callable[[], requests.Response],
        handle: Callable[[requests.Response], Decision],
    ) -> Decision:
        try:
            response = send()
        except InvalidIPAddress as exc:
            return Fail(DropApiError(f"DROP base URL refused: {self._failure(exc)}"), "refused")
        except requests.RequestException as exc:
            if attempt.bound.expired or isinstance(exc, requests.Timeout):
                return Retry("timeout", self._timed_out(exc, attempt.bound))
            return Retry("connection_error", f"cannot reach DROP: {self._failure(exc)}")
        with response:
            if attempt.bound.expired:  # cut while the answer was coming in
                return Retry("timeout", self._timed_out(None, attempt.bound))
            attempt.status = response.status_code
            return handle(response)

    def _failure(self, exc: requests.RequestException) -> str:
        """What kept the request from DROP, in a few words (``connection refused``)."""
        connect, read = self.limits.timeout
        return describe_failure(exc, timeout_connect=connect, timeout_total=read)

    def _timed_out(self, exc: requests.RequestException | None, bound: Bound) -> str:
        if bound.expired:
            return f"DROP did not answer within {self.limits.total_timeout:g} s"
        return f"DROP did not answer in time: {exc}"

    def _report(
        self, method: str, path: str, status: int | None, began: float, outcome: str
    ) -> None:
        duration_ms = int((self.clock() - began) * 1000)
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

    def receive_file(
        self,
        response: requests.Response,
        dest_dir: Path,
        file_name: str,
        on_progress: OnProgress | None = None,
        partial: PartialBody | None = None,
    ) -> Received | Retry:
        """Stream the body into ``dest_dir`` under ``file_name`` (see ``place_atomically``),
        cut only when no byte comes for ``stall_timeout`` seconds.

        A 206 continues ``partial`` (the bytes an earlier attempt kept); a 200 is the whole
        body, and whatever ``partial`` held is dropped. A body cut short (by the peer or by a
        stall) is kept in ``partial`` for the next attempt to resume (without one, nothing is
        left behind) and is worth another attempt.
        """
        began = self.clock()
        try:
            return self._receive(response, dest_dir, file_name, on_progress, partial)
        finally:
            self._receiving += self.clock() - began

    def _receive(
        self,
        response: requests.Response,
        dest_dir: Path,
        file_name: str,
        on_progress: OnProgress | None,
        partial: PartialBody | None,
    ) -> Received | Retry:
        kept = partial if partial is not None else PartialBody()
        expected = _content_length(response)
        identity = _encoding(response) == "identity"
        if response.status_code == 206:
            whole, refused = _continues(response, kept, file_name, expected, self.redact)
            if refused is not None:
                return kept.refused(refused, 206)
            assert kept.path is not None
            kept.total = whole
            out_file = kept.path.open("ab")
        else:
            kept.discard()  # the whole body again: what was kept is not needed
            fd, temp_name = tempfile.mkstemp(dir=dest_dir, prefix=".drop-download-", suffix=".part")
            out_file = os.fdopen(fd, "wb")
            kept.path, kept.file_name, kept.total = Path(temp_name), file_name, expected
            kept.validator = _validator(response)
        temp_path = kept.path
        total = kept.total  # of the whole body, whichever part this attempt brings
        bound = self._current.bound if self._current is not None else None
        raw = response.raw
        connection = getattr(raw, "connection", None)
        sock: socket.socket | None = getattr(connection, "sock", None)
        try:
            with out_file as out:
                # From here the wall clock no longer counts, a silence does: each read waits
                # at most stall_timeout (the socket), and the watchdog's deadline follows
                # the last byte (whatever a read does underneath).
                if sock is not None:
                    sock.settimeout(self.limits.stall_timeout)
                try:
                    while True:
                        if bound is not None:
                            bound.postpone(self.limits.stall_timeout)
                        # read1: at most one receive, so a slow but steady body keeps the
                        # deadline moving (a full-size read would wait for a whole chunk).
                        chunk = _read_once(raw)
                        if not chunk:
                            break
                        out.write(chunk)
                        kept.digest.update(chunk)
                        kept.size += len(chunk)
                        if on_progress is not None:
                            on_progress(kept.size, total)
                    if bound is not None and bound.expired:
                        raise _BodyStalled
                finally:
                    out.flush()  # what came is kept whole for a resume
                os.fsync(out.fileno())
            if total is not None and kept.size != total:
                raise _BodyCutShort(f"got {kept.size} of {total} bytes")
            sha256 = kept.digest.hexdigest()
            path = place_atomically(temp_path, dest_dir, file_name, sha256)
        except (_BodyStalled, _BodyCutShort) as exc:
            size = kept.size
            if not identity or not size:
                kept.discard()  # nothing a Range could continue
            # A stall ends as a socket timeout, or as a cut socket when the watchdog was first.
            if isinstance(exc, _BodyStalled) or (bound is not None and bound.expired):
                stall = self.limits.stall_timeout
                return Retry(
                    "stalled",
                    f"download stalled: no byte for {stall:g} s after {size} bytes",
                    body=True,
                )
            return Retry("truncated", f"download cut short: {exc}", body=True)
        except BaseException:
            kept.discard()
            raise
        size = kept.size
        kept.placed()
        return Received(path=path, size_bytes=size, sha256=sha256)


def _read_once(raw: urllib3.HTTPResponse) -> bytes:
    """What one receive brings of the body (b"" at its end); a failure of the network is
    ``_BodyStalled`` (nothing came in time) or ``_BodyCutShort``, never a local error."""
    try:
        return raw.read1(_CHUNK, decode_content=True)
    except (TimeoutError, urllib3.exceptions.ReadTimeoutError):
        raise _BodyStalled from None
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as exc:
        raise _BodyCutShort(str(exc) or type(exc).__name__) from None


def _encoding(response: requests.Response) -> str:
    return response.headers.get("Content-Encoding", "identity").strip().lower() or "identity"


_CONTENT_RANGE_RE = re.compile(r"bytes\s+([0-9]+)-([0-9]+)/([0-9]+|\*)", re.IGNORECASE)


def _continues(
    response: requests.Response,
    kept: PartialBody,
    file_name: str,
    length: int | None,
    redact: Callable[[str], str],
) -> tuple[int | None, str | None]:
    """Whether a 206 is the rest of the kept bytes: the whole body's length (when known),
    and why not (None: it is; DROP's header quoted through ``redact``)."""
    if not kept.size:
        return None, "DROP sent part of a package that was not asked for"
    if _encoding(response) != "identity":
        return None, "DROP sent the rest encoded"
    if file_name != kept.file_name:
        return None, f"DROP sent part of {file_name} to complete {kept.file_name}"
    header = response.headers.get("Content-Range", "")
    match = _CONTENT_RANGE_RE.fullmatch(header.strip())
    if match is None:
        return None, f"unreadable Content-Range {redact(header)[:80]!r}"
    first, last = int(match[1]), int(match[2])
    whole = None if match[3] == "*" else int(match[3])
    if (
        first != kept.size
        or (whole is not None and last != whole - 1)
        or (kept.total is not None and whole != kept.total)
        or (length is not None and length != last - first + 1)
    ):
        return None, (
            f"DROP sent bytes {first}-{last}/{match[3]} after {kept.size} of "
            f"{kept.total if kept.total is not None else '?'} bytes"
        )
    return whole if whole is not None else kept.total, None


def _validator(response: requests.Response) -> str | None:
    """What ``If-Range`` may carry: a strong ETag, else Last-Modified (a weak ETag may not)."""
    etag = response.headers.get("ETag", "").strip()
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("Last-Modified", "").strip() or None


def _content_length(response: requests.Response) -> int | None:
    if _encoding(response) != "identity":
        return None  # the length is of the encoded body; urllib3 checks that one
    raw = response.headers.get("Content-Length")
    return None if raw is None else ascii_integer(raw.strip())


def place_atomically(temp_path: Path, dest_dir: Path, file_name: str, sha256: str) -> Path:
    """Give the finished temp file its name without ever replacing a different file: a
    different file already under that name is kept and the new one gets ``-1``, ``-2``...
    appended; the same bytes under the same name are not stored twice."""
    stem, suffix = os.path.splitext(file_name)
    for n in range(1000):
        candidate = dest_dir / (file_name if n == 0 else f"{stem}-{n}{suffix}")
        try:
            os.link(temp_path, candidate)
        except FileExistsError:
            with candidate.open("rb") as existing:
                same = hashlib.file_digest(existing, "sha256").hexdigest() == sha256
            if same:
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
