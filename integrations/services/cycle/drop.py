"""Pulling from DROP: download the broker's current package and import it.

``drop pull`` and the periodic pull call ``drop_pull``; it downloads through
``drop_client_for`` and imports with ``services.cycle.drop_import.drop_zip_import``::

    result = drop_pull(broker=broker, actor="cli:alice")     # download, import, match
    result.outcome, result.imported.cycle.drop_session_id

Every call to DROP is a ``drop.api_call`` ledger event (never with the key). A downloaded
package is kept under ``var/drop-packages/<broker id>/``: when its import fails, staff fix
the cause and import that file with ``drop import`` (DROP may not send it again). It waits
in ``incoming/`` there until the pull is recorded (or its import refused), so a pull stopped
before that (the process killed, the database gone) is finished by the next pull.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from integrations import enqueue
from integrations.drop.client import (
    DropApiError,
    DropClient,
    base_url_for,
    drop_api_key_problem,
    drop_base_url_problem,
)
from integrations.drop.transport import DropLimits, OnProgress, place_atomically
from integrations.ledger_kinds import LedgerKind
from integrations.models import Broker, DropCycle
from integrations.selectors.pulls import broker_pull_due
from integrations.services.cycle.drop_access import drop_access_record
from integrations.services.cycle.drop_import import DropImportError, ImportResult, drop_zip_import
from integrations.services.ledger import ledger_event_append
from integrations.services.locks import advisory_session_lock

PACKAGES_DIR = settings.DROPPORTAL_VAR_DIR / "drop-packages"
# Under a broker's directory: packages downloaded whose import has no outcome yet.
INCOMING = "incoming"
# The DROP client's time bounds and retries (a module attribute, so tests can shorten them);
# the stall is DROPPORTAL_DROP_STALL_SECONDS, read at each pull.
DROP_LIMITS = DropLimits()
# pg_try_advisory_lock(int, int): purpose and broker pk. One pull per broker at a time.
_PULL_LOCK = 0x70756C6C  # "pull"
DEFAULT_MAX_WAIT_SECONDS = DROP_LIMITS.max_wait_seconds


class DropPullError(Exception):
    """A pull stopped (DROP's answer, a refused package); the message says what to do."""


class DropPullBusy(DropPullError):
    """Another pull of the broker is running; nothing was asked or recorded."""


@dataclass(frozen=True)
class PullResult:
    outcome: Literal["imported", "already_imported", "nothing_new", "imported_meanwhile"]
    message: str = ""
    imported: ImportResult | None = None
    path: Path | None = None


def broker_drop_url(broker: Broker) -> str:
    """Where the broker's DROP API key is sent: its own base URL, else DROP_API_URL, else
    DROP's URL for its mode."""
    return base_url_for(broker.mode, broker.drop_base_url or settings.DROP_API_URL)


def broker_drop_settings_problem(broker: Broker) -> str | None:
    """Why the DROP client refuses ``broker``'s stored key or the URL it is sent to (a
    value stored before they were checked on entry), in one line; None when it takes them,
    or when there is no key to send."""
    if not broker.drop_api_key:
        return None
    allow_private = settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS
    return drop_base_url_problem(
        broker_drop_url(broker), allow_private=allow_private
    ) or drop_api_key_problem(broker.drop_api_key)


def wait(seconds: float) -> None:
    """How a pull waits between DROP attempts (202, 429, retries); tests replace it."""
    time.sleep(seconds)


def drop_client_for(
    broker: Broker, *, actor: str, max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS
) -> DropClient:
    """A DROP client for ``broker``: URL by mode (or override), its key, calls in the ledger."""
    if not broker.drop_api_key:
        raise DropPullError(
            f"broker {broker.broker_id} has no DROP API key: set it in the admin first"
        )
    base_url = broker_drop_url(broker)  # where its key is sent: one rule with broker_update

    def on_call(method: str, path: str, status: int | None, duration_ms: int, outcome: str) -> None:
        ledger_event_append(
            kind=LedgerKind.DROP_API_CALL,
            broker_id=broker.broker_id,
            subject=f"{method} {path}",
            actor=actor,
            data={
                "base_url": base_url,
                "method": method,
                "path": path,
                "status": status,
                "duration_ms": duration_ms,
                "outcome": outcome,
            },
        )

    limits = dataclasses.replace(
        DROP_LIMITS,
        stall_timeout=settings.DROPPORTAL_DROP_STALL_SECONDS,
        max_wait_seconds=max_wait_seconds,
    )
    return DropClient(
        base_url,
        broker.drop_api_key,
        limits=limits,
        allow_private=settings.DROPPORTAL_ALLOW_PRIVATE_TARGETS,
        on_call=on_call,
        sleep=lambda seconds: wait(seconds),
    )


def drop_pull(
    *,
    broker: Broker,
    actor: str,
    max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS,
    on_progress: OnProgress | None = None,
    after_cycle: int | None = None,
) -> PullResult:
    """Download DROP's current package for ``broker`` and import it; raises DropPullError.

    Waits through 202 and 429 (and retries 5xx and timeouts) for at most
    ``max_wait_seconds``; the package streams to disk, ``on_progress(received, announced)``
    following it, for as long as it takes (receiving is not waiting), a stalled or cut body
    being resumed ``DropLimits.max_body_retries`` times. A refusal (401, 403, 409, ...) or a
    refused package is a ``drop.pull_failed`` event and nothing is imported; the next pull
    starts afresh. DROP failing through no doing of the broker's starts or extends an outage
    (``services.cycle.drop_access``); any answer of DROP's ends it. A package an earlier pull
    downloaded and stopped before recording is imported first (a ``drop.pulled`` event with
    ``resumed`` true, as of its download), and DROP is called only if the broker is still
    due for a pull after it. Raises ``DropPullBusy`` (recording nothing) while another pull
    of the broker runs. ``after_cycle`` (a job's: the pk of the broker's latest cycle when
    it was asked for, 0 for none): when a later cycle was imported since, by a pull that ran
    meanwhile, DROP is not asked (it would answer 409 until that cycle's statuses are in)
    and the outcome is ``imported_meanwhile``, recording nothing.
    """
    # One pull per broker at a time, whoever runs it (the worker's job lock stops only a
    # second job, not ``drop pull`` beside it): a second pull would import the package the
    # first is importing, and record a refusal when the first moves it out of incoming/.
    with advisory_session_lock(
        purpose=_PULL_LOCK,
        key=broker.pk,
        busy=lambda: DropPullBusy(
            f"another pull of broker {broker.broker_id} is running; try again when it is done"
        ),
    ):
        resumed = _packages_resume(broker, actor)
        if resumed is not None and not broker_pull_due(broker, now=timezone.now()):
            return resumed
        if after_cycle is not None:
            later = DropCycle.objects.filter(broker=broker, pk__gt=after_cycle).order_by("-pk")
            meanwhile = later.values_list("drop_session_id", flat=True).first()
            if meanwhile is not None:
                return resumed or PullResult(
                    "imported_meanwhile",
                    message=f"cycle {meanwhile} was imported since this pull was asked for",
                )
        return _pull(broker, actor, max_wait_seconds=max_wait_seconds, on_progress=on_progress)


def _packages_resume(broker: Broker, actor: str) -> PullResult | None:
    """Import the packages an earlier pull downloaded and stopped before recording, found in
    ``incoming/``; the last one's result, or None when there was none to finish.

    DROP will not send such a package again (a 409 or "nothing new" until its statuses are
    in), so it is imported from here, the pull recorded as of its download (the file's
    time). One imported before whose pull was recorded since (staff ran ``drop import`` on
    it, say) only leaves ``incoming/``: it finishes no pull."""
    incoming = PACKAGES_DIR / broker.broker_id / INCOMING
    result = None
    for path in sorted(incoming.glob("*.zip")):
        try:
            stat = path.stat()
        except FileNotFoundError:  # gone since the listing: kept by another hand
            continue
        # The file's time is when its download started: the pull that downloaded it set it
        # so as soon as the client returned (``_pull``). Only a pull stopped in the moment
        # between the file's placing and that leaves its placing time, the download's end:
        # nothing else keeps the start of a download that was never recorded.
        downloaded_at = min(_file_time(stat.st_mtime_ns), timezone.now())
        resumed = _package_import(
            broker,
            actor,
            path,
            zip_name=path.name,
            downloaded_at=downloaded_at,
            facts={"size_bytes": stat.st_size, "resumed": True},
        )
        result = resumed or result
    return result


def _pull(
    broker: Broker,
    actor: str,
    *,
    max_wait_seconds: float,
    on_progress: OnProgress | None,
) -> PullResult:
    """Ask DROP for the broker's package, download it into ``incoming/`` and import it."""
    incoming = PACKAGES_DIR / broker.broker_id / INCOMING
    started = time.monotonic()
    # DROP dates a download by its request, not by the end of the waits (202) and the
    # streaming after it: a pull asked at 23:58 and done at 00:03 downloaded the day before,
    # and its cycle's due date (and the next download's) count from that day.
    started_at = timezone.now()
    try:
        client = drop_client_for(broker, actor=actor, max_wait_seconds=max_wait_seconds)
        incoming.mkdir(parents=True, exist_ok=True)
        download = client.download(incoming, on_progress=on_progress)
        download_ms = int((time.monotonic() - started) * 1000)
    except (DropApiError, DropPullError, ValueError, OSError) as exc:
        message = str(exc)
        status = getattr(exc, "status", None)
        if isinstance(exc, DropApiError) and exc.status in (401, 403):
            message += "; check the broker's DROP API key and DROP account, then pull again"
            reason = "credentials"
        elif isinstance(exc, DropApiError) and status is not None and 400 <= status < 500:
            reason = "refused"
        else:
            reason = "unreachable"  # no answer, 5xx, cut off, or nothing to write to
        _pull_failed(broker, actor, message, status, reason)
        # DROP access: an outage starts or goes on, or DROP answered and one ends.
        drop_access_record(broker=broker, actor=actor, error=exc)
        raise DropPullError(message) from exc
    if download.path is not None:
        # Kept with the package, for a pull that resumes it (``_packages_resume``). Not a
        # failed pull if it cannot be: the download is done, and a resumed pull would only
        # date it by its end.
        with contextlib.suppress(OSError):
            os.utime(download.path, ns=(_file_ns(started_at),) * 2)
    drop_access_record(broker=broker, actor=actor)

    if download.kind == "nothing_new":
        _pulled(
            broker,
            actor,
            {
                "outcome": "nothing_new",
                "message": download.message,
                "started_at": started_at.isoformat(),
            },
            pulled_at=started_at,
        )
        return PullResult("nothing_new", message=download.message or "")

    assert download.path is not None
    result = _package_import(
        broker,
        actor,
        download.path,
        zip_name=download.file_name,
        downloaded_at=started_at,
        # The download (from the first call to the package on disk, waits included).
        facts={
            "started_at": started_at.isoformat(),
            "size_bytes": download.size_bytes,
            "duration_ms": download_ms,
            "attempts": download.attempts,
        },
    )
    if result is None:  # only by a hand outside the pull lock
        raise DropPullError(f"{download.path} was taken from incoming/ while it was imported")
    return result


def _file_ns(moment: dt.datetime) -> int:
    """``moment`` as a file's time, to the microsecond (a float would round it)."""
    return (moment - _EPOCH) // dt.timedelta(microseconds=1) * 1000


def _file_time(ns: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=ns // 1000)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _package_import(
    broker: Broker,
    actor: str,
    path: Path,
    *,
    zip_name: str | None,
    downloaded_at: dt.datetime,
    facts: dict[str, object],
) -> PullResult | None:
    """Import the package at ``path`` (in ``incoming/``), record the pull, then keep the
    package beside the others: only once the pull is recorded does it leave ``incoming/``,
    so a pull stopped before that is finished by the next one (the import of a package
    imported before changes nothing). None when the package was gone from ``incoming/``
    (kept by another hand), or when it is a resumed package imported before whose pull was
    recorded since (then it only leaves ``incoming/``)."""
    resumed = bool(facts.get("resumed"))
    try:
        imported = drop_zip_import(
            broker=broker,
            path=path,
            zip_name=zip_name,
            downloaded_at=downloaded_at,
            actor=actor,
        )
    except DropImportError as exc:
        if not path.exists():
            return None  # no refusal of DROP's package: it was taken while we read it
        kept = _package_keep(path)
        message = (
            f"{exc}. The package is kept at {kept}; once the cause is fixed, "
            f"import it with: manage.py drop import --broker {broker.broker_id} {kept}"
        )
        _pull_failed(broker, actor, message, None, "package")
        raise DropPullError(message) from exc
    outcome: Literal["imported", "already_imported"] = (
        "imported" if imported.created else "already_imported"
    )
    if resumed and not imported.created:
        broker.refresh_from_db(fields=["last_pulled_at"])
        if broker.last_pulled_at is not None and broker.last_pulled_at >= downloaded_at:
            _package_keep(path, sha256=imported.cycle.zip_sha256)
            return None
    _pulled(
        broker,
        actor,
        {
            "outcome": outcome,
            "zip_name": zip_name,
            "zip_sha256": imported.cycle.zip_sha256,
            "drop_session_id": imported.cycle.drop_session_id,
            **facts,
        },
        # A pull happened when its download started, not now (a resumed one, when its
        # package was downloaded): the broker is due again from then (and never earlier
        # than a pull recorded since).
        pulled_at=downloaded_at,
    )
    kept = _package_keep(path, sha256=imported.cycle.zip_sha256)
    return PullResult(outcome, imported=imported, path=kept)


def drop_package_import(
    *, broker: Broker, path: Path, downloaded_at: dt.datetime | None, actor: str
) -> ImportResult:
    """``drop import``: import the package at ``path`` by hand (``drop_zip_import``).

    One in the broker's ``incoming/`` (a pull's download that stopped before its record) is
    what the next pull would resume: it is imported under the pull's lock, so never beside a
    pull importing or keeping the same file (``DropPullBusy`` at once while one runs), and
    then leaves ``incoming/``, its import having an outcome. One refused stays there: the
    next pull resumes it and records the refusal as that pull's. Any other path is imported
    where it is, without the lock (a pull never touches it)."""
    incoming = (PACKAGES_DIR / broker.broker_id / INCOMING).resolve()
    if path.resolve().parent != incoming:
        return drop_zip_import(
            broker=broker, path=path, downloaded_at=downloaded_at, actor=actor, by_hand=True
        )
    with advisory_session_lock(
        purpose=_PULL_LOCK,
        key=broker.pk,
        busy=lambda: DropPullBusy(
            f"a pull of broker {broker.broker_id} is running, and it imports {path.name} from "
            f"incoming/ itself; try again when it is done"
        ),
    ):
        if not path.is_file():  # a pull that ended just before took it
            raise DropImportError(
                f"{path} is no longer in incoming/: a pull imported it meanwhile "
                f"(its drop.pulled event in the ledger)"
            )
        result = drop_zip_import(
            broker=broker, path=path, downloaded_at=downloaded_at, actor=actor, by_hand=True
        )
        _package_keep(path.resolve(), sha256=result.cycle.zip_sha256)
        return result


def _package_keep(path: Path, *, sha256: str | None = None) -> Path:
    """Move a package out of ``incoming/`` into the broker's directory, as the download
    placed it: the same bytes kept there already are not kept twice, a different package of
    that name gets ``-1``, ``-2``... appended. ``sha256``: the package's, when its import
    has read it already (its cycle's), so it is not read again."""
    try:
        if sha256 is None:
            with path.open("rb") as package:
                sha256 = hashlib.file_digest(package, "sha256").hexdigest()
        return place_atomically(path, path.parent.parent, path.name, sha256)
    except FileNotFoundError:
        if path.exists():
            raise
        return path.parent.parent / path.name  # another hand kept it meanwhile


def _pulled(
    broker: Broker, actor: str, data: dict[str, object], *, pulled_at: dt.datetime | None = None
) -> None:
    with transaction.atomic():
        at = timezone.now() if pulled_at is None else pulled_at
        Broker.objects.filter(pk=broker.pk).update(
            last_pulled_at=Greatest(Coalesce(F("last_pulled_at"), Value(at)), Value(at))
        )
        ledger_event_append(
            kind=LedgerKind.DROP_PULLED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data=data,
        )


def _pull_failed(broker: Broker, actor: str, message: str, status: int | None, reason: str) -> None:
    """``reason`` (for alerts): credentials (401/403), refused (another 4xx), package (the
    download was refused on import) or unreachable. Not logged here: the periodic job logs
    it, the command says it as its one error line."""
    with transaction.atomic():
        ledger_event_append(
            kind=LedgerKind.DROP_PULL_FAILED,
            broker_id=broker.broker_id,
            subject=broker.broker_id,
            actor=actor,
            data={"error": message, "status": status, "reason": reason},
        )
        # A refusal alerts at once; DROP unreachable only after a day of failed pulls, which
        # the periodic evaluation notices.
        if reason != "unreachable":
            enqueue.alerts_evaluate_enqueue()
