"""Signed deletion callbacks as raw HTTP/1.1 bytes, and their answers parsed, for the tests
that call a served portal (gunicorn) over plain sockets::

    raw = signed_deletion_callback(port, key=key, secret=secret, request_uuid=uuid)
    answer = Answer(received)   # .status, .headers (names lower-cased), .body
"""

from __future__ import annotations

import json

from integrations.dispatch import signing


class Answer:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:])
        }


def signed_deletion_callback(port: int, *, key: str, secret: str, request_uuid: str) -> bytes:
    """A ``deleted`` deletion callback for ``request_uuid``, signed with ``secret``, on a
    connection the server closes once it has answered."""
    body = json.dumps(
        {
            "schema_version": "1.0",
            "status": "completed",
            "request_uuid": request_uuid,
            "drop_outcome": "deleted",
        }
    ).encode()
    headers = {
        "Host": f"127.0.0.1:{port}",
        "Connection": "close",
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        **signing.signed_headers(secret, body),
    }
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"PUT /api/v1/drop/callbacks/deletion HTTP/1.1\r\n{head}\r\n".encode() + body
