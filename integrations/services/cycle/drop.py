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

import dataclasses
import datetime as dt
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from django.conf import settings
from django.db import transaction
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
from integrations.models import Broker
from integrations.services.cycle.drop_access import drop_access_record
from integrations.services.cycle.drop_import import DropImportError, ImportResult, drop_zip_import
from integrations.services.ledger import ledger_event_append

PACKAGES_DIR = settings.DROPPORTAL_VAR_DIR / "drop-packages"
# Under a broker's directory: packages downloaded whose import has no outcome yet.
INCOMING = "incoming"
# The DROP client's time bounds and retries (a module attribute, so tests can shorten them);
# the stall is DROPPORTAL_DROP_STALL_SECONDS, read at each pull.
DROP_LIMITS = DropLimits()
DEFAULT_MAX_WAIT_SECONDS = DROP_LIMITS.max_wait_seconds


class DropPullError(Exception):
    """A pull stopped (DROP's answer, a refused package); the message says what to do."""


@dataclass(frozen=True)
class PullResult:
    outcome: Literal["imported", "already_imported", "nothing_new"]
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
) -> PullResult:
    """Download DROP's current package for ``broker`` and import it; raises DropPullError.

    Waits through 202 and 429 (and retries 5xx and timeouts) for at most
    ``max_wait_seconds``; the package streams to disk, ``on_progress(received, announced)``
    following it, for as long as it takes (receiving is not waiting), a stalled or cut body
    being resumed ``DropLimits.max_body_retries`` times. A refusal (401, 403, 409, ...) or a
    refused package is a ``drop.pull_failed`` event and nothing is imported; the next pull
    starts afresh. DROP failing through no doing of the broker's starts or extends an outage
    (``services.cycle.drop_access``); any answer of DROP's ends it. A package an earlier pull
    downloaded and stopped before importing is imported first, and DROP is not called: a
    ``drop.pulled`` event with ``resumed`` true.
    """
    directory = PACKAGES_DIR / broker.broker_id
    incoming = directory / INCOMING
    left = sorted(incoming.glob("*.zip"), key=lambda path: path.stat().st_mtime)
    if left:
        # A pull stopped after DROP sent this package and before its import had an outcome.
        # DROP will not send it again (a 409 or "nothing new" until its statuses are in), so
        # it is imported from here; DROP is asked again at the next pull.
        for path in left:
            result = _package_import(
                broker,
                actor,
                path,
                zip_name=path.name,
                downloaded_at=min(
                    dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.UTC), timezone.now()
                ),
                facts={"size_bytes": path.stat().st_size, "resumed": True},
            )
        return result
    started = time.monotonic()
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
    drop_access_record(broker=broker, actor=actor)

    if download.kind == "nothing_new":
        _pulled(broker, actor, {"outcome": "nothing_new", "message": download.message})
        return PullResult("nothing_new", message=download.message or "")

    assert download.path is not None
    return _package_import(
        broker,
        actor,
        download.path,
        zip_name=download.file_name,
        downloaded_at=timezone.now(),
        # The download (from the first call to the package on disk, waits included).
        facts={
            "size_bytes": download.size_bytes,
            "duration_ms": download_ms,
            "attempts": download.attempts,
        },
    )


def _package_import(
    broker: Broker,
    actor: str,
    path: Path,
    *,
    zip_name: str | None,
    downloaded_at: dt.datetime,
    facts: dict[str, object],
) -> PullResult:
    """Import the package at ``path`` (in ``incoming/``), record the pull, then keep the
    package beside the others: only once the pull is recorded does it leave ``incoming/``,
    so a pull stopped before that is finished by the next one (the import of a package
    imported before changes nothing)."""
    try:
        imported = drop_zip_import(
            broker=broker,
            path=path,
            zip_name=zip_name,
            downloaded_at=downloaded_at,
            actor=actor,
        )
    except DropImportError as exc:
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
    )
    return PullResult(outcome, imported=imported, path=_package_keep(path))


def _package_keep(path: Path) -> Path:
    """Move a package out of ``incoming/`` into the broker's directory, as the download
    placed it: the same bytes kept there already are not kept twice, a different package of
    that name gets ``-1``, ``-2``... appended."""
    try:
        with path.open("rb") as package:
            sha256 = hashlib.file_digest(package, "sha256").hexdigest()
    except FileNotFoundError:  # a pull run at the same time kept it
        return path.parent.parent / path.name
    return place_atomically(path, path.parent.parent, path.name, sha256)


def _pulled(broker: Broker, actor: str, data: dict[str, object]) -> None:
    with transaction.atomic():
        Broker.objects.filter(pk=broker.pk).update(last_pulled_at=timezone.now())
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
