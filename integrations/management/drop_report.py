"""``manage.py drop report``: write the response files, and upload them to DROP.

    manage.py drop report --broker 4821                    # write; list what awaits upload
    manage.py drop report --broker 4821 --out responses/   # also save the CSVs there
    manage.py drop report --broker 4821 --upload           # write, then upload and amend
    manage.py drop report --broker 4821 --discard 20260312_4821_Email_amend01.csv \
        --reason "DROP no longer amends that download"      # give up a refused amendment
    manage.py drop report --broker 4821 --approve 20260312_4821_Email.csv   # "approve uploads":
    manage.py drop report --broker 4821 --reject 20260312_4821_Email.csv \
        --reason "the Phone list's statuses are missing"    # a second person decides

Each run ends with the broker's open cycles: due date, days left, statuses still owed.

The ``drop`` command mixes this in (``class Command(ReportSubcommand)``). A file DROP
rejected or refused, or an upload that could not finish (DROP down, throttling, a refused
key), ends in one line on stderr and exit 1; written and refused files stay in the database
and the next run sends them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from integrations.drop.calendar import drop_today
from integrations.drop.reporting import save_response_file
from integrations.management.base import (
    DropportalCommand,
    broker_or_error,
    cycle_or_error,
    out_folder_checked,
    validation_message,
)
from integrations.models import Broker, DropCycle, ReportFile, ReportFileState
from integrations.selectors.deadlines import CycleDeadline, cycle_deadlines
from integrations.selectors.report_reviews import (
    report_file_review,
    report_files_awaiting_approval,
)
from integrations.services.reporting.report_approval import (
    report_file_approve,
    report_file_reject,
)
from integrations.services.reporting.report_manual import report_file_discard
from integrations.services.reporting.report_uploads import ReportBusy, ReportRun
from integrations.services.reporting.reports import report_run


class ReportSubcommand(DropportalCommand):
    def add_report_subcommand(self, subparsers: Any) -> None:
        report = subparsers.add_parser(
            "report", help="write the response CSVs (and --upload them to DROP)"
        )
        report.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        report.add_argument("--cycle", help="only this cycle (its drop_session_id)")
        report.add_argument("--out", help="also save the files to this folder")
        report.add_argument(
            "--upload", action="store_true", help="upload new statuses and amendments to DROP"
        )
        report.add_argument(
            "--discard",
            metavar="FILE",
            help="give up this amendment DROP refuses or rejected (its file name); its work "
            "items keep the status DROP holds. Needs --reason",
        )
        report.add_argument(
            "--approve",
            metavar="FILE",
            help="approve this response file waiting for approval (its file name; not one you "
            "wrote): the report job uploads it",
        )
        report.add_argument(
            "--reject",
            metavar="FILE",
            help="reject this response file waiting for approval: it is never uploaded, its "
            "statuses go into a new file at the next report run. Needs --reason",
        )
        report.add_argument(
            "--reason",
            help="why the amendment is given up (--discard), the file rejected (--reject), or "
            "approved (--approve, optional)",
        )
        report.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle_report(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        cycle = None
        if options["cycle"]:
            cycle = cycle_or_error(broker, options["cycle"])
        if options["approve"] or options["reject"]:
            self._review(broker, cycle, options)
            return
        if options["discard"] or options["reason"] is not None:
            self._discard(broker, cycle, options)
            return
        # Before the run: it writes files and ledger events, and with --upload sends them.
        out = out_folder_checked(options["out"]) if options["out"] is not None else None
        try:
            run = report_run(
                broker=broker, upload=options["upload"], cycle=cycle, actor=self.actor()
            )
        except ReportBusy as exc:
            raise CommandError(str(exc)) from None
        saved = self._save(run, out) if out is not None else []
        deadlines = cycle_deadlines(broker_id=broker.broker_id, today=drop_today())
        if options["json"]:
            awaiting = [
                {**_file_json(f), **report_file_review(f).as_json(), "written_by": f.written_by}
                for f in report_files_awaiting_approval(broker=broker)
            ]
            self.print_json({**_as_json(run, saved, deadlines), "awaiting_approval": awaiting})
        else:
            self._print(broker, run, saved, uploading=options["upload"])
            for deadline in deadlines:
                self.stdout.write(_deadline_line(deadline))
        problems = [
            f"{f.file_name} rejected: {f.drop_response.get('reason')}" for f in run.rejected
        ] + [
            f"{f.file_name} refused: {f.drop_response.get('message')} (sent again by the next run)"
            for f in run.refused
        ]
        if run.error:
            problems.append(f"upload stopped: {run.error}; the next run sends what is left")
        if problems:
            raise CommandError("; ".join(problems))

    def _discard(self, broker: Broker, cycle: DropCycle | None, options: dict[str, Any]) -> None:
        if not options["discard"] or not (options["reason"] or "").strip():
            raise CommandError("--discard FILE and --reason TEXT go together")
        if options["upload"] or options["out"] is not None:
            raise CommandError("--discard gives up one amendment: run it without --upload/--out")
        found = _file_or_error(broker, cycle, options["discard"])
        try:
            discarded = report_file_discard(
                report_file=found, reason=options["reason"], actor=self.actor()
            )
        except ValidationError as exc:
            raise CommandError(validation_message(exc)) from None
        except ReportBusy as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.print_json({"discarded": _file_json(discarded)})
            return
        self.stdout.write(
            f"Discarded {discarded.file_name} (cycle {discarded.cycle.drop_session_id}): its "
            "work items keep the status DROP holds."
        )

    def _review(self, broker: Broker, cycle: DropCycle | None, options: dict[str, Any]) -> None:
        """A second person approves or rejects a file waiting for approval."""
        if options["approve"] and options["reject"]:
            raise CommandError("--approve and --reject: one or the other")
        if options["discard"] or options["upload"] or options["out"] is not None:
            raise CommandError(
                "--approve/--reject decide on one file: run it without --discard/--upload/--out"
            )
        if options["reject"] and not (options["reason"] or "").strip():
            raise CommandError("--reject FILE and --reason TEXT go together")
        found = _file_or_error(broker, cycle, options["approve"] or options["reject"])
        review = report_file_review(found)
        try:
            if options["approve"]:
                decided = report_file_approve(
                    report_file=found, reason=options["reason"] or "", actor=self.actor()
                )
            else:
                decided = report_file_reject(
                    report_file=found, reason=options["reason"], actor=self.actor()
                )
        except ValidationError as exc:
            raise CommandError(validation_message(exc)) from None
        if options["json"]:
            self.print_json(
                {
                    "approved" if options["approve"] else "rejected": {
                        **_file_json(decided),
                        **review.as_json(),
                        "reviewed_by": decided.reviewed_by,
                        "review_reason": decided.review_reason,
                    }
                }
            )
            return
        if options["approve"]:
            self.stdout.write(
                f"Approved {decided.file_name} ({review.text}): it is uploaded with the "
                "broker's next report (queued now when the broker has a DROP API key)."
            )
        else:
            self.stdout.write(
                f"Rejected {decided.file_name} ({review.text}): never uploaded; its statuses "
                "are still owed and go into a new file at the next report run."
            )

    @staticmethod
    def _save(run: ReportRun, out: Path) -> list[str]:
        """Save this run's files and every one still waiting for DROP (manual upload); not
        one waiting for approval: it is uploaded by hand only once approved."""
        files = {
            f.pk: f
            for f in (*run.written, *run.pending, *run.accepted, *run.rejected, *run.refused)
        }
        contents = list(
            ReportFile.objects.filter(pk__in=files)
            .exclude(state=ReportFileState.AWAITING_APPROVAL)
            .order_by("cycle_id", "file_name")
            .values_list("file_name", "content", "cycle__drop_session_id")
        )
        # Files an older version wrote may share a name across two cycles of one date.
        cycles: dict[str, list[str]] = {}
        for name, _, cycle in contents:
            cycles.setdefault(name, []).append(cycle)
        for name, named in cycles.items():
            if len(named) > 1:
                raise CommandError(
                    f"nothing saved: the files of cycles {', '.join(named)} are all named "
                    f"{name} (the run itself is recorded); save one cycle at a time, "
                    "--cycle ID --out FOLDER, each to its own folder"
                )
        try:
            return [
                str(save_response_file(out, name, bytes(content))) for name, content, _ in contents
            ]
        except OSError as exc:
            raise CommandError(f"cannot write to {out}: {exc.strerror}") from None

    def _print(self, broker: Broker, run: ReportRun, saved: list[str], *, uploading: bool) -> None:
        if not (run.written or run.pending or run.accepted or run.rejected or run.refused) and (
            not report_files_awaiting_approval(broker=broker).exists()
        ):
            self.stdout.write("Nothing to report: no new statuses and no files waiting for DROP.")
            return
        for report_file in run.written:
            self.stdout.write(
                f"Wrote {report_file.file_name}: {report_file.rows} rows "
                f"({report_file.get_kind_display().lower()}), sha256 {report_file.sha256}"
            )
        awaiting = report_files_awaiting_approval(broker=broker)
        for report_file in awaiting:
            self.stdout.write(
                f"Waiting for approval: {report_file.file_name} "
                f"({report_file_review(report_file).text}), written by "
                f"{report_file.written_by or 'unknown'}: another Operator approves it with "
                f"`drop report --broker {broker.broker_id} --approve {report_file.file_name}`"
            )
        for report_file in run.accepted:
            again = (
                " (already uploaded before)"
                if report_file.drop_response.get("already_uploaded")
                else ""
            )
            self.stdout.write(f"DROP accepted {report_file.file_name}{again}")
        for report_file in run.refused:
            self.stdout.write(
                f"DROP refused {report_file.file_name}: {report_file.drop_response.get('message')}"
            )
        waiting = [f.file_name for f in run.pending]
        if waiting and not uploading:
            self.stdout.write(
                f"Waiting for upload: {', '.join(waiting)} (run with --upload, or upload them "
                "in DROP's portal and mark them uploaded in the admin)"
            )
        for path in saved:
            self.stdout.write(f"Saved {path}")


def _file_or_error(broker: Broker, cycle: DropCycle | None, file_name: str) -> ReportFile:
    """The broker's response file of that name (in ``cycle``), or one line saying why not."""
    files = ReportFile.objects.filter(broker=broker, file_name=file_name)
    if cycle is not None:
        files = files.filter(cycle=cycle)
    found = list(files.select_related("broker", "cycle").defer("content")[:2])
    if not found:
        raise CommandError(f"broker {broker.broker_id} has no response file {file_name!r}")
    if len(found) > 1:
        raise CommandError(f"{file_name} names files of several cycles: add --cycle")
    return found[0]


def _file_json(report_file: ReportFile) -> dict[str, Any]:
    return {
        "file_name": report_file.file_name,
        "cycle": report_file.cycle.drop_session_id,
        "kind": report_file.kind,
        "rows": report_file.rows,
        "sha256": report_file.sha256,
        "state": report_file.state,
        "drop_response": report_file.drop_response,
        "discard_reason": report_file.discard_reason,
    }


def _deadline_line(deadline: CycleDeadline) -> str:
    cycle = deadline.cycle
    when = (
        f"overdue by {-deadline.days_left} day(s)"
        if deadline.days_left < 0
        else f"{deadline.days_left} day(s) left"
    )
    return (
        f"Cycle {cycle.drop_session_id} is due {cycle.due_date.isoformat()} ({when}): "
        f"{deadline.owed} status(es) DROP does not hold yet, {deadline.not_reportable} of them "
        "still waiting for an outcome (or for staff)."
    )


def _as_json(run: ReportRun, saved: list[str], deadlines: list[CycleDeadline]) -> dict[str, Any]:
    return {
        "written": [_file_json(f) for f in run.written],
        "accepted": [_file_json(f) for f in run.accepted],
        "rejected": [_file_json(f) for f in run.rejected],
        "refused": [_file_json(f) for f in run.refused],
        "waiting": [_file_json(f) for f in run.pending if f.state == ReportFileState.WRITTEN],
        "saved": saved,
        "error": run.error,
        "open_cycles": [
            {
                "cycle": d.cycle.drop_session_id,
                "due_date": d.cycle.due_date.isoformat(),
                "days_left": d.days_left,
                "statuses_owed": d.owed,
                "waiting_for_outcome": d.not_reportable,
            }
            for d in deadlines
        ],
    }
