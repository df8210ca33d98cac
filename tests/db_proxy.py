"""A loopback TCP proxy in front of the test PostgreSQL that a test can stop and start: a
real outage for the processes connected through it, while the server itself (shared) runs
on. Stopping closes the listener and cuts every open connection::

    with DatabaseProxy(database_server()) as proxy:  # (host, port), or a socket's path
        url = proxy.url_for(database_url())
        proxy.stop(); ...; proxy.start()

``hold()`` is the other way a server goes away: new connections are accepted but get no
answer (a host that drops packets while it restarts) until ``release()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.ports import free_port


class DatabaseProxy:
    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._held: list[socket.socket] | None = None  # a list while holding
        self._lock = threading.Lock()

    def url_for(self, url: str) -> str:
        """``url`` (a libpq URL with host and port in its query) through this proxy."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        query.update(host="127.0.0.1", port=str(self.port))
        return urlunsplit(parts._replace(query=urlencode(query)))

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets + (self._held or []), []
            self._held = None
        if listener is not None:
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def hold(self) -> None:
        """Leave new connections unanswered until ``release``; open ones go on."""
        with self._lock:
            self._held = []

    def release(self) -> None:
        """Connect the held connections (those their client still waits on) and answer again."""
        with self._lock:
            held, self._held = self._held or [], None
        for client in held:
            self._connect(client)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            with self._lock:
                if self._held is not None:
                    self._held.append(client)
                    continue
            if not self._connect(client, listener):
                return

    def _connect(self, client: socket.socket, listener: socket.socket | None = None) -> bool:
        """Pipe ``client`` to the server; False when the proxy was stopped meanwhile."""
        try:
            if isinstance(self.upstream, str):  # a Unix socket (the embedded server)
                server = socket.socket(socket.AF_UNIX)
                try:
                    server.connect(self.upstream)
                except OSError:
                    server.close()
                    raise
            else:
                server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return True
        with self._lock:
            if listener is not None and self._listener is not listener:
                client.close()
                server.close()
                return False
            self._sockets += [client, server]
        for source, target in ((client, server), (server, client)):
            threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()
        return True

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> DatabaseProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
