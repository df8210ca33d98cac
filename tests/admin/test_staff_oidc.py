"""Staff sign in through the company's identity provider: a real OpenID Connect provider on
loopback (devtools/oidc_provider.py, Authlib's server parts) signs RS256 ID tokens, and the
admin takes a person through it as a browser would (the provider's answers over real HTTP).

Roles come from the provider's groups at every sign-in; a refused sign-in is a page saying
why and a ledger event; an answer that fails any check (signature, audience, expiry, state,
nonce) signs nobody in; the provider's MFA (amr) stands for ours; signing out goes on to the
provider's end-session endpoint.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import time
from base64 import b32decode
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core import checks
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.http import urlencode
from django_otp.oath import TOTP

from devtools.oidc_provider import IdTokenTweak, OidcProvider
from dropportal.security import oidc_role_map_names_our_roles
from integrations.admin.oidc import RECENT_SIGN_IN, UNVERIFIED
from integrations.models import LedgerEvent, StaffOidcIdentity
from integrations.services.staff.staff_sign_in import (
    REFUSED_NO_ROLE,
    REFUSED_SUPERUSER,
    REFUSED_UNSTORABLE,
    REFUSED_USERNAME_TAKEN,
    idp_did_mfa,
)
from tests.staff_idp import CLIENT_ID, CLIENT_SECRET, ROLE_MAP, sign_in, staff_idp

pytestmark = pytest.mark.django_db

INDEX = "/admin/"


@pytest.fixture
def idp(settings: Any) -> Iterator[OidcProvider]:
    with staff_idp(settings) as provider:
        yield provider


def events(kind: str) -> list[LedgerEvent]:
    return list(LedgerEvent.objects.filter(kind=kind).order_by("id"))


def test_the_authorization_request_uses_pkce_a_state_and_a_nonce(
    idp: OidcProvider, client: Client
) -> None:
    start = client.get(reverse("admin:oidc_sign_in"))
    asked = parse_qs(urlsplit(start["Location"]).query)
    assert asked["response_type"] == ["code"]
    assert asked["client_id"] == [CLIENT_ID]
    assert asked["code_challenge_method"] == ["S256"] and asked["code_challenge"][0]
    assert asked["state"][0] and asked["nonce"][0]
    assert asked["redirect_uri"] == [f"{settings.DROPPORTAL_PUBLIC_URL}/admin/oidc/callback/"]
    assert "openid" in asked["scope"][0].split()


def test_a_first_sign_in_opens_an_account_with_the_mapped_roles_only(
    idp: OidcProvider, client: Client
) -> None:
    done = sign_in(client, idp, "ada")
    assert done.status_code == 302 and done["Location"] == INDEX
    assert client.get(INDEX).status_code == 200
    ada = User.objects.get(oidc_identity__subject=idp.person("ada").subject)
    assert ada.username == "ada" and ada.email == "ada@example.com"
    assert ada.is_staff and not ada.is_superuser and not ada.has_usable_password()
    assert sorted(ada.groups.values_list("name", flat=True)) == ["Operators"]
    assert ada.oidc_identity.issuer == idp.issuer

    (added,) = events("staff_user.added")  # the account is the ledger's from its start
    assert (added.subject, added.actor) == ("ada", "oidc:ada")
    (changed,) = events("staff_user.roles_changed")
    assert (changed.subject, changed.data) == ("ada", {"before": [], "after": ["Operators"]})
    (signed_in,) = events("staff_user.signed_in")
    assert signed_in.subject == "ada"
    assert signed_in.data["method"] == "oidc"
    assert signed_in.data["roles"] == ["Operators"]
    assert signed_in.data["mfa_by_identity_provider"] is True
    every_event = " ".join(str(e.data) for e in LedgerEvent.objects.all())
    assert CLIENT_SECRET not in every_event
    assert client.session["dropportal_oidc"]["id_token"] not in every_event


def test_a_group_removed_at_the_provider_is_a_role_lost_at_the_next_sign_in(
    idp: OidcProvider, client: Client
) -> None:
    idp.person("ada").groups = ["privacy-ops", "privacy-auditors"]
    sign_in(client, idp, "ada")
    ada = User.objects.get(username="ada")
    assert sorted(ada.groups.values_list("name", flat=True)) == ["Auditors", "Operators"]

    idp.person("ada").groups = ["privacy-auditors"]
    again = sign_in(Client(), idp, "ada")
    assert again.status_code == 302
    assert list(ada.groups.values_list("name", flat=True)) == ["Auditors"]
    last = events("staff_user.roles_changed")[-1]
    assert last.data == {"before": ["Auditors", "Operators"], "after": ["Auditors"]}

    idp.person("ada").groups = ["everyone"]
    refused = sign_in(Client(), idp, "ada")
    assert refused.status_code == 403
    assert not ada.groups.exists(), "every role gone with the last group"
    assert events("staff_user.roles_changed")[-1].data["after"] == []


def test_someone_without_a_mapped_group_is_refused_with_a_page_saying_why(
    idp: OidcProvider, client: Client
) -> None:
    refused = sign_in(client, idp, "bob")
    assert refused.status_code == 403
    assert escape(REFUSED_NO_ROLE) in refused.content.decode()
    assert not User.objects.filter(username="bob").exists(), "no account for nobody"
    assert client.get(INDEX).status_code == 302
    (event,) = events("staff_user.sign_in_refused")
    assert event.subject == "bob"
    assert event.data["reason"] == REFUSED_NO_ROLE
    assert event.data["claimed_groups"] == ["everyone"]


def test_people_are_matched_by_their_subject_not_their_email_or_name(
    idp: OidcProvider, client: Client
) -> None:
    # A password account that happens to carry the same name and email stays someone else's.
    own = User.objects.create_user("ada", "ada@example.com", "pw-ada-own-123", is_staff=True)
    own.groups.add(Group.objects.get(name="Auditors"))
    sign_in(client, idp, "ada")
    signed_in = User.objects.get(oidc_identity__subject=idp.person("ada").subject)
    assert signed_in.pk != own.pk and signed_in.username.startswith("ada+")
    assert list(own.groups.values_list("name", flat=True)) == ["Auditors"]
    assert not StaffOidcIdentity.objects.filter(user=own).exists()


@pytest.mark.parametrize(
    ("claim", "odd"),
    [("username", "ada\x00"), ("email", "ada\x00@example.com"), ("subject", "s" * 256)],
)
def test_a_claim_that_cannot_be_stored_is_a_recorded_refusal_not_an_error(
    idp: OidcProvider, client: Client, claim: str, odd: str
) -> None:
    # PostgreSQL stores no NUL, and the identity's sub no more than 255 characters: a
    # verified answer holding either was a 500.
    ada = idp.person("ada")
    setattr(ada, claim, odd)
    refused = sign_in(client, idp, "ada")
    assert refused.status_code == 403
    assert escape(REFUSED_UNSTORABLE) in refused.content.decode()
    assert not User.objects.exists()
    (event,) = events("staff_user.sign_in_refused")
    assert event.data["reason"] == REFUSED_UNSTORABLE
    assert event.data["oidc_subject"] == ada.subject
    assert "\x00" not in str(event.data) + event.subject + event.actor


def test_a_group_holding_a_nul_maps_to_no_role_and_its_refusal_is_recorded(
    idp: OidcProvider, client: Client
) -> None:
    # Recording the groups of a refusal was a 500 when one held a NUL.
    idp.person("bob").groups = ["odd\x00group"]
    refused = sign_in(client, idp, "bob")
    assert refused.status_code == 403
    assert escape(REFUSED_NO_ROLE) in refused.content.decode()
    (event,) = events("staff_user.sign_in_refused")
    assert event.data["claimed_groups"] == ["odd\ufffdgroup"]

    idp.person("ada").groups = ["privacy-ops", "odd\x00group"]
    assert sign_in(Client(), idp, "ada").status_code == 302, "the mapped one still counts"


def _both_of_adas_names_taken(idp: OidcProvider) -> str:
    """Accounts of others named "ada" and "ada+<her variant>"; her subject."""
    subject = idp.person("ada").subject
    User.objects.create_user("ada", password="pw-ada-own-123")
    User.objects.create_user(f"ada+{hashlib.sha256(subject.encode()).hexdigest()[:8]}")
    return subject


def test_a_username_taken_in_its_variant_too_is_a_recorded_refusal_not_an_error(
    idp: OidcProvider, client: Client
) -> None:
    # Another account holds "ada", and another "ada+<its variant>" (the provider's
    # preferred_username is whatever its people chose): the account's save was a 500.
    subject = _both_of_adas_names_taken(idp)

    refused = sign_in(client, idp, "ada")

    assert refused.status_code == 403
    assert escape(REFUSED_USERNAME_TAKEN) in refused.content.decode()
    assert not StaffOidcIdentity.objects.exists()
    event = events("staff_user.sign_in_refused")[-1]
    assert (event.subject, event.data["reason"]) == ("ada", REFUSED_USERNAME_TAKEN)
    assert event.data["oidc_subject"] == subject


def test_no_mapped_group_is_the_reason_given_even_when_the_name_is_taken(
    idp: OidcProvider, client: Client
) -> None:
    # Staff diagnose refusals by their reason: someone who may not sign in at all is told so.
    _both_of_adas_names_taken(idp)
    idp.person("ada").groups = ["everyone"]

    assert sign_in(client, idp, "ada").status_code == 403

    assert events("staff_user.sign_in_refused")[-1].data["reason"] == REFUSED_NO_ROLE


def test_nobody_becomes_a_superuser_and_a_superuser_is_refused(
    idp: OidcProvider, client: Client
) -> None:
    sign_in(client, idp, "ada")
    ada = User.objects.get(username="ada")
    ada.is_superuser = True  # made a superuser in the admin afterwards
    ada.save()
    refused = sign_in(Client(), idp, "ada")
    assert refused.status_code == 403
    assert escape(REFUSED_SUPERUSER) in refused.content.decode()
    assert events("staff_user.sign_in_refused")[-1].data["reason"] == REFUSED_SUPERUSER


@pytest.mark.parametrize(
    ("tweak", "error"),
    [
        pytest.param(IdTokenTweak(foreign_key=True), "bad_signature", id="bad-signature"),
        # For another client, with an azp naming us: Authlib alone would let that through.
        pytest.param(IdTokenTweak(audience="another-app"), "invalid_claim", id="wrong-audience"),
        pytest.param(IdTokenTweak(expired_seconds_ago=600), "expired_token", id="expired"),
        pytest.param(IdTokenTweak(replay_previous=True), "invalid_claim", id="replayed-nonce"),
    ],
)
def test_an_id_token_that_fails_a_check_signs_nobody_in(
    idp: OidcProvider, client: Client, tweak: IdTokenTweak, error: str
) -> None:
    # The same person signs in once as the control; the next answer goes wrong.
    assert sign_in(Client(), idp, "ada").status_code == 302
    idp.next_id_token = tweak
    refused = sign_in(client, idp, "ada")
    assert refused.status_code == 403
    assert escape(UNVERIFIED) in refused.content.decode()
    assert client.get(INDEX).status_code == 302
    (event,) = events("staff_user.sign_in_refused")
    assert event.data["reason"] == "the answer failed verification"
    assert event.data["error"] == error


@pytest.mark.parametrize(
    ("answered", "kept"),
    [
        pytest.param("invalid_client", "invalid_client", id="an-error-code"),
        # A provider may quote the secret it was sent: the ledger keeps what it is given.
        pytest.param(
            f"invalid_client: client_secret {CLIENT_SECRET} does not match",
            "OAuthError",
            id="free-text",
        ),
        pytest.param("x" * 65, "OAuthError", id="too-long"),
    ],
)
def test_a_token_endpoints_error_is_recorded_only_as_an_error_code(
    idp: OidcProvider, client: Client, answered: str, kept: str
) -> None:
    idp.next_token_error = (401, {"error": answered, "error_description": CLIENT_SECRET})

    refused = sign_in(client, idp, "ada")

    assert refused.status_code == 403
    assert CLIENT_SECRET not in refused.content.decode()
    (event,) = events("staff_user.sign_in_refused")
    assert event.data["reason"] == "the answer failed verification"
    assert event.data["error"] == kept
    assert CLIENT_SECRET not in json.dumps(event.data)


def test_an_issuer_ending_with_a_slash_signs_people_in(idp: OidcProvider, client: Client) -> None:
    # Auth0's issuers end with "/": the setting keeps none (its value is read without it),
    # the ID token's iss has it, as the discovery document's issuer does.
    idp.issued_as = f"{idp.issuer}/"
    assert idp.issuer == settings.DROPPORTAL_OIDC_ISSUER
    done = sign_in(client, idp, "ada")
    assert done.status_code == 302, "refused: the answer failed verification"
    assert done["Location"] == INDEX
    assert client.get(INDEX).status_code == 200
    assert User.objects.get(username="ada").oidc_identity.issuer == idp.issuer
    assert events("staff_user.sign_in_refused") == []


def test_a_replayed_callback_is_refused(idp: OidcProvider, client: Client) -> None:
    idp.signed_in = "ada"
    start = client.get(reverse("admin:oidc_sign_in"))
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(at_provider.headers["Location"])
    callback = f"{back.path}?{back.query}"
    assert client.get(callback).status_code == 302  # signed in; the state is spent
    client.logout()
    again = client.get(callback)
    assert again.status_code == 403, "the same state again"
    assert escape(UNVERIFIED) in again.content.decode()
    assert Client().get(callback).status_code == 403, "a state this session never made"
    # Nobody's sign-in was refused: anyone may send these, so they are not recorded.
    assert events("staff_user.sign_in_refused") == []


def _state_of(started: Any) -> str:
    return parse_qs(urlsplit(started["Location"]).query)["state"][0]


def test_a_sign_in_cancelled_at_the_provider_is_a_page_and_an_event(
    idp: OidcProvider, client: Client
) -> None:
    state = _state_of(client.get(reverse("admin:oidc_sign_in")))
    callback = reverse("admin:oidc_callback")
    refused = client.get(callback, {"error": "access_denied", "state": state})
    assert refused.status_code == 403
    assert "The identity provider did not sign you in (access_denied)" in refused.content.decode()
    (event,) = events("staff_user.sign_in_refused")
    assert event.data["error"] == "access_denied"
    # Its state is spent: the same answer again is a page and nothing more.
    assert client.get(callback, {"error": "access_denied", "state": state}).status_code == 403
    assert len(events("staff_user.sign_in_refused")) == 1


def test_an_error_answering_no_sign_in_of_this_session_is_not_recorded(
    idp: OidcProvider, client: Client
) -> None:
    # The same answer as above, but to a sign-in another session started (or to none):
    # anyone on the internet can send it, and it must not grow the append-only ledger.
    state = _state_of(Client().get(reverse("admin:oidc_sign_in")))
    client.get(reverse("admin:oidc_sign_in"))  # this session's own sign-in, another state
    callback = reverse("admin:oidc_callback")
    for asked in ({"error": "access_denied", "state": state}, {"error": "x" * 50}):
        refused = client.get(callback, asked)
        assert refused.status_code == 403
        assert "The identity provider did not sign you in" in refused.content.decode()
    assert Client().get(callback, {"error": "access_denied"}).status_code == 403
    assert LedgerEvent.objects.count() == 0
    # Nor is a link's own text shown on our page.
    told = client.get(callback, {"error": "Your account is locked: call 555-0100"})
    assert "555-0100" not in told.content.decode()


def test_an_error_holding_a_nul_is_kept_as_text_the_ledger_can_store(
    idp: OidcProvider, client: Client
) -> None:
    state = _state_of(client.get(reverse("admin:oidc_sign_in")))
    refused = client.get(reverse("admin:oidc_callback"), {"error": "denied\x00", "state": state})
    assert refused.status_code == 403
    (event,) = events("staff_user.sign_in_refused")
    assert event.data["error"] == "denied\ufffd"


def test_an_address_whose_refusals_spent_the_limit_starts_no_sign_in_and_records_nothing(
    idp: OidcProvider, settings: Any
) -> None:
    # Starting a sign-in needs no account, and each start can end in a recorded refusal.
    settings.DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT = 2  # refusals a minute, bursts of 2
    address = "203.0.113.7"
    flood = Client(REMOTE_ADDR=address)
    start, callback = reverse("admin:oidc_sign_in"), reverse("admin:oidc_callback")
    # Starts alone spend nothing: a page making browsers start sign-ins shuts no one out.
    for _ in range(5):
        assert flood.get(start).status_code == 302
    assert sign_in(flood, idp, "ada")["Location"] == INDEX
    for _ in range(2):
        state = _state_of(flood.get(start))
        assert flood.get(callback, {"error": "access_denied", "state": state}).status_code == 403

    over = Client(REMOTE_ADDR=address).get(start)

    assert over.status_code == 429
    assert "Location" not in over, "not sent to the provider: no sign-in to answer"
    assert settings.SESSION_COOKIE_NAME not in over.cookies, "no session made for it"
    assert int(over["Retry-After"]) >= 1
    assert "Too many sign-ins from your address were refused" in over.content.decode()
    assert len(events("staff_user.sign_in_refused")) == 2
    assert sign_in(Client(REMOTE_ADDR="198.51.100.9"), idp, "ada").status_code == 302, (
        "another address is not held back"
    )


def test_sign_ins_started_before_the_limit_was_spent_record_no_more_refusals(
    idp: OidcProvider, settings: Any
) -> None:
    # Starting spends nothing: one session may hold many states, and each answered later
    # was a ledgered refusal and a call to the provider's token endpoint, past the limit.
    settings.DROPPORTAL_OIDC_SIGN_IN_RATE_LIMIT = 2
    flood = Client(REMOTE_ADDR="203.0.113.8")
    states = [_state_of(flood.get(reverse("admin:oidc_sign_in"))) for _ in range(5)]
    callback = reverse("admin:oidc_callback")

    answers = [flood.get(callback, {"error": "x", "state": state}) for state in states]

    assert [a.status_code for a in answers] == [403, 403, 429, 429, 429]
    assert len(events("staff_user.sign_in_refused")) == 2
    # A code is not sent to the provider either, and the state is spent.
    assert flood.get(callback, {"code": "junk", "state": states[2]}).status_code == 403


def test_the_login_page_offers_the_provider_beside_the_password(
    idp: OidcProvider, client: Client
) -> None:
    page = client.get(reverse("admin:login"), {"next": "/admin/integrations/"}).content.decode()
    assert "Sign in with Loopback IdP" in page
    assert 'name="password"' in page
    assert "/admin/oidc/sign-in/?next=%2Fadmin%2Fintegrations%2F" in page


def test_oidc_only_refuses_passwords_on_the_server_too(
    idp: OidcProvider, client: Client, settings: Any
) -> None:
    settings.DROPPORTAL_OIDC_ONLY = True
    User.objects.create_superuser("root", "root@example.com", "pw-root-123-long")
    page = client.get(reverse("admin:login")).content.decode()
    assert "Sign in with Loopback IdP" in page and 'name="password"' not in page
    tried = client.post(
        reverse("admin:login"), {"username": "root", "password": "pw-root-123-long"}
    )
    assert tried.status_code == 403
    assert "Password sign-in is off here: sign in with Loopback IdP." in tried.content.decode()
    assert client.get(INDEX).status_code == 302, "not signed in"
    # Anyone can post a password (and any username): that grows no ledger.
    assert LedgerEvent.objects.count() == 0


def test_a_password_sign_in_is_in_the_ledger(client: Client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw-root-123-long")
    client.post(reverse("admin:login"), {"username": "root", "password": "pw-root-123-long"})
    (event,) = events("staff_user.signed_in")
    assert (event.subject, event.data) == ("root", {"method": "password"})


@pytest.mark.staff_mfa
def test_the_providers_mfa_stands_for_ours(idp: OidcProvider, client: Client) -> None:
    assert settings.DROPPORTAL_STAFF_MFA_REQUIRED
    done = sign_in(client, idp, "ada")  # amr: pwd, mfa
    assert done["Location"] == INDEX
    assert client.get(INDEX).status_code == 200


@pytest.mark.staff_mfa
def test_without_the_providers_mfa_ours_is_asked(idp: OidcProvider, client: Client) -> None:
    idp.person("ada").amr = ["pwd"]
    done = sign_in(client, idp, "ada")
    assert urlsplit(done["Location"]).path == reverse("admin:mfa_verify")
    assert client.get(INDEX).status_code == 302
    enrol = client.get(done["Location"])
    assert urlsplit(enrol["Location"]).path == reverse("admin:mfa_enrol")
    page = client.get(enrol["Location"]).content.decode()
    assert 'name="otp_token"' in page
    assert 'name="password"' not in page, "an account of the provider has no password to ask"
    assert events("staff_user.signed_in") == [], "not signed in before our second factor"
    code = f"{TOTP(b32decode(_enrol_page_secret(client))).token():06d}"
    client.post(reverse("admin:mfa_enrol"), {"otp_token": code})
    assert client.get(INDEX).status_code == 200
    (signed_in,) = events("staff_user.signed_in")
    assert (signed_in.subject, signed_in.actor) == ("ada", "oidc:ada")
    assert signed_in.data["method"] == "oidc" and signed_in.data["amr"] == ["pwd"]
    assert signed_in.data["mfa_by_identity_provider"] is False
    assert signed_in.data["second_factor"] == "app"


def _enrol_page_secret(client: Client) -> str:
    page = client.get(reverse("admin:mfa_enrol")).content.decode()
    secret = re.search(r'id="dp-mfa-secret">([A-Z2-7]+)<', page)
    assert secret, "the enrolment page shows a secret"
    return secret.group(1)


def _enrolled_at_provider(client: Client, idp: OidcProvider) -> None:
    """ada signs in at the provider, which does no MFA, and enrols ours without a password."""
    idp.person("ada").amr = ["pwd"]
    sign_in(client, idp, "ada")
    page = client.get(reverse("admin:mfa_enrol"))
    code = f"{TOTP(b32decode(page.context['secret'])).token():06d}"
    assert client.post(reverse("admin:mfa_enrol"), {"otp_token": code}).status_code == 200
    assert client.get(INDEX).status_code == 200


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.staff_mfa
def test_signing_in_at_the_provider_again_from_a_session_past_our_factor_is_recorded(
    idp: OidcProvider, client: Client
) -> None:
    _enrolled_at_provider(client, idp)
    again = sign_in(client, idp, "ada")
    assert urlsplit(again["Location"]).path == reverse("admin:mfa_verify")
    assert client.get(again["Location"])["Location"] == INDEX, "passed already"
    first, second = (e.data for e in events("staff_user.signed_in"))
    assert first["second_factor"] == "app"
    assert second["method"] == "oidc" and "second_factor" not in second


def _sign_in_older_than_recent(client: Client) -> None:
    session = client.session
    signed_in = session["dropportal_oidc"]
    signed_in["signed_in_at"] -= RECENT_SIGN_IN.total_seconds() + 60
    session["dropportal_oidc"] = signed_in
    session.save()


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.staff_mfa
def test_an_account_of_the_provider_makes_new_recovery_codes_without_a_password(
    idp: OidcProvider, client: Client
) -> None:
    _enrolled_at_provider(client, idp)
    url = reverse("admin:mfa_recovery_codes")
    page = client.get(url).content.decode()
    assert 'name="password"' not in page, "an account of the provider has no password to ask"
    renewed = client.post(url, {})
    codes = re.findall(r"<li><code>([a-z2-7]+)</code></li>", renewed.content.decode())
    assert len(codes) == 10
    (event,) = events("staff_user.mfa_recovery_codes_renewed")
    assert (event.subject, event.actor) == ("ada", "staff:ada")
    assert not AccessAttempt.objects.exists(), "no failed login counted"


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.staff_mfa
def test_an_older_sign_in_at_the_provider_is_sent_there_again_for_new_codes(
    idp: OidcProvider, client: Client
) -> None:
    # A stolen session cookie cannot sign in at the provider again: only a recent sign-in
    # stands for the password the account does not have.
    _enrolled_at_provider(client, idp)
    _sign_in_older_than_recent(client)
    url = reverse("admin:mfa_recovery_codes")
    refused = client.post(url, {"password": "anything"}).content.decode()
    assert "Sign in again at Loopback IdP first" in refused
    again = f"{reverse('admin:oidc_sign_in')}?{urlencode({'next': url, 'reauthenticate': '1'})}"
    assert escape(again) in refused
    assert events("staff_user.mfa_recovery_codes_renewed") == []
    assert not AccessAttempt.objects.exists(), "not a wrong password: nothing counted"

    back = sign_in(client, idp, "ada", next_url=url)
    assert client.get(back["Location"])["Location"] == url, "no second code asked"
    assert len(re.findall(r"<li><code>", client.post(url, {}).content.decode())) == 10
    assert len(events("staff_user.mfa_recovery_codes_renewed")) == 1


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.staff_mfa
def test_a_sign_in_the_provider_grants_from_its_own_older_session_stands_for_no_password(
    idp: OidcProvider, client: Client
) -> None:
    # A browser left open: the provider signs the person in from its own session, asking
    # nothing, so the sign-in here is new yet nobody gave a credential. Its ID token's
    # auth_time says so, and a password asked again wants the credentials given again.
    _enrolled_at_provider(client, idp)
    idp.person("ada").authenticated_at = time.time() - 2 * 3600
    sign_in(client, idp, "ada")
    url = reverse("admin:mfa_recovery_codes")
    refused = client.post(url, {}).content.decode()
    assert "Sign in again at Loopback IdP first" in refused
    assert events("staff_user.mfa_recovery_codes_renewed") == []

    again = f"{reverse('admin:oidc_sign_in')}?{urlencode({'next': url, 'reauthenticate': '1'})}"
    assert escape(again) in refused
    start = client.get(again)
    asked = parse_qs(urlsplit(start["Location"]).query)
    assert (asked["prompt"], asked["max_age"]) == (["login"], ["0"])
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(at_provider.headers["Location"])
    done = client.get(f"{back.path}?{back.query}")
    assert client.get(done["Location"])["Location"] == url, "no second code asked"
    assert len(re.findall(r"<li><code>", client.post(url, {}).content.decode())) == 10
    assert len(events("staff_user.mfa_recovery_codes_renewed")) == 1


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.staff_mfa
def test_without_auth_time_only_a_sign_in_that_asked_for_the_credentials_stands_for_them(
    idp: OidcProvider, client: Client
) -> None:
    # A provider whose ID tokens do not say when it authenticated the person: a sign-in is
    # not known to be recent, unless it asked the provider to ask for the credentials.
    idp.omits_auth_time = True
    idp.person("ada").amr = ["pwd"]
    idp.person("ada").authenticated_at = time.time() - 2 * 3600
    sign_in(client, idp, "ada")
    url = reverse("admin:mfa_enrol")
    page = client.get(url)
    again = f"{reverse('admin:oidc_sign_in')}?{urlencode({'next': url, 'reauthenticate': '1'})}"
    assert escape(again) in page.content.decode()
    code = f"{TOTP(b32decode(page.context['secret'])).token():06d}"
    assert "Sign in again at" in client.post(url, {"otp_token": code}).content.decode()
    assert events("staff_user.mfa_enrolled") == []

    start = client.get(again)
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(at_provider.headers["Location"])
    client.get(f"{back.path}?{back.query}")
    page = client.get(url)
    code = f"{TOTP(b32decode(page.context['secret'])).token():06d}"
    assert client.post(url, {"otp_token": code}).status_code == 200
    assert len(events("staff_user.mfa_enrolled")) == 1
    assert client.get(INDEX).status_code == 200


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.staff_mfa
def test_a_sign_in_that_asked_for_nothing_does_not_take_a_later_ones_asking(
    idp: OidcProvider, client: Client
) -> None:
    # A browser left open: one sign-in (S1) asks nothing and its answer is held back; a
    # second (S2) asks for the credentials and is abandoned; S1's answer, its state still
    # pending, comes back. S2's asking must not count for it.
    idp.omits_auth_time = True
    idp.person("ada").amr = ["pwd"]
    idp.person("ada").authenticated_at = time.time() - 2 * 3600
    idp.signed_in = "ada"
    url = reverse("admin:mfa_enrol")
    s1 = client.get(reverse("admin:oidc_sign_in"), {"next": url})
    at_provider = requests.get(s1["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(at_provider.headers["Location"])
    s2 = client.get(reverse("admin:oidc_sign_in"), {"next": url, "reauthenticate": "1"})
    assert parse_qs(urlsplit(s2["Location"]).query)["prompt"] == ["login"]

    replayed = client.get(f"{back.path}?{back.query}")
    assert urlsplit(replayed["Location"]).path == reverse("admin:mfa_verify"), "signed in"
    assert client.session["dropportal_oidc"]["signed_in_at"] is None
    page = client.get(url)
    code = f"{TOTP(b32decode(page.context['secret'])).token():06d}"
    assert "Sign in again at" in client.post(url, {"otp_token": code}).content.decode()
    assert events("staff_user.mfa_enrolled") == []


@pytest.mark.usefixtures("templates_recorded")  # reads response.context
@pytest.mark.staff_mfa
def test_an_older_sign_in_at_the_provider_enrols_only_after_signing_in_there_again(
    idp: OidcProvider, client: Client
) -> None:
    idp.person("ada").amr = ["pwd"]
    sign_in(client, idp, "ada")
    _sign_in_older_than_recent(client)
    url = reverse("admin:mfa_enrol")
    page = client.get(url)
    assert escape(reverse("admin:oidc_sign_in")) in page.content.decode()
    code = f"{TOTP(b32decode(page.context['secret'])).token():06d}"
    refused = client.post(url, {"otp_token": code}).content.decode()
    assert "Sign in again at Loopback IdP first" in refused
    assert events("staff_user.mfa_enrolled") == []
    assert not AccessAttempt.objects.exists()


def test_an_account_of_the_provider_has_no_password_to_change(
    idp: OidcProvider, client: Client
) -> None:
    sign_in(client, idp, "ada")
    new = "a-new-pw-for-ada-77"
    refused = client.post(
        reverse("admin:password_change"),
        {"old_password": "a-guess", "new_password1": new, "new_password2": new},
    )
    assert "no password here" in refused.content.decode()
    assert not User.objects.get(username="ada").has_usable_password()
    assert not AccessAttempt.objects.exists(), "nothing to guess: not counted"
    assert events("staff_user.password_changed") == []


@pytest.mark.parametrize(
    ("amr", "did"),
    [
        (["mfa"], True),
        (["pwd", "mfa"], True),
        (["pwd", "otp"], True),
        (["hwk", "fpt"], True),
        (["pwd"], False),
        (["otp"], False),
        (["pwd", "kba"], False),
        ([], False),
    ],
)
def test_what_amr_counts_as_mfa(amr: list[str], did: bool) -> None:
    assert idp_did_mfa(amr) is did


def test_signing_out_ends_the_session_at_the_provider_too(
    idp: OidcProvider, client: Client
) -> None:
    sign_in(client, idp, "ada")
    id_token = client.session["dropportal_oidc"]["id_token"]
    out = client.post(reverse("admin:logout"))
    assert out.status_code == 302
    assert out["Location"].startswith(f"{idp.issuer}/end_session?")
    asked = parse_qs(urlsplit(out["Location"]).query)
    assert asked["id_token_hint"] == [id_token]
    post_logout = f"{settings.DROPPORTAL_PUBLIC_URL}/admin/login/"
    assert asked["post_logout_redirect_uri"] == [post_logout]
    assert client.get(INDEX).status_code == 302, "signed out here"
    at_provider = requests.get(out["Location"], allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302
    back = urlsplit(at_provider.headers["Location"])
    assert f"{back.scheme}://{back.netloc}{back.path}" == post_logout
    assert [s["sub"] for s in idp.ended_sessions] == [idp.person("ada").subject]


def test_an_oidc_session_ends_session_hours_after_its_sign_in(
    idp: OidcProvider, client: Client, settings: Any
) -> None:
    settings.DROPPORTAL_SESSION_HOURS = 3
    sign_in(client, idp, "ada")
    ends = client.session.get_expiry_date()
    expected = timezone.now() + dt.timedelta(hours=3)
    assert abs((ends - expected).total_seconds()) < 60
    client.get(INDEX)  # activity does not push it back
    assert client.session.get_expiry_date() == ends


def test_a_deactivated_person_is_refused_at_the_provider_sign_in(
    idp: OidcProvider, client: Client
) -> None:
    sign_in(Client(), idp, "ada")
    User.objects.filter(username="ada").update(is_active=False)
    refused = sign_in(client, idp, "ada")
    assert refused.status_code == 403
    assert "deactivated" in refused.content.decode()


def test_an_account_whose_staff_status_was_taken_away_stays_out(
    idp: OidcProvider, client: Client
) -> None:
    sign_in(Client(), idp, "ada")
    User.objects.filter(username="ada").update(is_staff=False)
    refused = sign_in(client, idp, "ada")
    assert refused.status_code == 403
    assert "no staff status" in refused.content.decode()
    assert User.objects.get(username="ada").is_staff is False


def test_a_plain_http_issuer_off_loopback_stops_start_up(settings: Any) -> None:
    settings.DROPPORTAL_OIDC_ROLE_MAP = ROLE_MAP
    settings.DROPPORTAL_OIDC_ISSUER = "http://idp.example.com"
    (error,) = oidc_role_map_names_our_roles()
    assert error.id == "dropportal.E004"
    settings.DROPPORTAL_OIDC_ISSUER = "https://idp.example.com"
    assert oidc_role_map_names_our_roles() == []


def test_the_role_map_is_checked_against_our_roles(settings: Any) -> None:
    settings.DROPPORTAL_OIDC_ROLE_MAP = {"privacy-ops": "Operators", "x": "Auditorz"}
    (error,) = oidc_role_map_names_our_roles()
    assert isinstance(error, checks.Error) and error.id == "dropportal.E002"
    assert "'Auditorz'" in error.msg
    settings.DROPPORTAL_OIDC_ROLE_MAP = ROLE_MAP
    assert oidc_role_map_names_our_roles() == []
    settings.DROPPORTAL_OIDC_ISSUER = "https://idp.example.com"
    settings.DROPPORTAL_OIDC_ROLE_MAP = {}
    (error,) = oidc_role_map_names_our_roles()
    assert error.id == "dropportal.E003"
