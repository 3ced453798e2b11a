"""A real PostgreSQL server for tests: initdb and pg_ctl (the OS's PostgreSQL binaries) on a
temporary directory, listening on loopback only. PostgreSQL refuses to run as root, so under
root (as in CI containers) the server runs as `nobody`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.server import free_port


def binaries() -> str | None:
    """Why no server can be started here, or None when one can."""
    missing = [name for name in ("initdb", "pg_ctl") if shutil.which(name) is None]
    if missing:
        return f"no PostgreSQL server binaries ({', '.join(missing)}) on PATH"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL cannot be started as another user"
    return None


@dataclass
class PostgresServer:
    home: Path
    port: int

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
        options = f"-k {home} -p {server.port} -c listen_addresses=127.0.0.1"
        server._run("pg_ctl", "-D", str(home / "data"), "-o", options, "-l", str(home / "log"), "-w", "start")
        return server

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout}{done.stderr}")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.home / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
