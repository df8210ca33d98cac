"""``manage.py worker`` runs every queue the project's jobs are deferred to: a queue in no
group would keep its jobs waiting for good."""

from __future__ import annotations

from procrastinate.contrib.django import app

from integrations.management.commands.worker import GROUPS


def test_every_queue_of_the_project_s_jobs_is_in_a_worker_group() -> None:
    app.perform_import_paths()
    queues = {task.queue for task in app.tasks.values() if task.name.startswith("integrations.")}
    served = {queue for group in GROUPS.values() for queue in group}

    assert "alerts" in queues
    assert queues <= served, sorted(queues - served)
