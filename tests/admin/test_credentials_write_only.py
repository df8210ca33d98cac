"""Stored credentials are write-only in the admin, for every role, superusers included.

No admin page holds a stored credential: the DROP API key, ISI tokens, OAuth client secrets,
SaaS tokens, Webhook Secrets (current and previous), a cached access token, or a staff
member's TOTP seed and recovery codes. The walk that proves it for each role is the role
table's (``tests/admin/test_role_table.py``), over the world built by ``credentials_stored``
(``tests/admin/conftest.py``): every page a role opens there is read for every credential,
and Auditors, Operators and superusers also open ``credential_pages`` (the dashboard, every
registered model's list, the change and history pages of every row of a model that holds a
credential and of the first row of the others). The tests here read the broker's page alone.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from integrations.models import Broker
from integrations.services.staff.brokers import broker_update
from tests.admin.conftest import DROP_KEY
from tests.builders import SaasConnectionFactory, WebhookIntegrationFactory

pytestmark = pytest.mark.django_db


def _login(client: Client, role: str) -> Client:
    if role == "superuser":
        user = User.objects.create_superuser("root", "root@example.com", "pw-123-root")
    else:
        user = User.objects.create_user(role.lower(), password="pw-123-role", is_staff=True)
        user.groups.add(Group.objects.get(name=role))
    client.force_login(user)
    return client


# These two read the broker's page alone: a broker is all it needs, not every credential.
def test_a_credential_not_set_says_so(broker: Broker, client: Client) -> None:
    Broker.objects.update(drop_api_key="")
    staff = _login(client, "Auditors")
    page = staff.get(reverse("admin:integrations_broker_change", args=[broker.pk])).content
    assert b"not set" in page


def test_a_manager_enters_a_new_value_into_an_empty_input(broker: Broker, client: Client) -> None:
    broker_update(broker=broker, actor="test", drop_api_key=DROP_KEY)
    staff = _login(client, "superuser")
    page = staff.get(reverse("admin:integrations_broker_change", args=[broker.pk])).content
    assert b'type="password" name="drop_api_key"' in page
    assert DROP_KEY.encode() not in page


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_saving_a_page_without_a_new_credential_records_no_change_of_it(
    broker: Broker, client: Client
) -> None:
    # Django's history of the row (every role that may view it reads it) said "Changed DROP
    # API key" at every save: the form's initial value was the stored key, the input empty.
    broker_update(broker=broker, actor="test", drop_api_key=DROP_KEY)
    staff = _login(client, "Connections managers")
    url = reverse("admin:integrations_broker_change", args=[broker.pk])
    page = staff.get(url)
    assert DROP_KEY not in page.context["adminform"].form.initial.values()
    saved = staff.post(url, {"name": "Acme Data 2", "mode": broker.mode, "pull_interval_days": 30})
    assert saved.status_code == 302
    (entry,) = LogEntry.objects.filter(object_id=str(broker.pk))
    assert "DROP API key" not in entry.change_message
    assert "Name" in entry.change_message
    assert Broker.objects.get().drop_api_key == DROP_KEY
    history = staff.get(reverse("admin:integrations_broker_history", args=[broker.pk]))
    assert "DROP API key" not in history.content.decode()


# A target's URL may carry a token in its query; staff who manage the target edit it whole.
URL_TOKEN = "urlToken7Q"


@pytest.mark.parametrize("role", ["Auditors", "Operators"])
def test_a_view_only_role_reads_a_target_url_without_its_query(
    broker: Broker, client: Client, role: str
) -> None:
    hook = WebhookIntegrationFactory.create(
        broker=broker, url=f"https://crm.acme.example/drop?key={URL_TOKEN}"
    )
    saas = SaasConnectionFactory.create(
        broker=broker, url=f"https://api.mailer.example/erase?api_key={URL_TOKEN}"
    )
    staff = _login(client, role)

    for url in (
        "/admin/integrations/webhookintegration/",
        f"/admin/integrations/webhookintegration/{hook.pk}/change/",
        "/admin/integrations/saasconnection/",
        f"/admin/integrations/saasconnection/{saas.pk}/change/",
    ):
        page = staff.get(url)
        assert page.status_code == 200, url
        assert URL_TOKEN.encode() not in page.content, url
        assert b"https://crm.acme.example/drop" in page.content or b"mailer" in page.content

    # Nor through a search or a filter of the list, a character at a time.
    searched = staff.get("/admin/integrations/saasconnection/", {"q": f"api_key={URL_TOKEN}"})
    assert saas.name.encode() not in searched.content.split(b"result_list")[-1]
    for url in (
        f"/admin/integrations/webhookintegration/?url__contains={URL_TOKEN}",
        f"/admin/integrations/saasconnection/?url__contains={URL_TOKEN}",
    ):
        assert staff.get(url).status_code == 400, url


def test_no_role_filters_api_keys_by_their_digest(client: Client) -> None:
    staff = _login(client, "Auditors")  # who may list the keys
    assert staff.get("/admin/integrations/apikey/").status_code == 200

    assert staff.get("/admin/integrations/apikey/?digest__startswith=a").status_code == 400


def test_staff_who_manage_a_target_edit_its_url_whole(broker: Broker, client: Client) -> None:
    saas = SaasConnectionFactory.create(
        broker=broker, url=f"https://api.mailer.example/erase?api_key={URL_TOKEN}"
    )
    staff = _login(client, "Connections managers")

    page = staff.get(f"/admin/integrations/saasconnection/{saas.pk}/change/")

    assert f'value="https://api.mailer.example/erase?api_key={URL_TOKEN}"'.encode() in page.content
