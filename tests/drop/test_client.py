"""The DROP API client, against the loopback DROP simulator (no request leaves 127.0.0.1)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import socket
import ssl
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.drop_simulator import (
    ALREADY_UPLOADED_MESSAGE,
    DropSimulator,
    build_drop_zip,
    package_etag,
    work_items,
)
from devtools.trickle_server import TrickleServer
from integrations.drop.client import (
    PRODUCTION_URL,
    SANDBOX_URL,
    DropApiError,
    DropAuthError,
    DropClient,
    DropConflict,
    DropLimits,
    DropPending,
    DropProtocolError,
    DropThrottled,
    DropUnavailable,
    base_url_for,
)
from integrations.outbound_http import tls_context

KEY = "dk_live_7Qz9SECRETkeyVALUE42"
ITEMS = list(work_items(4))
PACKAGE = build_drop_zip("4821", "20260312", {"Email": ITEMS[:2], "Phone": ITEMS[2:]})
PACKAGE_NAME = "20260312_4821_DROP.zip"
EMAIL_CSV = f"Id,Status\r\n{ITEMS[0][0]},3\r\n{ITEMS[1][0]},5\r\n".encode()
PHONE_CSV = f"Id,Status\r\n{ITEMS[2][0]},4\r\n".encode()

Call = tuple[str, str, int | None, int, str]
# The stall bound of the stalling packages below: they stop sending for 3 s, and their bytes
# before the stall leave at once, so a short bound is waited out and never tripped early.
STALL = 0.2


@pytest.fixture
def drop() -> Iterator[DropSimulator]:
    with DropSimulator(api_key=KEY) as simulator:
        yield simulator


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def calls() -> list[Call]:
    return []


@pytest.fixture
def make_client(
    drop: DropSimulator, sleeps: list[float], calls: list[Call]
) -> Callable[..., DropClient]:
    def make(**overrides: Any) -> DropClient:
        """A client on the simulator; ``DropLimits`` fields among ``overrides`` go there."""
        limits = {"connect_timeout": 1, "read_timeout": 2}
        options: dict[str, Any] = {
            "sleep": sleeps.append,
            "on_call": lambda *args: calls.append(args),
            # The simulator is on loopback: the one explicit opening of the outbound filter.
            "allow_private": True,
        }
        for name, value in overrides.items():
            is_limit = name in {field.name for field in dataclasses.fields(DropLimits)}
            (limits if is_limit else options)[name] = value
        api_key = options.pop("api_key", KEY)
        base_url = options.pop("base_url", drop.url)
        return DropClient(base_url, api_key, limits=DropLimits(**limits), **options)

    return make


def outcomes(calls: list[Call]) -> list[tuple[int | None, str]]:
    return [(status, outcome) for _, _, status, _, outcome in calls]


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ------------------------------------------------------------------ configuration


def test_base_url_by_mode_and_override() -> None:
    assert base_url_for("production", None) == PRODUCTION_URL == "https://api.drop.privacy.ca.gov"
    assert base_url_for("test", None) == SANDBOX_URL == "https://api.drop.privacy.ca.gov/sandbox"
    assert base_url_for("production", "http://127.0.0.1:8765/") == "http://127.0.0.1:8765"
    with pytest.raises(ValueError, match="unknown broker mode"):
        base_url_for("staging", None)


def test_plain_http_is_refused_without_the_explicit_opening() -> None:
    with pytest.raises(ValueError, match="must use https"):
        DropClient("http://drop.example.com", KEY)
    with pytest.raises(ValueError, match="must use https"):
        DropClient("http://127.0.0.1:9", KEY)
    opened = DropClient("http://127.0.0.1:9", KEY, allow_private=True)
    assert opened.base_url == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    "base_url",
    ["https://127.0.0.1:9", "https://10.0.0.8", "https://[::1]:9", "https://169.254.169.254"],
)
def test_non_public_drop_addresses_are_refused_before_connecting(
    base_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, calls: list[Call]
) -> None:
    def forbidden(sock: socket.socket, address: Any) -> None:
        raise AssertionError(f"a connection to {address} was attempted")

    monkeypatch.setattr(socket.socket, "connect", forbidden)
    monkeypatch.setattr(socket.socket, "connect_ex", forbidden)
    client = DropClient(base_url, KEY, on_call=lambda *args: calls.append(args))

    with pytest.raises(DropApiError, match="target address not allowed") as raised:
        client.download(tmp_path)

    assert KEY not in str(raised.value)
    assert outcomes(calls) == [(None, "refused")]  # refused, not retried


def test_a_drop_trickling_its_headers_is_cut_at_the_total_timeout(
    tmp_path: Path, calls: list[Call], sleeps: list[float]
) -> None:
    # A header byte every 0.1 s, each read well within its 0.5 s; the whole would take 4 s.
    with TrickleServer(interval=0.1, header_bytes=40) as server:
        client = DropClient(
            server.url.rstrip("/"),
            KEY,
            allow_private=True,
            limits=DropLimits(
                connect_timeout=1, read_timeout=0.5, total_timeout=0.5, max_retries=0
            ),
            sleep=sleeps.append,
            on_call=lambda *args: calls.append(args),
        )

        with pytest.raises(DropUnavailable, match=r"did not answer within 0\.5 s"):
            client.download(tmp_path)

        assert outcomes(calls) == [(None, "timeout")]
        assert server.cut_off.wait(10), "the client kept the connection open"
        assert not server.finished.is_set()
    assert files_in(tmp_path) == []


def test_tls_context_requires_tls_1_2_and_verifies_certificates() -> None:
    context = tls_context()

    assert context.minimum_version in {ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3}
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_client_https_connections_use_the_tls_context() -> None:
    client = DropClient(PRODUCTION_URL, KEY)
    adapter = client.session.get_adapter(PRODUCTION_URL + "/data/download")

    context = adapter.poolmanager.connection_pool_kw["ssl_context"]  # type: ignore[attr-defined]
    assert context.minimum_version in {ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3}


# ------------------------------------------------------------------ download


def test_download_saves_the_package_under_its_name(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    result = make_client().download(tmp_path)

    assert result.kind == "package"
    assert result.file_name == PACKAGE_NAME
    assert result.path == tmp_path / PACKAGE_NAME
    assert result.path.read_bytes() == PACKAGE
    assert result.size_bytes == len(PACKAGE)
    assert files_in(tmp_path) == [PACKAGE_NAME]  # no temporary file left behind
    assert calls == [("GET", "/data/download", 200, calls[0][3], "package")]
    sent = drop.requests[0].headers
    assert sent["X-API-KEY"] == KEY
    assert sent["User-Agent"].startswith("dropportal/")
    assert sent["Accept"] == "application/zip, application/json"


def test_download_under_the_sandbox_prefix(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    result = make_client(base_url=drop.sandbox_url).download(tmp_path)

    assert result.kind == "package"


def test_same_package_twice_is_stored_once_and_a_different_one_is_not_overwritten(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    other = build_drop_zip("4821", "20260312", {"Email": [ITEMS[3]]})
    drop.queue_package(PACKAGE, PACKAGE_NAME)
    drop.queue_package(PACKAGE, PACKAGE_NAME)
    drop.queue_package(other, PACKAGE_NAME)
    client = make_client()

    first, again, different = (client.download(tmp_path) for _ in range(3))

    assert first.path == again.path == tmp_path / PACKAGE_NAME
    assert different.path == tmp_path / "20260312_4821_DROP-1.zip"
    assert (tmp_path / PACKAGE_NAME).read_bytes() == PACKAGE
    assert different.path.read_bytes() == other


def test_nothing_new(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    drop.queue_nothing_new("Nothing since 2026-03-12.")

    result = make_client().download(tmp_path)

    assert (result.kind, result.message, result.path) == (
        "nothing_new",
        "Nothing since 2026-03-12.",
        None,
    )
    assert files_in(tmp_path) == []
    assert outcomes(calls) == [(200, "nothing_new")]


def test_the_next_download_is_refused_until_the_package_s_statuses_are_reported(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    """As DROP answers: a stand-in that answered "nothing new" here gave a pull the
    download's credit that DROP refuses it."""
    drop.queue_package(PACKAGE, PACKAGE_NAME)
    client = make_client()
    client.download(tmp_path)

    with pytest.raises(DropConflict):
        client.download(tmp_path)

    client.upload(
        [("20260312_4821_Email.csv", b"Id,Status\r\n" + ITEMS[0][0].encode() + b",5\r\n")]
    )
    assert client.download(tmp_path).kind == "nothing_new"


def test_202_waits_retry_after_then_gets_the_package(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
    tmp_path: Path,
    sleeps: list[float],
    calls: list[Call],
) -> None:
    drop.queue_pending(times=2, retry_after=45)
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    result = make_client().download(tmp_path)

    assert result.kind == "package"
    assert result.attempts == 3
    assert sleeps == [45.0, 45.0]
    assert outcomes(calls) == [(202, "pending"), (202, "pending"), (200, "package")]


def test_202_forever_gives_up_within_max_wait(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, sleeps: list[float]
) -> None:
    drop.queue_pending(times=20, retry_after=30)

    with pytest.raises(DropPending) as caught:
        make_client(max_wait_seconds=100).download(tmp_path)

    assert sleeps == [30.0, 30.0, 30.0]  # a fourth wait would pass 100 s
    assert len(drop.calls("/data/download")) == 4
    assert caught.value.status == 202
    assert files_in(tmp_path) == []


def test_401_plain_text_is_an_auth_error(
    make_client: Callable[..., DropClient], tmp_path: Path, sleeps: list[float]
) -> None:
    with pytest.raises(DropAuthError) as caught:
        make_client(api_key="wrong-key").download(tmp_path)

    assert caught.value.status == 401
    assert "Unauthorized" in str(caught.value)
    assert sleeps == []


def test_401_json_is_an_auth_error(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_response(401, body={"message": "Invalid API key."})

    with pytest.raises(DropAuthError, match=r"Invalid API key\. \(HTTP 401\)"):
        make_client().download(tmp_path)


def test_403_is_an_auth_error(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_response(403, body={"message": "No list selected."})

    with pytest.raises(DropAuthError) as caught:
        make_client().download(tmp_path)

    assert caught.value.status == 403
    assert "No list selected." in caught.value.message


def test_409_means_report_first(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_response(409, body={"message": "Previous download has pending work items."})

    with pytest.raises(DropConflict, match="report them first") as caught:
        make_client().download(tmp_path)

    assert "Previous download has pending work items." in caught.value.message


def test_429_waits_then_succeeds(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
    tmp_path: Path,
    sleeps: list[float],
    calls: list[Call],
) -> None:
    drop.queue_response(429, body={"message": "Too many requests"}, headers={"Retry-After": "7"})
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    assert make_client().download(tmp_path).kind == "package"
    assert sleeps == [7.0]
    assert outcomes(calls) == [(429, "throttled"), (200, "package")]


def test_429_forever_is_throttled(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_response(429, headers={"Retry-After": "30"}, times=10)

    with pytest.raises(DropThrottled) as caught:
        make_client(max_wait_seconds=60).download(tmp_path)

    assert isinstance(caught.value, DropUnavailable)
    assert caught.value.status == 429


def test_503_is_retried_with_backoff(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
    tmp_path: Path,
    sleeps: list[float],
    calls: list[Call],
) -> None:
    drop.queue_response(503, body={"message": "Service Unavailable"})
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    assert make_client().download(tmp_path).kind == "package"
    assert sleeps == [2.0]
    assert outcomes(calls) == [(503, "server_error"), (200, "package")]


def test_500_forever_is_unavailable_after_bounded_retries(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, sleeps: list[float]
) -> None:
    drop.queue_response(500, body={"message": "Internal error"}, times=10)

    with pytest.raises(DropUnavailable) as caught:
        make_client(max_retries=3).download(tmp_path)

    assert sleeps == [2.0, 4.0, 8.0]
    assert len(drop.calls()) == 4
    assert caught.value.status == 500
    assert "failed 4 times; last: Internal error" in str(caught.value)


def test_body_cut_mid_way_leaves_no_file(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    drop.queue_package(PACKAGE, PACKAGE_NAME, cut_after=len(PACKAGE) // 2)
    drop.queue_package(PACKAGE, PACKAGE_NAME, cut_after=len(PACKAGE) // 2)

    with pytest.raises(DropUnavailable, match="download cut short"):
        make_client(max_body_retries=1).download(tmp_path)

    assert files_in(tmp_path) == []
    assert outcomes(calls) == [(200, "truncated"), (200, "truncated")]


def test_body_cut_once_is_retried_and_the_file_is_whole(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_package(PACKAGE, PACKAGE_NAME, cut_after=100)
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    make_client().download(tmp_path)

    assert files_in(tmp_path) == [PACKAGE_NAME]
    assert (tmp_path / PACKAGE_NAME).read_bytes() == PACKAGE


def test_timeout_is_retried(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    drop.queue_response(200, body={"message": "late"}, delay=1.0)
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    # The second answer must come within the timeout: 0.4 s, room for a loaded machine.
    result = make_client(read_timeout=0.4).download(tmp_path)

    assert result.kind == "package"
    assert outcomes(calls) == [(None, "timeout"), (200, "package")]


def test_timeout_forever_is_unavailable(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_response(200, body={"message": "late"}, delay=0.4, times=2)

    with pytest.raises(DropUnavailable, match="did not answer in time"):
        make_client(read_timeout=0.1, max_retries=1).download(tmp_path)


@pytest.mark.parametrize(
    "disposition",
    [
        'attachment; filename="../../etc/cron.d/evil.zip"',
        'attachment; filename="/tmp/evil.zip"',
        'attachment; filename="..\\\\evil.zip"',
        "attachment; filename*=UTF-8''..%2Fevil.zip",
        'attachment; filename="package.exe"',
        'attachment; filename=".hidden.zip"',
    ],
)
def test_path_tricks_in_the_file_name_are_refused(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, disposition: str
) -> None:
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    drop.queue_package(PACKAGE, content_disposition=disposition)

    with pytest.raises(DropProtocolError, match="refusing package file name"):
        make_client().download(downloads)

    assert files_in(downloads) == []
    assert files_in(tmp_path) == ["downloads"]


def test_redirects_are_not_followed(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    drop.queue_response(302, headers={"Location": "http://127.0.0.2:9/steal"})

    with pytest.raises(DropProtocolError) as caught:
        make_client().download(tmp_path)

    assert caught.value.status == 302
    assert len(drop.requests) == 1


# ------------------------------------------------------------------ upload and amend


def test_upload_sends_multipart_files_and_reads_accepted_and_rejected(
    drop: DropSimulator, make_client: Callable[..., DropClient], calls: list[Call]
) -> None:
    drop.active_download = True
    client = make_client()

    result = client.upload(
        [("20260312_4821_Email.csv", EMAIL_CSV), ("20260312_4821_Phone.csv", b"ID,Hash\r\n")]
    )

    assert result.status == 202
    assert result.accepted_names == ("20260312_4821_Email.csv",)
    assert result.newly_accepted == {"20260312_4821_Email.csv": len(EMAIL_CSV)}
    assert result.rejected == {
        "20260312_4821_Phone.csv": "Invalid file header: expected Id,Status."
    }
    assert (result.accepted_count, result.rejected_count) == (1, 1)
    assert not result.all_accepted
    request = drop.requests[0]
    assert (request.method, request.path) == ("POST", "/data/upload")
    assert request.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    assert request.files == {
        "20260312_4821_Email.csv": EMAIL_CSV,
        "20260312_4821_Phone.csv": b"ID,Hash\r\n",
    }
    assert outcomes(calls) == [(202, "accepted")]


def test_upload_from_a_path(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    path = tmp_path / "20260312_4821_Email_part01.csv"
    path.write_bytes(EMAIL_CSV)
    drop.active_download = True
    result = make_client().upload([(path.name, path)])

    assert result.all_accepted
    assert drop.uploaded == {path.name: EMAIL_CSV}


def test_a_name_already_uploaded_counts_as_accepted(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
) -> None:
    drop.active_download = True
    client = make_client()
    client.upload([("20260312_4821_Email.csv", EMAIL_CSV)])

    retried = client.upload(
        [("20260312_4821_Email.csv", EMAIL_CSV), ("20260312_4821_Phone.csv", PHONE_CSV)]
    )

    assert retried.status == 202
    assert retried.already_uploaded_names == ("20260312_4821_Email.csv",)
    assert retried.newly_accepted == {"20260312_4821_Phone.csv": len(PHONE_CSV)}
    assert set(retried.accepted_names) == {
        "20260312_4821_Email.csv",
        "20260312_4821_Phone.csv",
    }
    assert retried.rejected == {}
    assert retried.all_accepted

    only_repeat = client.upload([("20260312_4821_Email.csv", EMAIL_CSV)])
    assert only_repeat.status == 400
    assert only_repeat.all_accepted
    assert only_repeat.rejected == {}
    assert ALREADY_UPLOADED_MESSAGE.startswith("A file with this name was already uploaded")


def test_upload_400_accepts_nothing(
    drop: DropSimulator, make_client: Callable[..., DropClient], calls: list[Call]
) -> None:
    drop.active_download = True
    result = make_client().upload(
        [("20260312_4821_Email.csv", b"id,status\r\n"), ("20260312_4821_Phone.csv", b"")]
    )

    assert result.status == 400
    assert result.accepted_names == ()
    assert set(result.rejected) == {"20260312_4821_Email.csv", "20260312_4821_Phone.csv"}
    assert not result.all_accepted
    assert drop.uploaded == {}
    assert outcomes(calls) == [(400, "rejected")]


def test_upload_409_when_no_download_waits(
    drop: DropSimulator, make_client: Callable[..., DropClient]
) -> None:
    with pytest.raises(DropConflict, match="no active download waits for responses") as caught:
        make_client().upload([("20260312_4821_Email.csv", EMAIL_CSV)])

    assert caught.value.status == 409


def test_amend_409_when_not_possible(
    drop: DropSimulator, make_client: Callable[..., DropClient]
) -> None:
    with pytest.raises(DropConflict, match="amendment is not possible"):
        make_client().amend([("20260312_4821_Email.csv", EMAIL_CSV)])


def test_amend_after_an_upload(drop: DropSimulator, make_client: Callable[..., DropClient]) -> None:
    drop.active_download = True
    client = make_client()
    client.upload([("20260312_4821_Email.csv", EMAIL_CSV)])

    result = client.amend([("20260312_4821_Email_fix1.csv", EMAIL_CSV)])

    assert result.all_accepted
    assert drop.calls("/data/amend")[0].files == {"20260312_4821_Email_fix1.csv": EMAIL_CSV}


def test_upload_429_and_503_are_retried(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
    sleeps: list[float],
    calls: list[Call],
) -> None:
    drop.active_download = True
    drop.queue_response(429, headers={"Retry-After": "3"}, path="/data/upload")
    drop.queue_response(503, body="busy", path="/data/upload")

    result = make_client().upload([("20260312_4821_Email.csv", EMAIL_CSV)])

    assert result.all_accepted
    assert result.attempts == 3
    assert sleeps == [3.0, 2.0]
    assert outcomes(calls) == [(429, "throttled"), (503, "server_error"), (202, "accepted")]


@pytest.mark.parametrize("call", ["download", "upload", "amend"])
def test_a_204_where_an_answer_is_due_is_a_protocol_error_naming_it(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
    tmp_path: Path,
    sleeps: list[float],
    calls: list[Call],
    call: str,
) -> None:
    """No Content where DROP owes a package, a message or the per-file answers: one clear
    error, not retried, and no file left behind."""
    drop.active_download = True
    drop.queue_response(204)
    client = make_client()
    files = [("20260312_4821_Email.csv", EMAIL_CSV)]

    with pytest.raises(DropProtocolError) as caught:
        if call == "download":
            client.download(tmp_path)
        else:
            getattr(client, call)(files)

    assert caught.value.status == 204
    assert str(caught.value) == "unexpected answer from DROP: No Content (HTTP 204)"
    assert outcomes(calls) == [(204, "unexpected")]
    assert sleeps == []
    assert files_in(tmp_path) == []
    assert drop.uploaded == {}


def test_upload_refuses_bad_names_before_sending(
    drop: DropSimulator, make_client: Callable[..., DropClient]
) -> None:
    client = make_client()
    for files in (
        [("../20260312_4821_Email.csv", EMAIL_CSV)],
        [("20260312_4821_Removed.csv", EMAIL_CSV)],
        [("20260312_4821_Email.csv", EMAIL_CSV)] * 2,
        [],
    ):
        with pytest.raises(ValueError, match="upload"):
            client.upload(files)

    assert drop.requests == []


# ------------------------------------------------------------------ the key never leaks


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_api_key_never_appears_in_errors_logs_or_reprs(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
    tmp_path: Path,
    calls: list[Call],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    drop.queue_response(401, body=f"Key {KEY} is not valid")
    drop.queue_response(403, body={"message": f"Key {KEY} has no list selected"})
    drop.queue_response(409, body={"message": f"{KEY}: report first"})
    drop.queue_response(500, body=f"crash for {KEY}", times=2)
    drop.queue_response(200, delay=1.0, times=2)
    drop.queue_response(404, body={"message": f"what is {KEY}"})
    drop.queue_package(PACKAGE, content_disposition=f'attachment; filename="{KEY}/x.zip"')
    # Every other answer must come within the timeout: 0.4 s, room for a loaded machine.
    client = make_client(max_retries=1, read_timeout=0.4)

    errors: list[DropApiError] = []
    for _ in range(7):
        with pytest.raises(DropApiError) as caught:
            client.download(tmp_path)
        errors.append(caught.value)
    with pytest.raises(DropUnavailable) as refused:
        make_client(base_url=closed_port_url(), max_retries=1).download(tmp_path)
    errors.append(refused.value)

    assert [type(e) for e in errors] == [
        DropAuthError,
        DropAuthError,
        DropConflict,
        DropUnavailable,
        DropUnavailable,
        DropProtocolError,
        DropProtocolError,
        DropUnavailable,
    ]
    assert "[redacted]" in str(errors[0])
    for error in errors:
        shown = str(error) + repr(error) + "".join(traceback.format_exception(error))
        assert KEY not in shown
    assert KEY not in caplog.text
    assert all(KEY not in record.getMessage() for record in caplog.records)
    assert KEY not in repr(client) + repr(vars(client))
    assert KEY not in repr(calls)
    assert len(caplog.records) > 0


def test_a_key_echoed_where_drops_text_is_cut_short_shows_no_part_of_it(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path
) -> None:
    # DROP's texts are cut short for a message (500 characters of an error, 80 of a file name
    # or a Content-Range): the key echoed across the cut is redacted all the same.
    drop.queue_response(403, body={"message": "x" * 490 + f" {KEY} has no list selected"})
    drop.queue_package(PACKAGE, content_disposition=f'attachment; filename="{"x" * 70}{KEY}"')
    drop.queue_package(PACKAGE, PACKAGE_NAME, cut_after=len(PACKAGE) // 2)
    drop.queue_response(
        206,
        body=PACKAGE[len(PACKAGE) // 2 :],
        headers={
            "Content-Type": "application/zip",
            "Content-Disposition": f'attachment; filename="{PACKAGE_NAME}"',
            "Content-Range": f"bytes {'9' * 70}{KEY}",
        },
    )
    client = make_client(max_body_retries=1)

    errors = []
    for _ in range(3):
        with pytest.raises(DropApiError) as caught:
            client.download(tmp_path)
        errors.append(caught.value)

    assert [type(e) for e in errors] == [DropAuthError, DropProtocolError, DropUnavailable]
    assert "unreadable Content-Range" in str(errors[2])
    for error in errors:
        assert "[red" in str(error)  # the cut may fall inside the mark, never in the key
        assert KEY[:6] not in str(error)


# ------------------------------------------------------------------ slow packages


def test_a_package_slower_than_every_bound_in_all_but_never_silent_arrives_whole(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    # 12 pieces 0.04 s apart: about 0.44 s in all, past both the 0.2 s bound on the answer
    # and the 0.4 s stall bound, yet never silent for 0.4 s.
    drop.queue_package(PACKAGE, PACKAGE_NAME, pace=0.04, chunk=-(-len(PACKAGE) // 12))
    progress: list[tuple[int, int | None]] = []

    result = make_client(total_timeout=0.2, stall_timeout=0.4).download(
        tmp_path, on_progress=lambda received, announced: progress.append((received, announced))
    )

    assert (result.kind, result.size_bytes, result.attempts) == ("package", len(PACKAGE), 1)
    assert (tmp_path / PACKAGE_NAME).read_bytes() == PACKAGE
    assert outcomes(calls) == [(200, "package")]
    assert len(progress) >= 12
    assert progress[-1] == (len(PACKAGE), len(PACKAGE))


def test_a_package_that_stalls_is_cut_and_tried_again(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    drop.queue_package(PACKAGE, PACKAGE_NAME, stall_after=len(PACKAGE) // 2, stall_for=3.0)
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    result = make_client(stall_timeout=STALL).download(tmp_path)

    assert (result.kind, result.attempts) == ("package", 2)
    assert outcomes(calls) == [(200, "stalled"), (200, "package")]
    assert files_in(tmp_path) == [PACKAGE_NAME]  # nothing left of the stalled attempt
    assert (tmp_path / PACKAGE_NAME).read_bytes() == PACKAGE


def test_a_package_that_always_stalls_gives_up_naming_the_stall(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    for _ in range(2):
        drop.queue_package(PACKAGE, PACKAGE_NAME, stall_after=100, stall_for=3.0)

    with pytest.raises(DropUnavailable, match=r"download stalled: no byte for 0\.2 s"):
        make_client(stall_timeout=STALL, max_body_retries=1).download(tmp_path)

    assert outcomes(calls) == [(200, "stalled"), (200, "stalled")]
    assert files_in(tmp_path) == []


def test_a_stalled_package_resumes_where_it_stopped_when_drop_honours_range(
    drop: DropSimulator, make_client: Callable[..., DropClient], tmp_path: Path, calls: list[Call]
) -> None:
    half = len(PACKAGE) // 2
    drop.queue_package(PACKAGE, PACKAGE_NAME, stall_after=half, stall_for=3.0, ranges=True)
    drop.queue_package(PACKAGE, PACKAGE_NAME, ranges=True)
    progress: list[tuple[int, int | None]] = []

    result = make_client(stall_timeout=STALL).download(
        tmp_path, on_progress=lambda received, announced: progress.append((received, announced))
    )

    first, second = drop.calls("/data/download")
    assert second.headers["Range"] == f"bytes={half}-"
    assert "Range" not in first.headers
    assert second.headers["If-Range"] == package_etag(PACKAGE)  # the package the kept bytes are of
    assert outcomes(calls) == [(200, "stalled"), (206, "package")]
    assert (result.size_bytes, result.sha256) == (len(PACKAGE), hashlib.sha256(PACKAGE).hexdigest())
    assert (tmp_path / PACKAGE_NAME).read_bytes() == PACKAGE
    assert files_in(tmp_path) == [PACKAGE_NAME]
    # The resumed attempt counts on from the bytes kept, towards the whole.
    resumed = progress[progress.index((half, len(PACKAGE))) + 1 :]
    assert resumed and all(received > half for received, _ in resumed)
    assert progress[-1] == (len(PACKAGE), len(PACKAGE))


@pytest.mark.parametrize(
    ("status", "headers"),
    [
        (206, {"Content-Range": "bytes 0-99/100"}),  # not the rest of what was kept
        (416, {"Content-Range": f"bytes */{len(PACKAGE)}"}),
    ],
    ids=["another-range", "416"],
)
def test_a_resume_drop_does_not_continue_starts_the_package_over(
    drop: DropSimulator,
    make_client: Callable[..., DropClient],
    tmp_path: Path,
    calls: list[Call],
    status: int,
    headers: dict[str, str],
) -> None:
    drop.queue_package(PACKAGE, PACKAGE_NAME, stall_after=100, stall_for=3.0)
    zip_headers = {
        "Content-Type": "application/zip",
        "Content-Disposition": f'attachment; filename="{PACKAGE_NAME}"',
    }
    drop.queue_response(
        status, body=PACKAGE[:100], headers={**zip_headers, **headers}, path="/data/download"
    )
    drop.queue_package(PACKAGE, PACKAGE_NAME)

    result = make_client(stall_timeout=STALL).download(tmp_path)

    assert outcomes(calls) == [(200, "stalled"), (status, "resume_refused"), (200, "package")]
    assert [r.headers.get("Range") for r in drop.calls("/data/download")] == [
        None,
        "bytes=100-",
        None,  # the whole again: nothing of the kept part is trusted
    ]
    assert result.sha256 == hashlib.sha256(PACKAGE).hexdigest()
    assert files_in(tmp_path) == [PACKAGE_NAME]
