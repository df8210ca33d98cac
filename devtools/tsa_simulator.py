"""A loopback RFC 3161 time-stamping authority, for tests and the demo.

It makes a throwaway CA and a time-stamping certificate under it (extendedKeyUsage critical
timeStamping) in a temporary directory, listens on 127.0.0.1 (a free port), and answers
each ``application/timestamp-query`` POST with OpenSSL's own ``openssl ts -reply``::

    with TsaSimulator() as tsa:
        settings.DROPPORTAL_TSA_URL = tsa.url
        ...ledger anchor...
        tsa.ca_pem             # the certificate an auditor checks tokens against
        tsa.timestamp(chain_hash)   # a token over any chain hash, without HTTP
        tsa.refuse_next(503)   # the next query is answered with that status

Needs the ``openssl`` command. Not product code: nothing in ``integrations/`` imports it.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import tempfile
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devtools.loopback import LoopbackServer, serve_in_thread
from integrations.evidence.timestamps import CONTENT_TYPE_REPLY, timestamp_request

_CONFIG = """\
[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
dir = {dir}
serial = $dir/serial
crypto_device = builtin
signer_cert = $dir/tsa.pem
certs = $dir/tsa.pem
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = 1.3.6.1.4.1.99999.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = no
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_authority(directory: Path, *, name: str = "dropportal test TSA") -> Path:
    """A CA (``ca.pem``) and a time-stamping certificate and key it signed (``tsa.pem``,
    ``tsa.key``) in ``directory``; returns the CA's path."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name} CA"))
        .issuer_name(_name(f"{name} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    tsa_key = ec.generate_private_key(ec.SECP256R1())
    tsa = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.subject)
        .public_key(tsa_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # RFC 3161 2.3: the one purpose, critical.
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "tsa.pem").write_bytes(tsa.public_bytes(pem))
    (directory / "tsa.key").write_bytes(
        tsa_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (directory / "serial").write_text("01\n")
    (directory / "openssl.cnf").write_text(_CONFIG.format(dir=directory))
    return directory / "ca.pem"


class _Server(LoopbackServer):
    simulator: TsaSimulator


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        simulator = self.server.simulator
        query = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status = simulator._next_status()
        body = simulator.reply(query) if status == 200 else b""
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE_REPLY)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class TsaSimulator:
    """A loopback time-stamping authority over ``openssl ts -reply``."""

    def __init__(self, *, name: str = "dropportal test TSA") -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="dropportal-tsa-")
        self.directory = Path(self._tmp.name)
        self.ca_path = make_authority(self.directory, name=name)
        self.queries = 0
        self._statuses: deque[int] = deque()
        self._lock = threading.Lock()  # openssl's serial file takes one reply at a time
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def ca_pem(self) -> bytes:
        return self.ca_path.read_bytes()

    @property
    def url(self) -> str:
        assert self._server is not None, "start the simulator first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/tsr"

    def refuse_next(self, *statuses: int) -> None:
        """Answer the next queries with these HTTP statuses and no token."""
        self._statuses.extend(statuses)

    def _next_status(self) -> int:
        self.queries += 1
        return self._statuses.popleft() if self._statuses else 200

    def reply(self, query: bytes) -> bytes:
        """``openssl ts -reply`` to a DER TimeStampReq: the DER TimeStampResp."""
        with self._lock, tempfile.TemporaryDirectory(dir=self.directory) as work:
            query_file, reply_file = Path(work) / "query.tsq", Path(work) / "reply.tsr"
            query_file.write_bytes(query)
            config = self.directory / "openssl.cnf"
            command = ["openssl", "ts", "-reply", "-config", str(config)]
            command += ["-queryfile", str(query_file), "-out", str(reply_file)]
            # A fixed command on files of our own; openssl from PATH, as a developer runs it.
            subprocess.run(command, check=True, capture_output=True)  # noqa: S603
            return reply_file.read_bytes()

    def timestamp(self, chain_hash: str) -> bytes:
        """A token over ``chain_hash``, as the service would get it (no HTTP)."""
        return self.reply(timestamp_request(chain_hash).as_bytes())

    def start(self) -> TsaSimulator:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.simulator = self
        self._server = server
        self._thread = serve_in_thread(server, name="tsa-simulator")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._tmp.cleanup()

    def __enter__(self) -> TsaSimulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
