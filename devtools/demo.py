"""``make demo``: a whole DROP cycle, narrated, against a simulated DROP and a simulated broker.

Everything runs on this machine: the service's web app on 127.0.0.1 (the broker's callbacks
reach it over HTTP), a job worker, the loopback DROP stand-in (``devtools/drop_simulator.py``)
serving generated packages, and the loopback broker (``devtools/broker_simulator.py``) that
checks the signature of every dispatch. The broker's answers are signed callbacks with a mix
of outcomes. The data goes to its own database, ``<your database>_demo`` on the same
PostgreSQL (the embedded one unless ``DATABASE_URL`` is set), created afresh on every run.
With ``DATABASE_URL`` set, the settings require ``SECRET_KEY``, ``DROPPORTAL_ENCRYPTION_KEYS``
and ``DROPPORTAL_EVIDENCE_KEY``: ``make demo`` passes the ones generated into ``var/``.

Then it prints where to look, ending on one consumer's story page, and serves the admin
until Ctrl-C::

    python -m devtools.demo                  # what make demo runs
    python -m devtools.demo --no-serve       # narrate and stop
    python -m devtools.demo --no-serve --screenshots docs   # also the README's pictures
    python -m devtools.demo --sso            # staff sign in through a loopback identity provider
    python -m devtools.demo --template NAME  # copy that migrated database (the tests' template)

A developer tool, not product code: nothing in ``integrations/`` imports it. It sets its
environment before Django starts, so it imports the app inside functions, after
``django.setup()``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import gc
import io
import json
import os
import random
import secrets
import socket
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

BROKER_ID = "4821"
# The signing secret the stand-in DROP's portal "shows" for its notifications.
DROP_WEBHOOK_SECRET = "whsec_demo-drop-notifications"  # noqa: S105 (a throwaway demo value)
DEMO_USER = "demo"
ROLE_LOGINS = {
    "auditor": "Auditors",
    "operator": "Operators",
    "connections": "Connections managers",
}
LATE_CONSUMER = "CRM-LATE-1"  # registered after cycle 1, matches a hash DROP sent in it
RESOLD_CONSUMER = "CRM-RESOLD-1"  # a deleted consumer, bought again from a data supplier
SUPPLIER_FILE = "supplier-batch.csv"
CANARY = "CRM-CANARY-1"  # a test consumer the broker keeps only to test its deletion system
PROVIDER = "Mailhouse"  # a service provider: directed to delete after each match
ROOT = Path(__file__).resolve().parents[1]

# Cycle 1 (downloaded by hand 40 days ago, imported from disk): every match answered.
FIRST_OUTCOMES = ["deleted"] * 14 + ["not_found"] * 4 + ["opted_out"] * 2 + ["exempt"] * 2
FIRST_FAILED = 2  # answered "failed" first; staff redispatch, then "deleted"
# Cycle 2 (pulled from DROP now): part answered, the rest still with the broker.
SECOND_OUTCOMES = ["deleted"] * 6 + ["not_found"] * 2 + ["opted_out"] + ["failed"]
SECOND_SILENT = 4


class Narrator:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.step = 0
        # Bold and dim on a terminal; plain text into a file or a pipe.
        tty = sys.stdout.isatty()
        self._bold, self._dim, self._plain = (
            ("\033[1m", "\033[2m", "\033[0m") if tty else ("", "", "")
        )

    def section(self, title: str) -> None:
        self.step += 1
        elapsed = time.monotonic() - self.started
        print(f"\n{self._bold}{self.step}. {title}{self._plain}  ({elapsed:4.1f} s)", flush=True)

    def say(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            print(f"   {line}", flush=True)

    def command(self, text: str) -> None:
        print(f"   {self._dim}$ python manage.py {text}{self._plain}", flush=True)


def free_port(preferred: int) -> int:
    with socket.socket() as probe:
        # As the server will bind: a port left in TIME_WAIT by a server that just stopped
        # is free to use.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])


def use_demo_database(template: str | None) -> str:
    """Point Django at a fresh ``<name>_demo`` database on the project's PostgreSQL: empty, or
    a copy of ``template`` (a database those migrations already made) to skip migrating."""
    from django.conf import settings
    from django.db import connection

    from devtools.databases import database_recreate, demo_database_name

    database = settings.DATABASES["default"]
    demo_name = demo_database_name(database["NAME"])
    # Django's connection is in autocommit here, which CREATE DATABASE needs.
    with connection.cursor() as cursor:
        database_recreate(cursor, demo_name, template=template)
    connection.close()  # the next query opens one on the demo's database
    database["NAME"] = demo_name
    return demo_name


def serve_in_background(port: int) -> None:
    """The service's web app (admin and API) on 127.0.0.1:port, in daemon threads."""
    import logging

    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    logging.getLogger("django.server").setLevel(logging.WARNING)
    logging.getLogger("django.request").setLevel(logging.ERROR)  # a browser asks for /favicon.ico

    class QuietHandler(WSGIRequestHandler):
        # Headers and body are two writes: without this the body waits for the browser's
        # delayed ACK of the headers, 40 ms on every page.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", port), QuietHandler)
    server.set_app(StaticFilesHandler(get_wsgi_application()))
    threading.Thread(target=server.serve_forever, daemon=True, name="web").start()


def run_jobs(*, wait: bool = False) -> None:
    """Run every queued job (deliveries) with a real worker until the queue is empty; with
    ``wait``, then each job as it is queued (PostgreSQL tells the worker), until it fails."""
    from procrastinate.contrib.django import app

    with app.replace_connector(app.connector.get_worker_connector()):  # type: ignore[attr-defined]
        app.run_worker(wait=wait, install_signal_handlers=False, listen_notify=wait)


def call(*args: str) -> str:
    from django.core.management import call_command

    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def call_with_stdin(text: str, *args: str) -> str:
    """``call`` with ``text`` on the command's standard input (a secret given as "-")."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command(*args, stdin=io.StringIO(text + "\n"), stdout=out)
    return out.getvalue().strip()


def consumers_csv(path: Path, count: int, *, start: int = 0) -> list[str]:
    """A broker's consumer file (clear identifiers); returns the emails, in order."""
    emails = []
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["remote_identifier", "email", "phone"])
        for n in range(start, start + count):
            email = f"Consumer.{n:04d}@Example.com"
            emails.append(email)
            writer.writerow([f"CRM-{n:05d}", email, f"+1 (415) 555-{n:04d}"])
    return emails


def drop_package(
    date: dt.date, matching_emails: list[str], *, unmatched: int, seed: int
) -> tuple[bytes, list[tuple[str, str]]]:
    """A DROP ZIP whose Email list holds the given emails' hashes among unknown ones."""
    from devtools.drop_simulator import build_drop_zip, work_items
    from integrations.drop.standardize import email_hash

    ids = [work_item_id for work_item_id, _ in work_items(len(matching_emails), start=seed)]
    rows = list(zip(ids, (email_hash(e) for e in matching_emails), strict=True))
    rows += list(work_items(unmatched, start=seed + 10_000))
    random.Random(seed).shuffle(rows)  # noqa: S311  (demo data, not a secret)
    phones = list(work_items(unmatched // 3, start=seed + 20_000))
    return build_drop_zip(BROKER_ID, date, {"Email": rows, "Phone": phones}), rows


class BrokerSystem:
    """The broker's side: its webhook receiver (the simulator) and its signed callbacks."""

    def __init__(self, simulator: Any, secret: str, api_key: str) -> None:
        import requests

        self.simulator, self.secret, self.api_key = simulator, secret, api_key
        self.answered: set[str] = set()
        # The broker's callbacks keep their connection, as a CRM's client would: each new
        # one was a new thread of the service's server, with a database connection of its own.
        self.http = requests.Session()

    def new_dispatches(self) -> list[Any]:
        fresh = []
        for received in self.simulator.received:
            body = received.json or {}
            if body.get("request_type") == "drop_deletion":
                key = body["webhook_request_id"]
                if key not in self.answered:
                    self.answered.add(key)
                    fresh.append(received)
        return fresh

    def answer(self, dispatch: Any, outcome: str) -> int:
        from devtools.broker_simulator import sign_callback

        body: dict[str, Any] = {
            "schema_version": "1.0",
            "status": "completed",
            "request_uuid": dispatch.json["request_uuid"],
            "drop_outcome": outcome,
        }
        if outcome == "failed":
            body["error_message"] = "CRM timeout while deleting"
        if outcome == "opted_out":
            body["identifiers"] = {"email": [{"email": "Household.Shared@Example.com"}]}
        raw, headers = sign_callback(self.secret, body)
        headers["Authorization"] = f"Bearer {self.api_key}"
        response = self.http.put(
            dispatch.json["webhook_callback_url"], data=raw, headers=headers, timeout=10
        )
        return response.status_code


def narrate(args: argparse.Namespace) -> None:
    say = Narrator()
    public_url, password = start_service(say, port=free_port(args.port), template=args.template)
    from devtools.broker_simulator import BrokerSimulator
    from devtools.drop_simulator import DropSimulator
    from devtools.tsa_simulator import TsaSimulator

    drop = DropSimulator(api_key="demo-drop-key", broker_id=BROKER_ID, active_download=True)
    broker_system_sim = BrokerSimulator(path="/drop/webhook")
    sso = identity_provider(say, public_url) if args.sso else contextlib.nullcontext()
    tsa = TsaSimulator(name="dropportal demo TSA")
    with drop, broker_system_sim, sso, tsa:
        broker_system = register_broker(say, drop, broker_system_sim)

        with tempfile.TemporaryDirectory(prefix="dropportal-demo-") as tmp:
            workdir = Path(tmp)
            say.section("The broker registers 400 consumers (clear identifiers, hashed on arrival)")
            emails = consumers_csv(workdir / "consumers.csv", 400)
            say.command("consumers import --broker 4821 consumers.csv")
            say.say(
                call("consumers", "import", "--broker", BROKER_ID, str(workdir / "consumers.csv"))
            )
            first_matches, first_rows = first_cycle(say, drop, broker_system, workdir, emails)
            provider_acknowledges(say, public_url)
            late_match(say, drop, broker_system, workdir, first_matches, first_rows)
            second_cycle(say, drop, broker_system, emails)
            chain_anchored(say, tsa)
            recurring_round(say, broker_system)
            reappearance(say, broker_system, workdir, emails)
            canary_round(say, broker_system, workdir)

        ledger_summary(say)
        auditor_checks_the_pack(say, tsa)

        story = story_url(public_url)
        if args.no_serve:
            say.section("Where to look")
            say.say("`make demo` (without --no-serve) serves the admin after the story.")
            say.say(f"{LATE_CONSUMER}'s story: {story}")
        else:
            where_to_look(say, public_url, password, story)
        if args.screenshots:
            for path in take_screenshots(public_url, password, story, Path(args.screenshots)):
                say.say(f"screenshot: {path}")
        print(f"\nDone in {time.monotonic() - say.started:.1f} s.", flush=True)
        if not args.no_serve:
            serve_until_interrupted(public_url)


def start_service(say: Narrator, *, port: int, template: str | None) -> tuple[str, str]:
    """A fresh, migrated demo database, a staff login, and the service on ``port``; the
    service's URL and the login's password."""
    public_url = f"http://127.0.0.1:{port}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dropportal.settings")
    os.environ["DROPPORTAL_PUBLIC_URL"] = public_url
    os.environ["DROPPORTAL_ALLOW_PRIVATE_TARGETS"] = "true"  # the simulators are on loopback
    os.environ.setdefault("DROPPORTAL_LOG_LEVEL", "WARNING")

    say.section("A fresh database and the service on " + public_url)
    import django

    django.setup()
    demo_db = use_demo_database(template)
    from django.conf import settings

    # A throwaway database served on 127.0.0.1 only: its one staff login goes without a
    # second factor even when DATABASE_URL is set (which requires one everywhere else).
    settings.DROPPORTAL_STAFF_MFA_REQUIRED = False
    from django.contrib.auth import get_user_model

    call("migrate", "--verbosity", "0")
    password = secrets.token_urlsafe(9)
    from django.contrib.auth.hashers import make_password

    get_user_model().objects.create_superuser(DEMO_USER, "demo@example.com")
    create_role_logins()
    # The logins share the password: derived once (each derivation is most of a second).
    get_user_model().objects.filter(username__in=[DEMO_USER, *ROLE_LOGINS]).update(
        password=make_password(password)
    )
    serve_in_background(port)
    say.say(f"database {demo_db}, migrated; staff login {DEMO_USER} / {password}")
    say.say(f"role logins {', '.join(ROLE_LOGINS)}, same password")
    return public_url, password


def identity_provider(say: Narrator, public_url: str) -> Any:
    """``--sso``: the company's identity provider on loopback (devtools/oidc_provider.py), set
    up as the admin's OIDC provider; its sign-in page lets you pick who you are."""
    from django.conf import settings

    from devtools.oidc_provider import OidcProvider

    secret = secrets.token_urlsafe(24)
    idp = OidcProvider(
        client_id="dropportal-demo",
        client_secret=secret,
        redirect_uri=f"{public_url}/admin/oidc/callback/",
        post_logout_redirect_uri=f"{public_url}/admin/login/",
    )
    idp.add_person("grace", groups=["privacy-ops"], amr=["pwd", "mfa"])
    idp.add_person("alan", groups=["privacy-auditors", "privacy-ops"], amr=["pwd", "otp"])
    idp.add_person("eve", groups=["marketing"])
    settings.DROPPORTAL_OIDC_ISSUER = idp.issuer
    settings.DROPPORTAL_OIDC_CLIENT_ID = "dropportal-demo"
    settings.DROPPORTAL_OIDC_CLIENT_SECRET = secret
    settings.DROPPORTAL_OIDC_PROVIDER_NAME = "the loopback IdP"
    settings.DROPPORTAL_OIDC_ROLE_MAP = {"privacy-ops": "Operators", "privacy-auditors": "Auditors"}
    say.say(f"identity provider on {idp.issuer}: sign in as grace (Operators), alan (Auditors and")
    say.say("Operators) or eve (no mapped group: refused) with 'Sign in with the loopback IdP'")
    return idp


def create_role_logins() -> None:
    """One login per staff role (the groups of migration 0005), to see the admin as each;
    their password is set with the demo login's."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    for username, role in ROLE_LOGINS.items():
        user = get_user_model().objects.create_user(
            username, f"{username}@example.com", is_staff=True
        )
        user.groups.add(Group.objects.get(name=role))


def register_broker(say: Narrator, drop: Any, broker_system_sim: Any) -> BrokerSystem:
    """Staff register the broker, its webhook integration and its callback key."""
    from integrations.drop.calendar import drop_today
    from integrations.services.staff.brokers import broker_create
    from integrations.services.staff.integrations import webhook_integration_create
    from integrations.services.staff.keys import api_key_create

    say.section("Staff register the broker, its webhook and a callback key")
    broker = broker_create(
        broker_id=BROKER_ID,
        name="Golden State Data Co.",
        # Production, against the stand-in its base URL names: the yearly figures the
        # auditor gets count production cycles only (a sandbox cycle is no request).
        mode="production",
        drop_api_key="demo-drop-key",
        drop_base_url=drop.url,
        actor=f"staff:{DEMO_USER}",
    )
    created = webhook_integration_create(
        broker=broker,
        name="CRM deletions",
        url=broker_system_sim.url,
        actor=f"staff:{DEMO_USER}",
    )
    key = api_key_create(
        broker=broker, scopes=["webhook_callback"], name="CRM callbacks", actor="demo"
    )
    broker_system_sim.secrets = [created.webhook_secret]
    broker_system = BrokerSystem(broker_system_sim, created.webhook_secret, key.key)
    say.say(f"broker {broker} (production mode), DROP at {drop.url} (the loopback stand-in)")
    say.say(f"webhook integration {created.integration.uuid} -> {broker_system_sim.url}")
    say.say(f"API key {key.api_key.prefix}… (scope webhook_callback) for the callbacks")
    # DROP's portal shows the broker a signing secret for its notifications; staff store it.
    say.command(f"providers add --broker 4821 --name {PROVIDER} --contact ops@mailhouse.example")
    say.say(
        call(
            "providers",
            "add",
            "--broker",
            BROKER_ID,
            "--name",
            PROVIDER,
            "--contact",
            "ops@mailhouse.example",
        )
    )
    say.command("brokers drop-webhook-secret 4821 -   # the secret DROP's portal shows, piped")
    say.say(call_with_stdin(DROP_WEBHOOK_SECRET, "brokers", "drop-webhook-secret", BROKER_ID, "-"))
    # The lists selected in DROP's portal, since before the first cycle's download: the
    # evidence pack holds every cycle's lists to it.
    since = f"{drop_today() - dt.timedelta(days=60)}"
    reason = "we hold consumers' emails and phone numbers"
    say.command(
        f'brokers lists-selected 4821 --lists email,phone --reason "{reason}" --since {since}'
    )
    say.say(
        call("brokers", "lists-selected", BROKER_ID, "--lists", "email,phone", "--reason", reason,
             "--since", since)
    )  # fmt: skip
    return broker_system


def first_cycle(
    say: Narrator, drop: Any, broker_system: BrokerSystem, workdir: Path, emails: list[str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """Cycle 1, imported from disk, answered, redispatched and reported; the emails it
    matched and the rows of its Email list."""
    from integrations.drop.calendar import drop_today
    from integrations.models import DeletionRequest, RequestState
    from integrations.services.dispatch.redelivery import deletion_request_redispatch

    say.section("Cycle 1: a DROP package downloaded by hand 40 days ago")
    first_day = drop_today() - dt.timedelta(days=40)
    first_matches = emails[: len(FIRST_OUTCOMES) + FIRST_FAILED]
    package, first_rows = drop_package(first_day, first_matches, unmatched=150, seed=1)
    zip_path = workdir / f"{first_day:%Y%m%d}_{BROKER_ID}_DROP.zip"
    zip_path.write_bytes(package)
    say.command(f"drop import --broker 4821 {zip_path.name} --downloaded-at {first_day}")
    say.say(
        call(
            "drop",
            "import",
            "--broker",
            BROKER_ID,
            str(zip_path),
            "--downloaded-at",
            first_day.isoformat(),
        )
    )
    deliver_and_answer(say, broker_system, FIRST_OUTCOMES + ["failed"] * FIRST_FAILED)

    say.section("Staff redispatch the failed outcomes; the broker deletes them")
    for request in DeletionRequest.objects.filter(state=RequestState.FAILED):
        deletion_request_redispatch(deletion_request=request, actor=f"staff:{DEMO_USER}")
    deliver_and_answer(say, broker_system, ["deleted"] * FIRST_FAILED)

    report(say, drop, upload=True)
    return first_matches, first_rows


def provider_acknowledges(say: Narrator, public_url: str) -> None:
    """A service provider got a signed directive after cycle 1's match; it acknowledges it
    with its own key."""
    import requests

    from integrations.models import Directive, ServiceProvider
    from integrations.services.staff.keys import api_key_create

    say.section("Service providers: the mailing house is directed to delete the same consumers")
    say.say(
        "The law asks the broker to direct its service providers and contractors to delete "
        "too (Civil Code 1798.99.86(c)(1)(C)): each match sends every registered provider a "
        "CSV of the DROP hashes to delete, signed with the evidence key."
    )
    say.command("drop directives --broker 4821")
    say.say(call("drop", "directives", "--broker", BROKER_ID))
    provider = ServiceProvider.objects.get(broker__broker_id=BROKER_ID, name=PROVIDER)
    key = api_key_create(
        broker=provider.broker,
        scopes=["directive_ack"],
        name="Mailhouse acknowledgements",
        actor=f"staff:{DEMO_USER}",
        provider=provider,
    )
    directive = Directive.objects.filter(provider=provider).latest("pk")
    answer = requests.post(
        f"{public_url}/api/v1/drop/directives/{directive.pk}/acknowledgement",
        json={"reference": "MH-4410: deleted, suppressed"},
        headers={"Authorization": f"Bearer {key.key}"},
        timeout=10,
    )
    say.say(
        f"{PROVIDER} checked the signature, deleted the consumers, and acknowledged with its "
        f"own key (scope directive_ack): HTTP {answer.status_code}"
    )
    say.say(call("drop", "directives", "--broker", BROKER_ID))


def late_match(
    say: Narrator,
    drop: Any,
    broker_system: BrokerSystem,
    workdir: Path,
    first_matches: list[str],
    first_rows: list[tuple[str, str]],
) -> None:
    """A consumer registered after cycle 1 matches one of its hashes: an amendment."""
    say.section("Ongoing duty: a consumer registered today matches a hash DROP sent")
    # DROP sent this hash; no consumer had it, so it was reported 5 (not found).
    unmatched_id, unmatched_hash = next(
        row for row in first_rows if row[1] not in _hashes(first_matches)
    )
    late_csv = workdir / "late.csv"
    with late_csv.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["remote_identifier", "hash_type", "hash"])
        writer.writerow([LATE_CONSUMER, "email", unmatched_hash])
    say.command("consumers import --broker 4821 --hashed late.csv")
    say.say(call("consumers", "import", "--broker", BROKER_ID, "--hashed", str(late_csv)))
    say.say(f"work item {unmatched_id} was reported 5 (not found); now it matches")
    deliver_and_answer(say, broker_system, ["deleted"])
    report(say, drop, upload=True, amendment=True)


def second_cycle(say: Narrator, drop: Any, broker_system: BrokerSystem, emails: list[str]) -> None:
    """Cycle 2, pulled from DROP's API today; part of it still with the broker."""
    from integrations.drop.calendar import drop_today
    from integrations.drop.notifications import notifications_url
    from integrations.models import LedgerEvent

    say.section("Cycle 2: DROP notifies that lists are ready; the pull starts at once")
    second_day = drop_today()
    second_matches = emails[100 : 100 + len(SECOND_OUTCOMES) + SECOND_SILENT]
    package, _ = drop_package(second_day, second_matches, unmatched=90, seed=50_000)
    drop.queue_pending(times=1, retry_after=1)  # the stand-in answers 202 first
    drop.queue_package(package)
    url = notifications_url(BROKER_ID)
    status = drop.notify(url, DROP_WEBHOOK_SECRET, "download.ready", "download ready")
    say.say(f"DROP POSTed a signed download.ready notification to {url}: HTTP {status}")
    run_jobs()  # the pull it queued, the same job as the periodic pull
    pulled = LedgerEvent.objects.filter(kind="drop.pulled", broker_id=BROKER_ID).latest("id")
    say.say(
        f"the pull it started (job integrations.tasks.pull_broker): {pulled.data['outcome']} "
        f"{pulled.data.get('zip_name', '')}, cycle {pulled.data.get('drop_session_id', '')}"
    )
    deliver_and_answer(say, broker_system, SECOND_OUTCOMES, leave_silent=SECOND_SILENT)


def recurring_round(say: Narrator, broker_system: BrokerSystem) -> None:
    """The continuing duty: the deleted and opted-out consumers' deletion asked again."""
    import json

    from integrations.models import WorkItem

    say.section("The continuing duty: a recurring deletion round")
    say.say("The law asks the broker to delete a deleted consumer's data again at least every 45")
    say.say("days (Civil Code 1798.99.86(d)): each deleted or opted-out consumer gets a new round")
    say.say("45 days after its last answer; the worker sends them on their day. Before a holiday,")
    say.say("staff send now the rounds due within 45 days:")
    held = dict(WorkItem.objects.values_list("work_item_id", "status_code"))
    say.command("drop recurring --broker 4821 --ahead 45 --json")
    sent = json.loads(call("drop", "recurring", "--broker", BROKER_ID, "--ahead", "45", "--json"))
    say.say(
        f"{sent['work_items']} round(s): {sent['deletion_requests']} deletion request(s), the "
        "same bodies with new request_uuid and webhook_request_id"
    )
    deliver_and_answer(say, broker_system, ["deleted"] * int(sent["deletion_requests"]))
    unchanged = held == dict(WorkItem.objects.values_list("work_item_id", "status_code"))
    say.say(
        "the answers are recorded and ledgered as recurring; the statuses DROP holds "
        + ("did not change" if unchanged else "CHANGED")
    )


def reappearance(
    say: Narrator, broker_system: BrokerSystem, workdir: Path, emails: list[str]
) -> None:
    """A supplier's file brings back a consumer cycle 1 deleted: a reappearance, with its
    source, so the broker knows which supplier sells deleted people again."""
    from integrations.models import DeletionRequest, Reappearance

    say.section("Suppression: a deleted consumer comes back in a supplier's file")
    # A consumer cycle 1 matched and the broker deleted (CRM-nnnnn is emails[nnnnn]).
    deleted = (
        DeletionRequest.objects.filter(
            broker__broker_id=BROKER_ID, round=0, late_match=False, drop_outcome="deleted"
        )
        .order_by("remote_identifier")
        .values_list("remote_identifier", flat=True)
        .first()
    )
    if deleted is None:
        raise SystemExit("no consumer of cycle 1 was deleted")
    with (workdir / SUPPLIER_FILE).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["remote_identifier", "email"])
        writer.writerow([RESOLD_CONSUMER, emails[int(deleted.removeprefix("CRM-"))]])
    say.say(f"The broker buys a data supplier's file: it holds {deleted}'s email again, as a")
    say.say(f"new record {RESOLD_CONSUMER}. DROP sent that hash in cycle 1 and it was deleted; it")
    say.say("matches again and is deleted again, and the match is recorded as a reappearance")
    say.say("with its source (the file and its SHA-256, or the API key that sent it): the broker")
    say.say("finds the supplier that sells deleted people again, and filters its files with")
    say.say("the suppression list (drop suppression export) or stops buying from it.")
    say.command(f"consumers import --broker 4821 {SUPPLIER_FILE}")
    say.say(call("consumers", "import", "--broker", BROKER_ID, str(workdir / SUPPLIER_FILE)))
    deliver_and_answer(say, broker_system, ["deleted"])
    seen = Reappearance.objects.get(broker__broker_id=BROKER_ID, remote_identifier=RESOLD_CONSUMER)
    say.say(
        f"reappearance recorded: {seen.remote_identifier} from {seen.source_label}"
        f" (SHA-256 {seen.source_sha256[:12]}…)"
    )
    say.command("drop reappearances --broker 4821")
    say.say(call("drop", "reappearances", "--broker", BROKER_ID))


def canary_round(say: Narrator, broker_system: BrokerSystem, workdir: Path) -> None:
    """The deletion system tested, observed: a canary's deletion to every target."""
    import json

    from django.utils import timezone

    from integrations.models import CanaryRound
    from integrations.selectors.canaries import canary_round_results

    say.section("Actioning tested: a canary round")
    say.say("The broker keeps a test consumer in its systems only for this; staff name it a")
    say.say("canary. Every cycle (and `drop canary` at once) sends it a deletion at every target")
    say.say('with drop_session_id "0": never reported to DROP, never in its figures.')
    canary_file = workdir / "canary.csv"
    canary_file.write_text(f"remote_identifier,email\n{CANARY},Canary.Test@Example.com\n")
    say.command(
        f"consumers import --broker 4821 canary.csv; consumers canary --broker 4821 {CANARY}"
    )
    call("consumers", "import", "--broker", BROKER_ID, str(canary_file))
    say.say(call("consumers", "canary", "--broker", BROKER_ID, CANARY))
    say.command("drop canary --broker 4821 --json")
    sent = json.loads(call("drop", "canary", "--broker", BROKER_ID, "--json"))
    # The broker's tooling deletes the test record, answers deleted, then creates it again.
    deliver_and_answer(say, broker_system, ["deleted"] * int(sent["deletion_requests"]))
    (result,) = canary_round_results(
        rounds=CanaryRound.objects.filter(pk=sent["canary_round"]), now=timezone.now()
    )
    for target, answers in result.by_target().items():
        say.say(
            f"canary round {sent['canary_round']} at {target}: "
            + ", ".join(f"{a.remote_identifier} {a.drop_outcome}" for a in answers)
        )
    say.say(f"the round {result.result}.")
    say.say("An auditor opens the evidence pack's actioning component: every round of the")
    say.say("period, per target, with the broker's signed answers; a round that failed or went")
    say.say("unanswered fails it. To test it live, they ask staff for `drop canary` and watch")
    say.say("the answer arrive on the dashboard (Canary rounds) and in the ledger.")


def ledger_summary(say: Narrator) -> None:
    from integrations.models import LedgerEvent
    from integrations.services.ledger import ledger_seal, ledger_verify

    say.section("The ledger: every step above, hash-chained")
    ledger_seal()
    say.command("ledger verify")
    verification = ledger_verify()
    kinds = Counter(LedgerEvent.objects.values_list("kind", flat=True))
    say.say(
        f"{sum(kinds.values())} events, chain {'verified' if verification.ok else 'BROKEN'};"
        f" most frequent: " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common(4))
    )


def chain_anchored(say: Narrator, tsa: Any) -> None:
    """The worker's daily anchoring: an RFC 3161 authority (the loopback one) timestamps
    the ledger's chain head."""
    from django.conf import settings

    from integrations.tasks import anchor_ledger

    say.section("The ledger's chain, anchored outside (RFC 3161)")
    settings.DROPPORTAL_TSA_URL = tsa.url
    say.say(f"DROPPORTAL_TSA_URL={tsa.url} (a loopback time-stamping authority, OpenSSL's own")
    say.say("`ts -reply` under a CA made for the demo). Daily, the worker has it sign the chain")
    say.say("hash at the head; the token is kept with its position, a ledger.anchored event.")
    position = anchor_ledger()
    say.say(f"the daily job (integrations.tasks.anchor_ledger): chain position {position} anchored")


def auditor_checks_the_pack(say: Narrator, tsa: Any) -> None:
    """The broker's evidence pack of the year, verified as an auditor does: offline, with
    the service's public key and the authority's certificate."""
    import subprocess

    from django.utils import timezone

    say.section("The auditor: an evidence pack, checked offline")
    say.command("ledger anchor")
    say.say(call("ledger", "anchor"))
    year = timezone.now().year
    with tempfile.TemporaryDirectory(prefix="dropportal-audit-") as tmp:
        audit = Path(tmp)
        pack, key, ca = audit / "evidence.zip", audit / "evidence.pem", audit / "tsa-ca.pem"
        say.command(
            f"evidence export --broker 4821 --since {year}-01-01 --until {year}-12-31 "
            "--sample 1 --seed demo --out evidence.zip"
        )
        period = ["--since", f"{year}-01-01", "--until", f"{year}-12-31"]
        sample = ["--sample", "1", "--seed", "demo"]
        say.say(
            call("evidence", "export", "--broker", BROKER_ID, *period, *sample, "--out", str(pack))
        )
        say.command("evidence public-key > evidence.pem")
        key.write_text(call("evidence", "public-key") + "\n")
        ca.write_bytes(tsa.ca_pem)
        say.say("The auditor takes the public key from the broker, the authority's CA")
        say.say("certificate (tsa-ca.pem) from the authority, and checks on a machine of their")
        say.say("own, with no database:")
        say.command("evidence verify evidence.zip --public-key evidence.pem --tsa-cert tsa-ca.pem")
        offline = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        verified = subprocess.run(  # noqa: S603 (our own verifier, on our own files)
            [sys.executable, "-m", "integrations.evidence.verify", str(pack),
             "--public-key", str(key), "--tsa-cert", str(ca)],
            cwd=ROOT, env=offline, capture_output=True, text=True,
        )  # fmt: skip
        say.say((verified.stdout + verified.stderr).strip())
        if verified.returncode != 0:
            raise SystemExit("the demo's evidence pack does not verify")
        with zipfile.ZipFile(pack) as archive:
            components = json.loads(archive.read("components.json"))["components"]
            stories = [name for name in archive.namelist() if name.startswith("sample/")]
    say.say("The pack is laid out by the audit's nine components; per component, its result")
    say.say("at export and what the auditor does with it:")
    for key, component in components.items():
        say.say(f"  {component['title']}: {component['result']}. {AUDITOR_DOES[key]}")
    failed = [key for key, component in components.items() if component["result"] != "pass"]
    if failed:
        raise SystemExit(f"components failed in the demo's pack: {', '.join(failed)}")
    say.say(f"The sampled story ({', '.join(stories)}) is one work item's whole history on one")
    say.say("page, drawn by the recorded seed: the auditor draws again with the same seed and")
    say.say("follows each step to its ledger event.")
    say.say("The signature says the service made the pack; the chain, that no event in its")
    say.say("range was edited, dropped or slipped in; each time-stamp token, that the chain had")
    say.say("reached that hash by the authority's time, so it was not rewritten since, even by")
    say.say("someone holding the database and the evidence key. No token proves the events")
    say.say("were true when written, nor anything after the last anchored position.")


# What an auditor does with each component of the pack (docs/audit.md says it at length).
AUDITOR_DOES = {
    "list_selection": "Compares each cycle's lists with the selection in DROP's portal.",
    "drop_access": "Checks the longest gap between downloads against the 45 days.",
    "standardization": "Runs DROP's official vectors through the same code and compares.",
    "hashing": "Hashes the vectors' inputs with a tool of their own and compares.",
    "matching": "Runs `audit rematch` on a cycle and looks up each difference's event.",
    "actioning": "Reads the canary rounds' answers per target and watches a round live.",
    "status_reporting": "Compares the files with what DROP's portal shows as received.",
    "suppression_list": "Sets the list's size per type against the reappearances.",
    "service_providers": "Asks a provider for a directive it acknowledged and checks it.",
}


def _hashes(emails: list[str]) -> set[str]:
    from integrations.drop.standardize import email_hash

    return {email_hash(e) for e in emails}


def deliver_and_answer(
    say: Narrator, broker_system: BrokerSystem, outcomes: list[str], *, leave_silent: int = 0
) -> None:
    run_jobs()
    dispatches = broker_system.new_dispatches()
    signed = sum(1 for d in dispatches if d.signature_ok)
    say.say(
        f"worker delivered {len(dispatches)} signed dispatch(es); the broker verified "
        f"{signed} of {len(dispatches)} signatures"
    )
    answers = outcomes + [""] * leave_silent
    if len(dispatches) != len(answers):
        raise SystemExit(f"expected {len(answers)} dispatches, the broker got {len(dispatches)}")
    statuses = Counter(
        broker_system.answer(dispatch, outcome)
        for dispatch, outcome in zip(dispatches, answers, strict=True)
        if outcome
    )
    # Each answer settled its work item's DROP status in its own transaction: no job to run.
    given = Counter(o for o in answers if o)
    say.say(
        "the broker called back: "
        + ", ".join(f"{n} {outcome}" for outcome, n in given.items())
        + f" -> HTTP {dict(statuses)}"
        + (f"; {leave_silent} still being processed" if leave_silent else "")
    )


def report(say: Narrator, drop: Any, *, upload: bool, amendment: bool = False) -> None:
    say.section("An amendment goes to DROP" if amendment else "Statuses are reported to DROP")
    say.command("drop report --broker 4821 --upload")
    before = set(drop.amended if amendment else drop.uploaded)
    say.say(call("drop", "report", "--broker", BROKER_ID, "--upload"))
    files = drop.amended if amendment else drop.uploaded
    for name in sorted(set(files) - before):
        rows = files[name].decode().strip().splitlines()
        say.say(f"DROP received {name}: {len(rows) - 1} row(s), {rows[0]!r} header")


def story_url(url: str) -> str:
    """The page telling the late-matched consumer's story, from DROP's download to DROP's
    answer to the amendment."""
    from integrations.models import DeletionRequest

    request = DeletionRequest.objects.get(remote_identifier=LATE_CONSUMER, round=0)
    return f"{url}/admin/integrations/workitem/{request.work_item_id}/change/"


def where_to_look(say: Narrator, url: str, password: str, story: str) -> None:
    say.section("Where to look")
    admin = f"{url}/admin"
    lines = [
        ("Log in", f"{admin}/  user {DEMO_USER}, password {password}"),
        ("Dashboard", f"{admin}/  (cycles, deadlines, what needs attention)"),
        ("Cycles", f"{admin}/integrations/dropcycle/"),
        ("Failed request", f"{admin}/integrations/deletionrequest/?state__exact=failed"),
        ("Report files", f"{admin}/integrations/reportfile/"),
        ("Ledger", f"{admin}/integrations/ledgerevent/"),
        ("Broker guide", f"{admin}/guide/"),
        # Last, so the demo ends on it: one consumer's whole story on one page.
        ("Story", f"{story}  ({LATE_CONSUMER}: matched late, amended, deleted again)"),
    ]
    for name, where in lines:
        say.say(f"{name:<15} {where}")


def take_screenshots(url: str, password: str, story: str, directory: Path) -> list[Path]:
    """The README's pictures from the demo's data, as staff see them at 1280 pixels, with
    Debian's chromium (never a downloaded browser): the dashboard, a consumer's story, the
    first cycle's page and the deletion requests."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    from integrations.models import DropCycle

    directory.mkdir(parents=True, exist_ok=True)
    first_cycle = DropCycle.objects.order_by("downloaded_at").values_list("pk", flat=True)[0]
    pages = {
        "dashboard.png": f"{url}/admin/",
        "story.png": story,
        "cycle.png": f"{url}/admin/integrations/dropcycle/{first_cycle}/change/",
        "requests.png": f"{url}/admin/integrations/deletionrequest/",
    }
    taken = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=chromium,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/admin/login/?next=/admin/")
        page.get_by_label("Username").fill(DEMO_USER)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{url}/admin/")
        for name, address in pages.items():
            page.goto(address)
            page.screenshot(path=str(directory / name))  # the first screen, as people see it
            taken.append(directory / name)
        browser.close()
    return taken


def serve_until_interrupted(url: str) -> None:
    # What the story built stays until the end: out of the collector's reach, the last
    # collection, at exit, no longer walks it (most of a second of every Ctrl-C).
    gc.freeze()

    def work() -> None:
        # One worker that waits for jobs, not one started every 2 s until the queue was
        # empty: each start opened a pool of connections and registered itself, four
        # database sessions and a few percent of a core every 2 s while nothing happened.
        while True:
            with contextlib.suppress(Exception):
                run_jobs(wait=True)
            time.sleep(2)  # it stopped on an error (the database gone): start it again

    threading.Thread(target=work, daemon=True, name="worker").start()
    print(f"Serving {url}/admin/ with a worker; Ctrl-C to stop.", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="web port (default 8000)")
    parser.add_argument("--no-serve", action="store_true", help="stop after the narration")
    parser.add_argument(
        "--screenshots", help="save the README's pictures in this folder (needs chromium)"
    )
    parser.add_argument(
        "--sso", action="store_true", help="staff sign in through a loopback identity provider"
    )
    parser.add_argument(
        "--template",
        help="copy this migrated database of the same server instead of migrating (the tests')",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    narrate(args)


if __name__ == "__main__":
    main()
