"""Maintenance jobs that read and write data files, run in a process of their own:
`python -m isbre.catalog.job_main`, started by the server for one job on one table.

Compaction reads and writes as many bytes as the files it rewrites. In a process that serves
requests that work would hold the interpreter lock against commits and loads; in its own process,
at a low scheduling priority, it competes only for the cores. It opens the server's store as any
other process of the server does and commits through its own writer: its commit is an ordinary
one, numbered and logged. The store and the warehouses' storage settings come in the
environment, never on the command line; the report comes back as JSON on standard output.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The standard library only at import: catalog/job_main.py imports this module before its process
# is bound to its server's life.
if TYPE_CHECKING:
    from isbre.catalog.identifiers import Identifier
    from isbre.catalog.limits import Limits
    from isbre.catalog.maintenance import JobReport
    from isbre.catalog.warehouse_config import Warehouse

log = logging.getLogger(__name__)
JOB_ENV = "ISBRE_JOB"
PARENT_ENV = "ISBRE_JOB_PARENT"
# What a job's process inherits of the server's environment: how to reach the store and object
# storage (credentials, certificates, proxies), the locale and temporary files; nothing else.
_INHERITED = ("PATH", "HOME", "LANG", "TZ", "TMPDIR", "NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY")
_INHERITED_PREFIXES = ("LC_", "AWS_", "PG", "SSL_CERT_", "REQUESTS_CA_BUNDLE")
# The answer of a job that failed: the exception's kind and one line saying why.
DISK_FULL = "InsufficientStorageError"


class JobProcessError(RuntimeError):
    """The job's process failed or did not answer."""


def job_environment(store: str, job: str) -> dict[str, str]:
    from isbre.catalog.stores import HELPER_STORE_ENV

    kept = {k: v for k, v in os.environ.items() if k in _INHERITED or k.startswith(_INHERITED_PREFIXES)}
    return {**kept, HELPER_STORE_ENV: store, JOB_ENV: job, PARENT_ENV: str(os.getpid())}


@dataclass(frozen=True)
class JobProcesses:
    """How a server runs a job in a process of its own: the store it opens, its warehouses, and
    the directory the process runs in (the server's state directory)."""

    store: str
    warehouses: Sequence[Warehouse]
    timeout_s: float = 3600.0
    directory: Path | None = None
    limits: Limits | None = None  # the server's: a job keeps the same reserve of free disk

    def run(self, warehouse: str, ident: Identifier, job: str, now_ms: int) -> JobReport:
        """Run `job` on the table in a new process and wait for its report. The process starts
        isolated (`python -I`: no working directory, user site or PYTHON* variable on its path),
        in the state directory, with only the environment it needs."""
        from isbre.catalog.limits import Limits
        from isbre.catalog.maintenance import JobReport
        from isbre.catalog.store import InsufficientStorageError

        job_settings = {
            "warehouses": [w.for_helper() for w in self.warehouses],
            "warehouse": warehouse,
            "namespace": list(ident.namespace),
            "name": ident.name,
            "job": job,
            "now_ms": now_ms,
            "limits": asdict(self.limits or Limits()),
        }
        directory = self.directory or Path(self.store).parent
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-m", "isbre.catalog.job_main"],
                env=job_environment(self.store, json.dumps(job_settings)),
                cwd=directory if directory.is_dir() else None,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise JobProcessError(f"{job} on {ident} did not end within {self.timeout_s:g} s") from exc
        if done.stderr.strip():
            log.log(
                logging.WARNING if done.returncode else logging.DEBUG, "%s on %s: %s", job, ident, done.stderr
            )
        answer = _last_json(done.stdout) or {}
        if "job" in answer:  # it reported what it did (a kill after that changes none of it)
            return JobReport.from_json(answer)
        if answer.get("failed") == DISK_FULL:
            raise InsufficientStorageError(f"{job} on {ident}: {answer['message']}")
        said = answer.get("message") or f"the process ended ({done.returncode}) without a report"
        raise JobProcessError(f"{job} on {ident} failed: {said}")


def _last_json(stdout: str) -> dict[str, Any] | None:
    lines = stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
