"""Outbound HTTP against the loopback broker simulator, and the SSRF refusals.

Refusal tests forbid ``connect()`` altogether, so a refusal that came too late fails the test
instead of reaching an address outside this machine.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from requests_hardened.ip_filter_adapter import IPFilterAdapter

from devtools.broker_simulator import BrokerSimulator, Reply
from devtools.trickle_server import TrickleServer
from integrations import outbound_http
from integrations.dispatch import signing
from integrations.dispatch.policy import classify
from integrations.outbound_http import (
    RESPONSE_BODY_LIMIT,
    DeliveryResult,
    build_session,
    deliver,
    ip_refusal_reason,
    tls_context,
)

SECRET = signing.generate_webhook_secret()
PAYLOAD = {"topic": "drop.deletion:create", "request_uuid": "3f2c8a8e-6a4b-4c1e-9a57-0c5d2f1e9b10"}


@pytest.fixture
def simulator() -> Iterator[BrokerSimulator]:
    with BrokerSimulator(SECRET) as running:
        yield running


@pytest.fixture
def no_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(sock: socket.socket, address: Any) -> None:
        raise AssertionError(f"a connection to {address} was attempted")

    monkeypatch.setattr(socket.socket, "connect", forbidden)
    monkeypatch.setattr(socket.socket, "connect_ex", forbidden)


def _post(url: str, *, allow_private: bool = True, **kwargs: Any) -> DeliveryResult:
    body = json.dumps(PAYLOAD).encode()
    headers = {"Content-Type": "application/json", **signing.signed_headers(SECRET, body)}
    return deliver("POST", url, body=body, headers=headers, allow_private=allow_private, **kwargs)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- against the simulator (allow_private=True) ---------------------------------------------


def test_2xx_is_delivered_signed_and_recorded(simulator: BrokerSimulator) -> None:
    simulator.script(Reply(status=202, body=b'{"ok":true}'))

    result = _post(simulator.url)

    assert (result.status, result.error) == (202, None)
    assert result.response_body == '{"ok":true}'
    assert result.duration_ms >= 0
    assert classify(result.status, result.error) == "delivered"
    [received] = simulator.received
    assert received.method == "POST"
    assert received.json == PAYLOAD
    assert received.signature_ok is True


def test_500_is_a_result_not_an_exception(simulator: BrokerSimulator) -> None:
    simulator.script(Reply(status=500, body=b"upstream down"))

    result = _post(simulator.url)

    assert (result.status, result.error) == (500, None)
    assert result.response_body == "upstream down"
    assert classify(result.status, result.error) == "retry"


def test_scripted_replies_come_in_order(simulator: BrokerSimulator) -> None:
    simulator.script(500, 500, 200)

    statuses = [_post(simulator.url).status for _ in range(4)]

    assert statuses == [500, 500, 200, 200]
    assert len(simulator.received) == 4


def test_redirect_is_not_followed(simulator: BrokerSimulator) -> None:
    simulator.script(Reply.redirect(location=simulator.base_url + "/elsewhere"))

    result = _post(simulator.url)

    assert result.status == 301
    assert result.error == "redirect not followed (301)"
    assert classify(result.status, result.error) == "retry"
    assert [r.path for r in simulator.received] == ["/webhook"]


def test_retry_after_and_410_reach_the_caller(simulator: BrokerSimulator) -> None:
    simulator.script(Reply.rate_limited("120"), Reply.gone())

    limited, gone = _post(simulator.url), _post(simulator.url)

    assert (limited.status, limited.response_headers["Retry-After"]) == (429, "120")
    assert classify(gone.status, gone.error) == "gone"


def test_slow_response_times_out(simulator: BrokerSimulator) -> None:
    simulator.script(Reply.slow(3.0))

    result = _post(simulator.url, timeout_total=0.3)

    assert (result.status, result.error) == (None, "timed out after 0.3 s")
    # Not before its deadline, and not when the answer came: a bound, not a speed.
    assert 250 <= result.duration_ms < 3000
    assert len(simulator.received) == 1


def test_trickling_body_cannot_stretch_the_total_timeout(simulator: BrokerSimulator) -> None:
    # Each piece arrives well within any single read timeout; only the overall deadline stops
    # it. The whole body would take 4 s (40 pieces of 64 bytes, 0.1 s apart).
    simulator.script(Reply(body=b"x" * 2560, trickle=0.1))

    result = _post(simulator.url, timeout_total=0.3)

    assert result.status == 200
    assert result.error == "timed out after 0.3 s"
    assert 250 <= result.duration_ms < 4000  # cut at the deadline, not stretched to the body's end
    assert classify(result.status, result.error) == "retry"


def test_connection_refused() -> None:
    result = _post(f"http://127.0.0.1:{_closed_port()}/webhook")

    assert (result.status, result.error) == (None, "connection refused")


def test_response_body_is_cut_at_4_kib(simulator: BrokerSimulator) -> None:
    simulator.script(Reply(body=b"a" * RESPONSE_BODY_LIMIT + b"b" * 100_000), Reply(body=b"\xffok"))

    long, undecodable = _post(simulator.url), _post(simulator.url)

    assert long.status == 200
    assert long.response_body == "a" * RESPONSE_BODY_LIMIT
    assert long.response_headers["Content-Length"] == str(RESPONSE_BODY_LIMIT + 100_000)
    assert undecodable.response_body == "\ufffdok"


def test_connections_are_kept_alive(simulator: BrokerSimulator) -> None:
    for _ in range(5):
        assert _post(simulator.url).status == 200

    assert simulator.connections_accepted == 1


# -- SSRF refusals (allow_private=False) ----------------------------------------------------


def test_the_address_filter_is_requests_hardeneds_unless_private_targets_are_allowed() -> None:
    filtered = build_session(False).get_adapter("https://broker.example/hook")
    opened = build_session(True).get_adapter("https://broker.example/hook")

    assert isinstance(filtered, IPFilterAdapter)
    assert not isinstance(opened, IPFilterAdapter)


@pytest.mark.usefixtures("no_connect")
def test_plain_http_is_refused(simulator: BrokerSimulator) -> None:
    result = _post(simulator.url, allow_private=False)

    assert (result.status, result.error) == (None, "plain http not allowed: use https")
    assert simulator.connections_accepted == 0


@pytest.mark.usefixtures("no_connect")
def test_https_to_the_loopback_broker_is_refused(simulator: BrokerSimulator) -> None:
    result = _post(f"https://127.0.0.1:{simulator.port}/webhook", allow_private=False)

    assert result.error == "target address not allowed: 127.0.0.1 is loopback"
    assert simulator.connections_accepted == 0
    assert simulator.received == []


@pytest.mark.usefixtures("no_connect")
@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://10.0.0.1/hook", "10.0.0.1 is private"),
        ("https://192.168.1.20/hook", "192.168.1.20 is private"),
        ("https://100.64.0.1/hook", "100.64.0.1 is private"),
        ("https://169.254.169.254/latest/meta-data/", "169.254.169.254 is link-local"),
        ("https://[::1]/hook", "::1 is loopback"),
        ("https://[::ffff:127.0.0.1]/hook", "127.0.0.1 is loopback"),
        ("https://[::ffff:10.0.0.1]/hook", "10.0.0.1 is private"),
        ("https://[fe80::1]/hook", "fe80::1 is link-local"),
        ("https://[fd00::1]/hook", "fd00::1 is private"),
        ("https://224.0.0.1/hook", "224.0.0.1 is multicast"),
        ("https://240.0.0.1/hook", "240.0.0.1 is reserved"),
        ("https://0.0.0.0/hook", "0.0.0.0 is reserved"),
        # Beyond requests-hardened's own check (Python's is_private misses these).
        ("https://[::7f00:1]/hook", "::7f00:1 is loopback (it leads to 127.0.0.1)"),
        ("https://[fec0::1]/hook", "fec0::1 is private"),
        # A name resolving to loopback (resolved from /etc/hosts, no network).
        ("https://localhost/hook", "127.0.0.1 is loopback"),
    ],
)
def test_non_public_targets_are_refused_before_connecting(url: str, error: str) -> None:
    result = _post(url, allow_private=False)

    assert result.status is None
    assert result.error == f"target address not allowed: {error}"
    assert classify(result.status, result.error) == "retry"


# IPv6 addresses that lead to an IPv4 one: refused for what that address is.
EMBEDDED_IPV4 = [
    # 6to4 (2002::/16): the IPv4 address is the next 32 bits.
    ("2002:7f00:1::", "loopback (it leads to 127.0.0.1)"),
    ("2002:a00:1::1", "private (it leads to 10.0.0.1)"),
    ("2002:c0a8:114::", "private (it leads to 192.168.1.20)"),
    ("2002:a9fe:a9fe::", "link-local (it leads to 169.254.169.254)"),
    # IPv4-compatible (IPv4-mapped ones are above: shown as their IPv4 address).
    ("::a00:1", "private (it leads to 10.0.0.1)"),
    ("::7f00:1", "loopback (it leads to 127.0.0.1)"),
    # NAT64, well-known and local-use prefixes.
    ("64:ff9b::7f00:1", "loopback (it leads to 127.0.0.1)"),
    ("64:ff9b::a00:1", "private (it leads to 10.0.0.1)"),
    ("64:ff9b:1::a9fe:a9fe", "link-local (it leads to 169.254.169.254)"),
    # Teredo (2001::/32): the client's address is the last 32 bits, inverted.
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "private (it leads to 10.0.0.1)"),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback (it leads to 127.0.0.1)"),
]


@pytest.mark.usefixtures("no_connect")
@pytest.mark.parametrize(("address", "reason"), EMBEDDED_IPV4)
def test_ipv6_addresses_leading_to_a_non_public_ipv4_are_refused_before_connecting(
    address: str, reason: str
) -> None:
    result = _post(f"https://[{address}]/hook", allow_private=False)

    assert result.status is None
    assert result.error == f"target address not allowed: {address} is {reason}"


@pytest.mark.parametrize(
    "address",
    [
        "2002:808:808::1",  # 6to4 of a public address: a relay may carry it
        "::ffff:8.8.8.8",
        "2606:4700:4700::1111",
    ],
)
def test_ipv6_addresses_leading_to_a_public_ipv4_are_judged_as_any(address: str) -> None:
    assert ip_refusal_reason(ipaddress.ip_address(address)) is None


@pytest.mark.usefixtures("no_connect")
@pytest.mark.parametrize("url", ["ftp://example.com/hook", "https:///hook", "example.com/hook"])
def test_malformed_urls_are_refused(url: str) -> None:
    assert _post(url, allow_private=False).error == (
        "invalid URL: an absolute https:// URL is required"
    )


# -- TLS ------------------------------------------------------------------------------------


def test_tls_context_requires_tls_1_2_and_verifies() -> None:
    context = tls_context()

    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True


@pytest.mark.parametrize("allow_private", [False, True])
def test_sessions_use_the_tls_context(allow_private: bool) -> None:
    adapter: Any = build_session(allow_private).get_adapter("https://broker.example/hook")

    context = adapter.poolmanager.connection_pool_kw["ssl_context"]

    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert build_session(allow_private) is build_session(allow_private)


def test_threads_asking_at_once_share_one_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's dispatch threads start together and each asks for the session: one builds
    it (with its TLS contexts) and the others get that one, its connections kept alive."""
    # A process that has built no session yet (the cached ones come back after the test).
    monkeypatch.setattr(
        outbound_http, "_session", functools.cache(outbound_http._session.__wrapped__)
    )
    start = threading.Barrier(8)
    sessions = []

    def ask() -> None:
        start.wait(timeout=10)
        sessions.append(build_session(True))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(sessions) == 8
    assert len({id(session) for session in sessions}) == 1


# -- the wall-clock bound -------------------------------------------------------------------


def test_trickling_headers_are_cut_at_the_total_timeout() -> None:
    # One header byte every 0.1 s: every read is well within its timeout, and the whole
    # response (a 200) would take 4 s; only a wall-clock bound ends the call.
    with TrickleServer(interval=0.1, header_bytes=40) as server:
        result = _post(server.url, timeout_total=0.5)

        assert (result.status, result.error) == (None, "timed out after 0.5 s")
        assert server.cut_off.wait(10), "the client kept the connection open"
        assert not server.finished.is_set()
        assert server.bytes_sent < 40


@pytest.fixture
def stalled_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A name server that answers only once the test is over (or after 30 s)."""
    answered = threading.Event()
    asked: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".stalled.test"):
            asked.append(host)
            answered.wait(30)
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield asked
    answered.set()


@pytest.mark.parametrize(
    ("url", "allow_private"),
    [("https://broker.stalled.test/hook", False), ("http://broker.stalled.test:9/hook", True)],
)
def test_slow_name_resolution_is_cut_at_the_total_timeout(
    stalled_dns: list[str], url: str, allow_private: bool
) -> None:
    result = _post(url, allow_private=allow_private, timeout_total=0.3)

    assert stalled_dns == ["broker.stalled.test"]
    assert (result.status, result.error) == (None, "timed out after 0.3 s")


def test_the_kept_answer_holds_no_character_postgresql_refuses(simulator: BrokerSimulator) -> None:
    simulator.script(Reply(body=b"\x00\x01 binary"))

    result = _post(simulator.url)

    assert result.response_body == "\ufffd\x01 binary"
    assert result.content == b"\x00\x01 binary"  # the whole answer, as read, for its reader


def test_a_header_http_cannot_carry_is_a_result_not_an_exception(
    simulator: BrokerSimulator,
) -> None:
    """A bearer token with a character outside Latin-1 (a pasted "’") made http.client raise
    out of ``deliver``, and out of the delivery batch that relied on it never raising."""
    result = deliver(
        "POST",
        simulator.url,
        body=b"{}",
        headers={"Authorization": "Bearer tok\u2019en"},
        allow_private=True,
    )

    assert (result.status, result.error) == (
        None,
        "the Authorization header holds a character HTTP cannot carry",
    )
    assert simulator.received == []
