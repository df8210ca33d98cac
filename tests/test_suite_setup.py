"""The suite's own set-up: what a test that flushes the database leaves for the next one."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command


@pytest.mark.django_db(transaction=True)
def test_the_staff_roles_survive_a_flush() -> None:
    before = {
        g.name: sorted(g.permissions.values_list("codename", flat=True))
        for g in Group.objects.all()
    }
    assert {"Auditors", "Operators", "Connections managers"} <= set(before)

    call_command("flush", interactive=False, verbosity=0)  # as a transactional test ends

    after = {
        g.name: sorted(g.permissions.values_list("codename", flat=True))
        for g in Group.objects.all()
    }
    assert after == before
