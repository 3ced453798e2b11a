"""Maintenance jobs that read and write data files, run in a process of their own, forked for the
job from the jobs' forkserver: a process of the server's that has imported the jobs' code
(catalog/job_main.py) once, started with the first job (catalog/forkserver.py).

Compaction reads and writes as many bytes as the files it rewrites. In a process that serves
requests that work would hold the interpreter lock against commits and loads; in its own process,
at a low scheduling priority, it competes only for the cores. It opens the server's store as any
other process of the server does and commits through its own writer: its commit is an ordinary
one, numbered and logged. The store, the warehouses' storage settings and the job reach it over
the forkserver's socket, never on a command line or in the environment; its report comes back on
a pipe. Forked, it starts in milliseconds, where a new interpreter importing PyArrow and PyIceberg
took 0.7 s of CPU on two cores.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from isbre.catalog.identifiers import Identifier
    from isbre.catalog.limits import Limits
    from isbre.catalog.maintenance import JobReport
    from isbre.catalog.warehouse_config import Warehouse

log = logging.getLogger(__name__)
# The jobs' code, which the jobs' forkserver imports before it forks any job.
JOB_MAIN = "isbre.catalog.job_main"
# The name a job's process goes by (`ps -o comm`, psutil's `name()`): its command line is the
# forkserver's.
JOB_PROCESS_NAME = "isbre-job"
# The answer of a job that failed for want of disk: the exception's kind.
DISK_FULL = "InsufficientStorageError"
_JOBS = multiprocessing.get_context("forkserver")
# What a job's process keeps of the server's environment: how to reach object storage
# (credentials, certificates, proxies), the locale and temporary files; nothing else.
_INHERITED = ("PATH", "HOME", "LANG", "TZ", "TMPDIR", "NO_PROXY", "HTTP_PROXY", "HTTPS_PROXY")
_INHERITED_PREFIXES = ("LC_", "AWS_", "PG", "SSL_CERT_", "REQUESTS_CA_BUNDLE")


class JobProcessError(RuntimeError):
    """The job's process failed or did not answer."""


def job_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in _INHERITED or k.startswith(_INHERITED_PREFIXES)}


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
        """Run `job` on the table in a new process and wait for its report. The process runs in
        the state directory, with only the environment it needs and an import path of absolute
        directories only (catalog/job_main.py)."""
        from isbre.catalog.limits import InsufficientStorageError, Limits
        from isbre.catalog.maintenance import JobReport

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
        place = str(directory) if directory.is_dir() else None
        _JOBS.set_forkserver_preload([JOB_MAIN])  # read when this process's forkserver starts
        reader, writer = _JOBS.Pipe(duplex=False)
        # Daemonic: a server that exits ends its running job (SIGTERM), as its end would anyway.
        process = _JOBS.Process(
            target=_job, args=(self.store, job_settings, job_environment(), place, writer), daemon=True
        )
        try:
            process.start()
        finally:
            writer.close()  # the job's copy is the only one left: its end is the report's end
        try:
            answer = _report(reader, process, self.timeout_s, f"{job} on {ident}") or {}
        finally:
            reader.close()
        if "job" in answer:  # it reported what it did (a kill after that changes none of it)
            return JobReport.from_json(answer)
        if answer.get("failed") == DISK_FULL:
            raise InsufficientStorageError(f"{job} on {ident}: {answer['message']}")
        said = answer.get("message") or f"the process ended ({process.exitcode}) without a report"
        raise JobProcessError(f"{job} on {ident} failed: {said}")


def _job(*args: Any) -> None:
    """In the job's process: `run_job` of catalog/job_main.py, named as `python -m` named it: the
    job opens the catalog whose maintenance starts it, a cycle an import here would close."""
    importlib.import_module(JOB_MAIN).run_job(*args)


def _report(reader: Connection, process: BaseProcess, timeout_s: float, what: str) -> dict[str, Any] | None:
    """The report the job's process sent, once it has ended; None where it ended without one."""
    if not reader.poll(timeout_s):
        process.kill()
        process.join()
        raise JobProcessError(f"{what} did not end within {timeout_s:g} s")
    try:
        sent = json.loads(reader.recv_bytes())
    except EOFError:
        sent = None
    process.join()
    return sent if isinstance(sent, dict) else None
