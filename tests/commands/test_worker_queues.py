"""``manage.py worker`` runs every queue the project's jobs are deferred to: a queue in no
group would keep its jobs waiting for good. A bad argument is one line, as for every command."""

from __future__ import annotations

import pytest
from django.core.management import ManagementUtility
from procrastinate.contrib.django import app

from integrations.management.commands.worker import GROUPS


def test_every_queue_of_the_project_s_jobs_is_in_a_worker_group() -> None:
    app.perform_import_paths()
    queues = {task.queue for task in app.tasks.values() if task.name.startswith("integrations.")}
    served = {queue for group in GROUPS.values() for queue in group}

    assert "alerts" in queues
    assert queues <= served, sorted(queues - served)


def test_a_bad_argument_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["manage.py", "worker", "--concurrency", "x"]
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(argv).fetch_command("worker").run_from_argv(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "manage.py worker: error: argument --concurrency: invalid int value: 'x'\n"
    )
