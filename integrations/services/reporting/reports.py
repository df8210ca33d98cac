"""Reporting statuses to DROP: write response files, upload or amend them, record answers.

Two steps, so that a crash between them can neither lose a status nor send one twice::

    written = report_files_write(broker=broker, actor=actor)    # one transaction per cycle
    run = report_files_upload(broker=broker, actor=actor)       # every WRITTEN file, in order
    report_run(broker=broker, upload=True, actor=actor)         # both: command, job, admin

1. **Write.** Per downloaded list file of a cycle, the reportable work items in no file
   DROP still has to answer go into one ``Id,Status`` file (statuses that differ from the
   one DROP holds into an amendment file). The file (bytes, row count, SHA-256) is stored
   and its items point at it (``pending_report_file``) in the same transaction as its
   ledger event.
   From then on the rows belong to that file until DROP answers it: a later run never puts
   them in another one meanwhile.
2. **Upload.** Each ``written`` (or ``refused``) file is sent as it is stored, oldest cycle
   first, uploads before amendments. DROP's answer is kept on the file and in the ledger:
   ``accepted`` (a name DROP says was already uploaded counts as accepted: that is a retried
   upload that got through before), and only then does DROP hold its statuses
   (``reported_status_code``, ``reported_at``, ``report_file``); or ``rejected``: DROP
   holds nothing new, and the rows are owed again (written under a fresh name by the next
   ``report_run``; the periodic job leaves them to staff). An answer about this file alone
   (a 409, a 400 without a per-file answer, an answer that does not mention it) makes it
   ``refused``: it is sent again by every run, and holds back nothing else. Only an answer
   about DROP as a whole (401/403, DROP down or throttling past the client's bounded
   retries, the network) stops the run; the files left stay as they are for the next one.
   With the broker's ``approve_uploads`` on, a file is written ``awaiting_approval`` and
   only a second person's approval makes it ``written`` (``report_approval``); one they
   reject is never sent, and its rows are owed again.
3. **Discard.** Staff give up an amendment DROP refuses or rejected, with a written reason
   (``report_file_discard``): its items keep the status DROP holds.

Manual mode: ``report_file_mark_uploaded`` for files staff uploaded in DROP's portal.
The periodic job calls ``report_auto``: it reports a cycle once every work item has a
status (or when its due date is close), sends amendments, and retries written files.

The steps live in their own modules: ``report_files`` (write), ``report_uploads`` (upload
and DROP's answers), ``report_manual`` (discard, mark uploaded), ``report_approval`` (approve
or reject before the upload); this one runs them.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from integrations.drop.calendar import drop_today
from integrations.drop.client import DropClient
from integrations.models import (
    AWAITING_DROP,
    Broker,
    CycleState,
    DropCycle,
    ReportFile,
    WorkItem,
)
from integrations.services.cycle.work_items import work_items_settle
from integrations.services.ledger import SYSTEM_ACTOR
from integrations.services.reporting.report_files import report_files_write
from integrations.services.reporting.report_uploads import (
    ReportRun,
    report_client_for,
    report_files_upload,
)

log = logging.getLogger(__name__)

# A cycle still waiting for some outcomes is reported in part this many days before its due
# date: DROP's penalty runs per request per day late, so the known statuses go out first.
PARTIAL_REPORT_DAYS_BEFORE_DUE = 3


def report_run(
    *,
    broker: Broker,
    upload: bool,
    cycle: DropCycle | None = None,
    client: DropClient | None = None,
    actor: str = SYSTEM_ACTOR,
) -> ReportRun:
    """Write what is reportable, then (``upload``) send every written file."""
    if upload:
        client = client or report_client_for(broker, actor=actor)  # no key: refuse first
    written = report_files_write(broker=broker, cycle=cycle, actor=actor)
    if not upload:
        return ReportRun(written=written, pending=_still_written(broker, cycle))
    run = report_files_upload(broker=broker, cycle=cycle, client=client, actor=actor)
    run.written = _refreshed(written)
    return run


def _refreshed(files: list[ReportFile]) -> list[ReportFile]:
    """The same files with their state and DROP's answer as they are now."""
    current = {
        pk: (state, answer, uploaded_at)
        for pk, state, answer, uploaded_at in ReportFile.objects.filter(
            pk__in=[f.pk for f in files]
        ).values_list("pk", "state", "drop_response", "uploaded_at")
    }
    for report_file in files:
        report_file.state, report_file.drop_response, report_file.uploaded_at = current[
            report_file.pk
        ]
    return files


def _still_written(broker: Broker, cycle: DropCycle | None) -> list[ReportFile]:
    files = ReportFile.objects.filter(broker=broker, state__in=AWAITING_DROP)
    if cycle is not None:
        files = files.filter(cycle=cycle)
    return list(files.select_related("cycle").order_by("pk"))


def report_auto(
    *, broker: Broker, client: DropClient | None = None, today: dt.date | None = None
) -> ReportRun:
    """The periodic job's work for one broker.

    - Settle open work items whose outcomes all arrived (a safety net).
    - Write files for each cycle whose every work item has a status, or whose due date is
      ``PARTIAL_REPORT_DAYS_BEFORE_DUE`` days away or past; write amendments for any cycle.
      The rows of a file DROP rejected wait for staff (no new file of them every run); the
      cycle's other statuses go out all the same.
    - Upload every written file.
    """
    today = today or drop_today()
    client = client or report_client_for(broker, actor=SYSTEM_ACTOR)
    written: list[ReportFile] = []
    for cycle in _cycles_with_work(broker):
        if cycle.state == CycleState.OPEN:
            work_items_settle(cycle=cycle)
        # Every status owed has come in: none still waits for an outcome.
        complete = not WorkItem.objects.owed().awaiting_outcome().filter(cycle=cycle).exists()
        near_due = cycle.due_date - today <= dt.timedelta(days=PARTIAL_REPORT_DAYS_BEFORE_DUE)
        written.extend(
            report_files_write(
                broker=broker,
                cycle=cycle,
                amendments_only=not (complete or near_due),
                retry_rejected=False,
            )
        )
    run = report_files_upload(broker=broker, client=client)
    run.written = _refreshed(written)
    return run


def _cycles_with_work(broker: Broker) -> Sequence[DropCycle]:
    """Open cycles, and reported ones with a status to amend, of those that may have
    outstanding work items: an open cycle without any has nothing to settle or write."""
    cycles = []
    marked = DropCycle.objects.filter(broker=broker).may_have_outstanding()
    for cycle in marked.order_by("downloaded_at", "pk"):
        if (
            cycle.state == CycleState.OPEN
            or WorkItem.objects.awaiting_amendment().filter(cycle=cycle).exists()
        ):
            cycles.append(cycle)
    return cycles
