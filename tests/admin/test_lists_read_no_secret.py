"""No list of the admin reads an encrypted column: not of its rows, not of the rows it reads
with them (a request's broker and integration), not of the rows its filters offer
(``dropportal.admin._EncryptedColumnsUnread``). A credential's own page still reads it.

So every list opens with keys that cannot read the stored secrets (a botched rotation),
where staff look for why; and the lists decrypt nothing, at no extra query per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from cryptography.fernet import Fernet
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Model
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from integrations import encryption
from integrations.models import (
    Broker,
    DeletionRequest,
    Integration,
    ResolutionRequest,
    SaasConnection,
    SaasDeletion,
    WorkItem,
)
from integrations.models.fields import EncryptedTextField, encrypted_columns_deferred
from integrations.services.staff.keys import CreatedApiKey
from tests.admin.conftest import credentials_stored
from tests.builders import (
    BrokerFactory,
    ResolutionRequestFactory,
    SaasConnectionFactory,
    SaasDeletionFactory,
    WebhookIntegrationFactory,
    sample_cycle,
)

pytestmark = pytest.mark.django_db

# The lists staff open most, each with a row it must show.
SHOWN = [DeletionRequest, ResolutionRequest, SaasDeletion, WorkItem, Integration, Broker]


@pytest.fixture
def world(broker: Broker, make_key: Callable[..., CreatedApiKey]) -> None:
    """A sample cycle (requests, resolutions with identifiers, a SaaS deletion) and one
    stored credential of each kind."""
    sample = sample_cycle(broker, today=timezone.localdate())
    credentials_stored(broker, sample.integration, make_key("webhook_callback").key)


@pytest.fixture
def staff(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-123-root"))
    return client


@pytest.fixture
def decryptions(monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """One entry per value decrypted from here on."""
    done: list[None] = []
    decrypt = encryption.decrypt

    def counted(token: str) -> str:
        done.append(None)
        return decrypt(token)

    monkeypatch.setattr(encryption, "decrypt", counted)
    return done


def _lists() -> Iterator[str]:
    for model in admin.site._registry:
        yield reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def _change_url(obj: Model) -> str:
    meta = obj._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])


@pytest.mark.usefixtures("world")
def test_no_list_decrypts_a_secret_and_a_credentials_page_still_reads_it(
    staff: Client, broker: Broker, decryptions: list[None]
) -> None:
    for url in _lists():
        assert staff.get(url).status_code == 200, url
        assert decryptions == [], f"{url} decrypted {len(decryptions)} value(s)"
    # Filtered by a broker and an integration, as staff filter them.
    integration = Integration.objects.values_list("pk", flat=True)[0]
    for model in (DeletionRequest, ResolutionRequest):
        url = reverse(f"admin:integrations_{model._meta.model_name}_changelist")
        for params in ({"broker__id__exact": broker.pk}, {"integration__id__exact": integration}):
            assert staff.get(url, params).status_code == 200
    assert decryptions == []

    page = staff.get(_change_url(broker)).content.decode()
    assert "set (last changed" in page  # the DROP API key, read to say so
    assert decryptions


@pytest.mark.usefixtures("world")
def test_every_list_shows_its_rows_with_keys_that_cannot_read_the_secrets(
    staff: Client, settings: object
) -> None:
    settings.DROPPORTAL_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]  # type: ignore[attr-defined]
    with pytest.raises(encryption.DecryptionError):
        list(Broker.objects.all())  # the keys indeed read no stored secret

    for url in _lists():
        assert staff.get(url).status_code == 200, url
    for model in SHOWN:
        row = model._default_manager.defer(*_encrypted(model)).first()
        assert row is not None, model
        listed = staff.get(reverse(f"admin:integrations_{model._meta.model_name}_changelist"))
        assert _change_url(row) in listed.content.decode(), model


def _encrypted(model: type[Model]) -> list[str]:
    return [f.name for f in model._meta.concrete_fields if isinstance(f, EncryptedTextField)]


@pytest.mark.parametrize("model", ["broker", "integration", "apikey"])
def test_a_lists_queries_do_not_grow_with_its_rows_nor_decrypt(
    staff: Client, make_key: Callable[..., CreatedApiKey], decryptions: list[None], model: str
) -> None:
    url = reverse(f"admin:integrations_{model}_changelist")

    def add_row() -> None:
        broker = BrokerFactory.create(drop_api_key="drop-key-listed")
        WebhookIntegrationFactory.create(broker=broker)
        make_key("webhook_callback", for_broker=broker)

    def queries() -> int:
        with CaptureQueriesContext(connection) as read:
            assert staff.get(url).status_code == 200
        return len(read.captured_queries)

    add_row()
    one = queries()
    add_row()
    add_row()
    assert queries() == one
    assert decryptions == []


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
def test_the_broker_list_says_which_broker_has_a_drop_api_key(
    staff: Client, broker: Broker, decryptions: list[None]
) -> None:
    keyed = BrokerFactory.create(drop_api_key="drop-key-listed")

    listed = staff.get(reverse("admin:integrations_broker_changelist")).context["cl"]
    shown = {b.broker_id: listed.model_admin.has_drop_api_key(b) for b in listed.result_list}

    assert shown == {broker.broker_id: False, keyed.broker_id: True}
    assert decryptions == []


@pytest.mark.usefixtures("world")
def test_the_encrypted_columns_deferred_follow_what_a_query_reads_with_its_rows(
    decryptions: list[None],
) -> None:
    assert encrypted_columns_deferred(WorkItem, ["broker", "cycle__broker"]) == [
        "broker__drop_api_key",
        "broker__drop_webhook_secret",
        "cycle__broker__drop_api_key",
        "cycle__broker__drop_webhook_secret",
    ]
    assert encrypted_columns_deferred(ResolutionRequest) == ["identifiers"]
    read = [
        DeletionRequest.objects.select_related(),  # every foreign key that is not null
        DeletionRequest.objects.select_related("integration__broker", "opt_out"),
        SaasDeletion.objects.select_related("resolution__broker", "saas_connection"),
        WorkItem.objects.select_related("broker", "cycle__broker"),
    ]
    for rows in read:
        unread = encrypted_columns_deferred(rows.model, rows.query.select_related)
        assert list(rows.defer(*unread)), rows.model
    assert decryptions == []


def _choices(staff: Client, model: type[Model], field_path: str) -> list[tuple[object, str]]:
    """What a list's filter by ``field_path`` offers, as its page built it."""
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    (spec,) = (
        spec
        for spec in staff.get(url).context["cl"].filter_specs
        if getattr(spec, "field_path", None) == field_path
    )
    return list(spec.lookup_choices)


@pytest.mark.usefixtures("templates_recorded")
def test_a_related_only_filter_offers_only_the_rows_the_list_uses(
    staff: Client, broker: Broker, decryptions: list[None]
) -> None:
    """Read without their encrypted columns, the choices are still Django's: those the
    filter's ``limit_choices_to`` leaves (the SaaS connections some deletion uses)."""
    used = [
        SaasConnectionFactory.create(broker=broker, name=name, token=f"tok-{name}")
        for name in ("Mailer", "CRM")
    ]
    SaasConnectionFactory.create(broker=broker, name="Unused CRM", token="tok-unused")
    for connection_used in used:  # a filter of one choice is not shown: two are used
        SaasDeletionFactory.create(
            resolution=ResolutionRequestFactory.create(integration__broker=broker),
            saas_connection=connection_used,
        )

    offered = _choices(staff, SaasDeletion, "saas_connection")

    assert decryptions == []
    assert sorted(offered) == sorted((c.pk, str(c)) for c in used)
    assert SaasConnection.objects.count() == 3


@pytest.mark.usefixtures("templates_recorded")
def test_a_related_filters_choices_come_in_the_related_admins_order(
    staff: Client, broker: Broker, decryptions: list[None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Django orders a related filter's choices as the related model's admin orders its
    list: so do they, read without their encrypted columns."""
    for name in ("Alpha", "Charlie", "Bravo"):  # created out of the order asked
        BrokerFactory.create(name=name, drop_api_key="a-key")
    monkeypatch.setattr(admin.site._registry[Broker], "ordering", ["-name"])

    offered = _choices(staff, Integration, "broker")

    assert decryptions == []
    assert offered == [(b.pk, str(b)) for b in Broker.objects.order_by("-name")]
