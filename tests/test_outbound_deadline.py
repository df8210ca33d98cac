"""The wall-clock deadline's footing in requests, urllib3 and requests-hardened.

``integrations.outbound_deadline`` overrides private parts of urllib3 (its docstring lists
them). These tests fail, each naming what changed, when an upgrade moves any of them; the
behaviour itself is tested through the calls in ``tests/test_outbound_http.py`` and
``tests/drop/test_client.py``.
"""

from __future__ import annotations

import inspect
import socket
from importlib import metadata

import pytest
import requests
import requests_hardened.ip_filter
from requests.adapters import HTTPAdapter
from requests_hardened.ip_filter_adapter import IPFilterAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.poolmanager import PoolManager

from integrations.outbound_deadline import VERIFIED_WITH, DeadlineAdapter, bounded
from integrations.outbound_http import build_session


def test_the_installed_versions_are_the_ones_the_deadline_was_checked_against() -> None:
    installed = {name: metadata.version(name) for name in VERIFIED_WITH}

    assert installed == VERIFIED_WITH, (
        "requests, urllib3 or requests-hardened changed: check the private parts "
        "integrations/outbound_deadline.py relies on (its docstring), then update VERIFIED_WITH"
    )


@pytest.mark.parametrize("connection_class", [HTTPConnection, HTTPSConnection])
def test_urllib3_opens_each_socket_in_new_conn_before_any_handshake(
    connection_class: type[HTTPConnection],
) -> None:
    connect = inspect.getsource(connection_class.connect)
    new_conn = inspect.getsource(HTTPConnection._new_conn)

    assert list(inspect.signature(HTTPConnection._new_conn).parameters) == ["self"]
    assert "self._new_conn()" in connect, "connect() no longer opens its socket in _new_conn()"
    if connection_class is HTTPSConnection:
        assert connect.index("self._new_conn()") < connect.index("_ssl_wrap_socket")
    assert "(self._dns_host, self.port)" in new_conn, "_new_conn() no longer resolves _dns_host"


def test_urllib3_keeps_the_host_to_resolve_in_dns_host() -> None:
    connection = HTTPConnection("broker.example.", 443)

    assert connection._dns_host == "broker.example."
    assert connection.host == "broker.example"


def test_the_pool_classes_are_chosen_where_the_deadline_sets_them() -> None:
    adapter = DeadlineAdapter()

    assert isinstance(adapter.poolmanager, PoolManager)
    pool_classes = adapter.poolmanager.pool_classes_by_scheme
    assert set(pool_classes) == {"http", "https"}
    assert "self.pool_classes_by_scheme[scheme]" in inspect.getsource(PoolManager._new_pool)
    for pool_class in pool_classes.values():
        assert issubclass(pool_class, HTTPConnectionPool)
        assert pool_class.ConnectionCls.__name__.startswith("_Bounded")


def test_requests_hardened_resolves_while_requests_builds_the_pool_key() -> None:
    # DeadlineAdapter waits for this method within the deadline, for the name it resolves.
    method = HTTPAdapter.build_connection_pool_key_attributes
    sending = inspect.getsource(HTTPAdapter.get_connection_with_tls_context)

    assert list(inspect.signature(method).parameters) == ["self", "request", "verify", "cert"]
    assert "self.build_connection_pool_key_attributes(" in sending
    filtering = inspect.getsource(IPFilterAdapter.build_connection_pool_key_attributes)
    assert "filter_host(" in filtering
    assert "socket.getaddrinfo(" in inspect.getsource(requests_hardened.ip_filter.get_ip_address)


def test_a_tls_handshake_that_never_ends_is_cut_at_the_deadline() -> None:
    # The listener's backlog accepts the connection, and nothing ever answers the
    # ClientHello: only the watchdog (the socket timeouts are 20 s) ends the handshake, and
    # a cut socket fails as a broken handshake, not as a timeout.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        session = build_session(True)

        with bounded(0.5) as bound, pytest.raises(requests.RequestException) as raised:
            session.get(f"https://127.0.0.1:{port}/", timeout=(20, 20))

    assert bound.expired
    assert not isinstance(raised.value, requests.Timeout), raised.value
