"""``manage.py worker``: run the job worker until stopped (Ctrl-C or SIGTERM).

Any number of workers may run, on any number of hosts, against the same PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Run the job worker (dispatches, DROP pulls and reports, ledger sealing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=4, help="jobs run at once")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("procrastinate", "worker", "--concurrency", str(options["concurrency"]))
