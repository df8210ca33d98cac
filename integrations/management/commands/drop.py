"""``manage.py drop pull|import|report|doctor|notice``: bring DROP's deletion lists in,
matched; report; find what is stuck; record the notice a DROP outage obliges.

    manage.py drop pull --broker 4821            # download (waiting through 202), import, match
    manage.py drop import --broker 4821 20260312_4821_DROP.zip
    manage.py drop report --broker 4821 --upload # response CSVs (``management/drop_report.py``)
    manage.py drop doctor [--broker 4821] [--json]   # exit 1 when a work item is stuck
                                                     # or a notice to CalPrivacy is owed
    manage.py drop notice --broker 4821 --sent 2027-03-02 --reference "DROP msg 1182"
    manage.py drop metrics --broker 4821 --year 2027 --format json   # the year's figures
    manage.py drop metrics --broker 4821 --year 2027 --registry      # the registry's columns
    manage.py drop suppression export --broker 4821 [--format parquet] [--out F|s3://...]
    manage.py drop reappearances --broker 4821 [--since 2027-01-01] [--json]
    manage.py drop directives --broker 4821      # directives to service providers
                                                 # (``management/drop_directives.py``)
    manage.py drop recurring --broker 4821 [--ahead 5] [--json]   # recurring rounds due now
    manage.py drop canary --broker 4821 [--json]  # a canary round now (drop_session_id "0")

Both print the cycle (``--json``: one JSON object); a refusal is one line on stderr and exit 1.
When part of the package was not imported (a DROP list or rows that could not be read), the
rest is imported and printed, then one line names each such file and why, and the exit is 1,
so automation notices.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.utils import timezone
from tqdm import tqdm

from integrations.drop.calendar import DROP_YEARS, drop_time_text
from integrations.exports import csv_cell
from integrations.management.base import broker_or_error, broker_or_every, date_bound
from integrations.management.drop_directives import DirectiveSubcommands
from integrations.management.drop_report import ReportSubcommand
from integrations.management.drop_suppression import SuppressionSubcommands
from integrations.models import CANARY_SESSION_ID, BrokerMode
from integrations.selectors.directives import (
    directive_ack_due_date,
    directive_as_json,
    directives_overdue,
)
from integrations.selectors.drop_access import drop_access_obligations_open
from integrations.selectors.drop_metrics import (
    METRIC_FIGURES,
    REGISTRY_COLUMNS,
    drop_metrics,
    drop_registry_figures,
    sandbox_note,
)
from integrations.selectors.stuck import stuck_work_items
from integrations.services.cycle.canaries import canary_round_send
from integrations.services.cycle.drop import (
    DEFAULT_MAX_WAIT_SECONDS,
    DropPullError,
    drop_package_import,
    drop_pull,
)
from integrations.services.cycle.drop_access import drop_access_notice_record
from integrations.services.cycle.drop_import import DropImportError, ImportResult
from integrations.services.cycle.recurring import recurring_rounds_send


class Command(DirectiveSubcommands, ReportSubcommand, SuppressionSubcommands):
    help = (
        "Pull DROP's deletion lists for a broker, or import a downloaded ZIP (both match); "
        "report the statuses back."
    )

    def add_subcommands(self, subparsers: Any) -> None:
        pull = subparsers.add_parser("pull", help="download from DROP, import and match")
        pull.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        pull.add_argument(
            "--max-wait",
            type=float,
            default=DEFAULT_MAX_WAIT_SECONDS,
            help="seconds to keep waiting while DROP prepares the package or throttles "
            f"(default {DEFAULT_MAX_WAIT_SECONDS:g}); receiving the package does not count",
        )
        pull.add_argument("--json", action="store_true", help="print the result as JSON")

        imp = subparsers.add_parser("import", help="import and match a DROP ZIP from disk")
        imp.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        imp.add_argument("file", help="the ZIP as downloaded from DROP")
        imp.add_argument(
            "--downloaded-at",
            help="when it was downloaded from DROP (YYYY-MM-DD, a day of DROP's calendar, or "
            "ISO time; not after now, nor before the package's date); the due date counts "
            "from it. Default: the package's date, or now if that is later",
        )
        imp.add_argument("--json", action="store_true", help="print the result as JSON")
        self.add_report_subcommand(subparsers)
        metrics = subparsers.add_parser("metrics", help="the year's DROP figures")
        metrics.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        metrics.add_argument("--year", required=True, type=int, help="the year (YYYY)")
        metrics.add_argument("--format", choices=("csv", "json"), default="csv")
        metrics.add_argument(
            "--registry",
            action="store_true",
            help="the Delete Act registration's columns for deletion requests from DROP: "
            "received, complied with in whole, in part, denied, mean and median days",
        )

        doctor = subparsers.add_parser(
            "doctor",
            help="list the open work items no automatic path brings to a status, by reason; "
            "exit 1 when there is any",
        )
        doctor.add_argument("--broker", help="only this broker (its 4-digit DROP id)")
        doctor.add_argument("--json", action="store_true", help="print the result as JSON")
        self.add_suppression_subcommands(subparsers)

        notice = subparsers.add_parser(
            "notice",
            help="record the written notice to CalPrivacy that a DROP outage of more than a "
            "day obliges (closes the broker's obligations awaiting one)",
        )
        notice.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        notice.add_argument(
            "--sent", required=True, help="the day the notice was sent (YYYY-MM-DD)"
        )
        notice.add_argument(
            "--reference",
            required=True,
            help="what identifies the notice (DROP's message number, a letter's reference)",
        )
        notice.add_argument("--json", action="store_true", help="print the result as JSON")
        self.add_directive_subcommands(subparsers)

        recurring = subparsers.add_parser(
            "recurring",
            help="send now every recurring deletion round due today or within --ahead days",
        )
        recurring.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        recurring.add_argument(
            "--ahead",
            type=int,
            default=0,
            help="also the rounds due within this many days (before a holiday, say), at most "
            "DROPPORTAL_RECURRING_DAYS; default 0",
        )
        recurring.add_argument("--json", action="store_true", help="print the result as JSON")

        canary = subparsers.add_parser(
            "canary",
            help="send a canary round now: each canary a deletion to every target, with "
            "drop_session_id 0, never reported to DROP",
        )
        canary.add_argument("--broker", required=True, help="the broker's 4-digit DROP id")
        canary.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle_pull(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        if not math.isfinite(options["max_wait"]) or options["max_wait"] < 0:  # nan waits forever
            raise CommandError("--max-wait must be 0 or more seconds")
        err = getattr(self.stderr, "_out", sys.stderr)  # tqdm draws with \r: the bare stream
        # disable=None: no bar unless stderr is a terminal.
        with tqdm(
            unit="B", unit_scale=True, desc="DROP package", file=err, disable=None, leave=False
        ) as bar:

            def on_progress(received: int, announced: int | None) -> None:
                bar.total = announced
                bar.n = received
                bar.refresh()

            try:
                result = drop_pull(
                    broker=broker,
                    actor=self.actor(),
                    max_wait_seconds=options["max_wait"],
                    on_progress=on_progress,
                )
            except DropPullError as exc:
                raise CommandError(str(exc)) from None
        if result.imported is None:
            if options["json"]:
                self.print_json({"outcome": result.outcome, "message": result.message})
            else:
                self.stdout.write(f"Nothing new from DROP: {result.message}")
            return
        self._report(result.imported, as_json=options["json"], outcome=result.outcome)

    def handle_import(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        path = Path(options["file"])
        if path.is_dir():
            raise CommandError(f"{path} is a folder: give the ZIP as downloaded from DROP")
        if not path.is_file():
            raise CommandError(f"no such file: {path}")
        downloaded_at: dt.datetime | None = None
        if options["downloaded_at"]:
            # A date is a day of DROP's calendar, like the date in the package's file names.
            downloaded_at = date_bound(options["downloaded_at"])
        try:
            result = drop_package_import(
                broker=broker, path=path, downloaded_at=downloaded_at, actor=self.actor()
            )
        except (DropImportError, DropPullError) as exc:
            raise CommandError(str(exc)) from None
        self._report(
            result, as_json=options["json"], outcome="imported" if result.created else "unchanged"
        )

    def handle_metrics(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        if options["year"] not in DROP_YEARS:
            raise CommandError(f"--year must be a year like 2027, not {options['year']}")
        as_json = options["format"] == "json"
        if broker.mode != BrokerMode.PRODUCTION:
            # Said, not refused: a broker switched back to test still owes the disclosure of
            # the year it was in production. On stderr, so the CSV or JSON stays whole.
            self.stderr.write(sandbox_note(broker))
        if options["registry"]:
            figures = drop_registry_figures(broker=broker, year=options["year"])
            if as_json:
                self.print_json(figures)
                return
            writer = csv.writer(self.stdout, lineterminator="\n")
            writer.writerow(["year", *(key for key, _ in REGISTRY_COLUMNS)])
            writer.writerow([figures["year"], *(figures[key] for key, _ in REGISTRY_COLUMNS)])
            return
        metrics = drop_metrics(broker=broker, year=options["year"])
        if as_json:
            self.print_json(metrics.as_json())
            return
        writer = csv.writer(self.stdout, lineterminator="\n")
        keys = [key for key, _ in METRIC_FIGURES]
        writer.writerow(["list_type", *keys, "median_days", "mean_days"])
        for row in metrics.rows:
            writer.writerow(
                [row.list_type, *(row.figures[k] for k in keys), row.median_days, row.mean_days]
            )
        # The denials by exemption basis, as rows of their own with only "denied" filled.
        for basis, count in metrics.exemption_bases.items():
            cells = [count if key == "denied" else "" for key in keys]
            writer.writerow([f"denied, exemption basis: {csv_cell(basis)}", *cells, "", ""])

    def _report(self, result: ImportResult, *, as_json: bool, outcome: str) -> None:
        cycle = result.cycle
        if as_json:
            self.print_json(
                {
                    "outcome": outcome,
                    "broker_id": cycle.broker.broker_id,
                    "drop_session_id": cycle.drop_session_id,
                    "zip_name": cycle.zip_name,
                    "zip_sha256": cycle.zip_sha256,
                    "downloaded_at": cycle.downloaded_at.isoformat(),
                    "match_date": cycle.match_date.isoformat(),
                    "due_date": cycle.due_date.isoformat(),
                    "files": cycle.files,
                    "work_items": cycle.work_items,
                    "matched": cycle.matched,
                    "not_found": cycle.not_found,
                    "removed": {
                        "rows": cycle.removed,
                        "closed": result.removed.closed,
                        "unknown": result.removed.unknown,
                        "requests_cancelled": result.removed.requests_cancelled,
                    },
                    "deletion_requests": {
                        "created": result.requests.deletion_requests,
                        "queued": result.requests.queued,
                        "pending": result.requests.pending,
                    },
                    "seconds": {
                        "import": round(result.import_seconds, 3),
                        "match": round(result.match_seconds, 3),
                        "requests": round(result.requests_seconds, 3),
                        "commit": round(result.commit_seconds, 3),
                    },
                    "not_imported": [
                        {"file": part.name, "reason": part.reason} for part in result.not_imported
                    ],
                }
            )
            self._not_imported_refusal(result)
            return
        if not result.created:
            self.stdout.write(
                f"{cycle.zip_name} was already imported as cycle {cycle.drop_session_id}: "
                "nothing changed."
            )
            self._not_imported_refusal(result)
            return
        self.stdout.write(
            f"Cycle {cycle.drop_session_id} from {cycle.zip_name}: {cycle.work_items} work "
            f"items, {cycle.matched} matched, {cycle.not_found} not found (status 5), "
            f"{result.requests.deletion_requests} deletion requests "
            f"({result.requests.queued} queued, {result.requests.pending} waiting for a "
            f"target); report by {cycle.due_date.isoformat()}."
        )
        if cycle.removed:
            self.stdout.write(
                f"Removed by DROP: {result.removed.closed} work items closed, "
                f"{result.removed.requests_cancelled} undelivered requests cancelled, "
                f"{result.removed.unknown} ids not open here."
            )
        self._not_imported_refusal(result)

    @staticmethod
    def _not_imported_refusal(result: ImportResult) -> None:
        """Exit 1 naming each file of the package not imported and why (the rest was)."""
        if result.not_imported:
            raise CommandError(
                f"part of {result.cycle.zip_name} was not imported (the rest was, as cycle "
                f"{result.cycle.drop_session_id}): "
                + "; ".join(f"{part.name}: {part.reason}" for part in result.not_imported)
            )

    def handle_doctor(self, **options: Any) -> None:
        broker = broker_or_every(options["broker"])
        groups = stuck_work_items(broker=broker)
        obligations = list(drop_access_obligations_open(broker=broker))
        # Not a work item's path to a status, but a duty still owed: listed apart.
        overdue = list(directives_overdue(now=timezone.now(), broker=broker))
        base = settings.DROPPORTAL_PUBLIC_URL
        if options["json"]:
            self.print_json(
                {
                    "stuck": bool(groups),
                    "work_items": sum(g.work_items for g in groups),
                    "groups": [{**g.as_json(), "admin_url": base + g.admin_path} for g in groups],
                    "drop_access_obligations": [
                        {
                            "broker_id": o.broker.broker_id,
                            "failure_started_at": o.failure_started_at.isoformat(),
                            "due_date": o.due_date.isoformat(),
                            "ongoing": o.outage.ended_at is None,
                        }
                        for o in obligations
                    ],
                    "directives_not_acknowledged": [directive_as_json(d) for d in overdue],
                }
            )
        elif not groups:
            self.stdout.write("No stuck work item: every open one has a live path to a status.")
        for group in [] if options["json"] else groups:
            self.stderr.write(
                f"broker {group.broker_id}: {group.work_items} work item(s) {group.label}"
                f" [{group.reason}], nearest due {group.nearest_due_date.isoformat()}:"
                f" {base}{group.admin_path}"
            )
        for obligation in [] if options["json"] else obligations:
            broker_id = obligation.broker.broker_id
            self.stderr.write(
                f"broker {broker_id}: DROP unreachable for more than a day from "
                f"{drop_time_text(obligation.failure_started_at)} [drop_access_obligation]: "
                "download by hand and notify CalPrivacy in writing through the DROP account "
                f"by {obligation.due_date.isoformat()}, then record it with `drop notice "
                f"--broker {broker_id} --sent DATE --reference TEXT`"
            )
        for directive in [] if options["json"] else overdue:
            self.stderr.write(
                f"broker {directive.broker.broker_id}: directive {directive.pk} to "
                f"{directive.provider.name} ({directive.rows} hashes) not acknowledged, due "
                f"{directive_ack_due_date(directive)}: record it with `manage.py providers "
                f"acknowledge {directive.pk} --reference TEXT`"
            )
        if groups or obligations or overdue:
            sys.exit(1)

    def handle_notice(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        try:
            sent_on = dt.date.fromisoformat(options["sent"])
        except ValueError:
            raise CommandError(f"--sent is not a date: {options['sent']!r} (YYYY-MM-DD)") from None
        recorded = drop_access_notice_record(
            broker=broker, sent_on=sent_on, reference=options["reference"], actor=self.actor()
        )
        if options["json"]:
            self.print_json(
                {
                    "broker_id": broker.broker_id,
                    "sent": sent_on.isoformat(),
                    "reference": options["reference"].strip(),
                    "obligations": [
                        {
                            "failure_started_at": o.failure_started_at.isoformat(),
                            "due_date": o.due_date.isoformat(),
                            "late": sent_on > o.due_date,
                        }
                        for o in recorded
                    ],
                }
            )
            return
        for obligation in recorded:
            late = " (after its due date)" if sent_on > obligation.due_date else ""
            self.stdout.write(
                f"Notice recorded for broker {broker.broker_id}: the DROP outage from "
                f"{drop_time_text(obligation.failure_started_at)}, due "
                f"{obligation.due_date.isoformat()}, notified on {sent_on.isoformat()}{late}."
            )

    def handle_recurring(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        days = settings.DROPPORTAL_RECURRING_DAYS
        if options["ahead"] < 0:
            raise CommandError("--ahead must be 0 or more days")
        if days <= 0:
            raise CommandError(
                "recurring deletion is off (DROPPORTAL_RECURRING_DAYS=0): the broker owes it "
                "by other means"
            )
        # A round's clock starts at an answer already given, so none is due further ahead
        # than the interval: a larger value sends nothing more (and a huge one overflows the
        # date).
        if options["ahead"] > days:
            raise CommandError(
                f"--ahead must be at most {days} days (DROPPORTAL_RECURRING_DAYS): no round "
                "is due further ahead"
            )
        sent = recurring_rounds_send(broker=broker, ahead_days=options["ahead"], actor=self.actor())
        if options["json"]:
            self.print_json(sent.as_json())
            return
        self.stdout.write(
            f"{sent.work_items} recurring round(s) sent (due by {sent.until.isoformat()}): "
            f"{sent.deletion_requests} deletion request(s) ({sent.queued} queued, "
            f"{sent.pending} waiting for a target), "
            f"{sent.resolution_requests} identifier retrieval(s)."
        )

    def handle_canary(self, **options: Any) -> None:
        broker = broker_or_error(options["broker"])
        canary_round = canary_round_send(broker=broker, actor=self.actor())
        if canary_round is None:
            raise CommandError(
                f"broker {broker.broker_id} has no canary: name one with `manage.py consumers "
                f"canary --broker {broker.broker_id} REMOTE_IDENTIFIER`"
            )
        sent = canary_round.deletion_requests.count()
        if options["json"]:
            self.print_json(
                {
                    "canary_round": canary_round.pk,
                    "drop_session_id": CANARY_SESSION_ID,
                    "canaries": canary_round.canaries,
                    "missing": canary_round.missing,
                    "targets": canary_round.targets,
                    "deletion_requests": sent,
                    "answer_by": canary_round.answer_by.isoformat(),
                }
            )
        else:
            self.stdout.write(
                f"Canary round {canary_round.pk} sent: {len(canary_round.canaries)} canary(ies) "
                f"to {canary_round.targets} target(s), {sent} deletion request(s) with "
                f"drop_session_id {CANARY_SESSION_ID}; each must be answered deleted by "
                f"{drop_time_text(canary_round.answer_by)}."
            )
        problems = [f"{name} is not registered as a consumer" for name in canary_round.missing]
        if not canary_round.targets:
            problems.append(f"broker {broker.broker_id} has no deletion target")
        if problems:
            raise CommandError(f"the round fails: {'; '.join(problems)}")
