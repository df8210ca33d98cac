"""Bad input in the admin gets a clear answer (a 400, a form error, a message or the list
without the bad filter), never a 500: each case a page or a link can send."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from integrations.models import Broker
from tests.admin.test_role_table import role_user
from tests.builders import DeletionRequestFactory, OptOutRecordFactory, ResolutionRequestFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(role_user("Superusers"))
    return client


# -- the opt-out records' request column -------------------------------------------------------


@pytest.mark.parametrize("order", ["0", "-0"])
def test_opt_out_records_sort_by_their_request_column(
    broker: Broker, superuser_client: Client, order: str
) -> None:
    # One record of a deletion, one of a resolution: the column is whichever request it has.
    records = [
        OptOutRecordFactory.create(deletion_request=DeletionRequestFactory.create()),
        OptOutRecordFactory.create(resolution_request=ResolutionRequestFactory.create()),
        OptOutRecordFactory.create(deletion_request=DeletionRequestFactory.create()),
    ]
    expected = sorted(records, key=lambda record: record.request_uuid, reverse=order == "-0")

    # The column header's own link.
    page = superuser_client.get(f"/admin/integrations/optoutrecord/?o={order}")

    assert page.status_code == 200
    listed = re.findall(
        r'href="/admin/integrations/optoutrecord/(\d+)/change/[^"]*" title="([^"]+)"',
        page.content.decode(),
    )
    assert listed == [(str(record.pk), str(record.request_uuid)) for record in expected]
