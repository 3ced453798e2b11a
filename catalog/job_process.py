"""Maintenance jobs that read and write data files, run in a process of their own:
`python -m isbre.catalog.job_process`, started by the server for one job on one table.

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

# Nothing heavier than the standard library before the process is bound to its server's life.
from isbre.catalog.processes import die_with_parent

if TYPE_CHECKING:
    from isbre.catalog.identifiers import Identifier
    from isbre.catalog.limits import Limits
    from isbre.catalog.maintenance import JobReport
    from isbre.catalog.warehouses import Warehouse

log = logging.getLogger("isbre.catalog.job_process")  # by name: the module runs as __main__
JOB_ENV = "ISBRE_JOB"
PARENT_ENV = "ISBRE_JOB_PARENT"
# What a job's process inherits of the server's environment: how to reach the store and object
# storage (credentials, certificates, proxies), the locale and temporary files; nothing else.
_INHERITED = ("PATH", "HOME", "LANG", "TZ", "TMPDIR", "NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY")
_INHERITED_PREFIXES = ("LC_", "AWS_", "PG", "SSL_CERT_", "REQUESTS_CA_BUNDLE")
# The answer of a job that failed: the exception's kind and one line saying why.
_DISK_FULL = "InsufficientStorageError"


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
                [sys.executable, "-I", "-m", "isbre.catalog.job_process"],
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
        if answer.get("failed") == _DISK_FULL:
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


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


def main() -> int:
    parent = os.environ.pop(PARENT_ENV, None)
    die_with_parent(expected_parent=int(parent) if parent else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.nice(10)
    # Imported once the process is a job's: this module is imported by every server.
    from isbre.catalog.identifiers import Identifier
    from isbre.catalog.limits import Limits
    from isbre.catalog.store import InsufficientStorageError, is_disk_full
    from isbre.catalog.stores import helper_store
    from isbre.catalog.warehouses import Warehouse, open_warehouses

    found = json.loads(os.environ.pop(JOB_ENV))
    try:
        services = open_warehouses(
            helper_store(),
            [Warehouse.in_helper(w) for w in found["warehouses"]],
            limits=Limits(**found["limits"]),
        )
        try:
            (service,) = (s for s in services if s.name == found["warehouse"])
            ident = Identifier.of(tuple(found["namespace"]), found["name"])
            (report,) = service.maintain(ident, [found["job"]], found["now_ms"], here=True)
        finally:
            services[0].close()
    except Exception as exc:
        log.exception("%s failed", found["job"])
        disk_full = isinstance(exc, InsufficientStorageError) or is_disk_full(exc)
        failed = _DISK_FULL if disk_full else type(exc).__name__
        message = "no room left on the warehouse's disk" if disk_full else _one_line(exc)
        print(json.dumps({"failed": failed, "message": message}), flush=True)
        return 1
    print(json.dumps(report.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
