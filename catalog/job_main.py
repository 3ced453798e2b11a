"""The process of one maintenance job, forked from the jobs' forkserver (catalog/job_process.py):
bound to its server's life first, then it opens the server's store and warehouses, runs the job,
and sends its report (or why it failed) back as one JSON object."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
from multiprocessing.connection import Connection
from typing import Any

from isbre.catalog.forkserver import leave_the_forkserver
from isbre.catalog.identifiers import Identifier
from isbre.catalog.job_process import DISK_FULL, JOB_PROCESS_NAME
from isbre.catalog.limits import InsufficientStorageError, Limits, is_disk_full
from isbre.catalog.processes import die_with_parent, name_this_process
from isbre.catalog.warehouse_config import Warehouse
from isbre.catalog.warehouses import open_warehouses

log = logging.getLogger(__name__)


def run_job(
    store: str, found: dict[str, Any], environment: dict[str, str], directory: str | None, report: Connection
) -> None:
    """The job's process: its parent is the forkserver, which ends with the server that started
    it; the server's own pid is checked too, for a server killed while the job was forked. Then
    only `environment` is left of the server's environment, only absolute directories on the
    import path (the state directory it runs in never reaches it), and the job runs."""
    leave_the_forkserver()
    name_this_process(JOB_PROCESS_NAME)
    server = multiprocessing.parent_process()
    die_with_parent(server=server.pid if server is not None else None)
    os.environ.clear()
    os.environ.update(environment)
    sys.path[:] = [entry for entry in sys.path if os.path.isabs(entry)]
    if directory is not None:
        os.chdir(directory)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.nice(10)
    report.send_bytes(json.dumps(_outcome(store, found)).encode())


def _outcome(store: str, found: dict[str, Any]) -> dict[str, Any]:
    try:
        services = open_warehouses(
            store, [Warehouse.in_helper(w) for w in found["warehouses"]], limits=Limits(**found["limits"])
        )
        try:
            (service,) = (s for s in services if s.name == found["warehouse"])
            ident = Identifier.of(tuple(found["namespace"]), found["name"])
            (done,) = service.maintenance.run(ident, [found["job"]], found["now_ms"], here=True)
        finally:
            services[0].close()
    except Exception as exc:
        log.exception("%s failed", found["job"])
        disk_full = isinstance(exc, InsufficientStorageError) or is_disk_full(exc)
        failed = DISK_FULL if disk_full else type(exc).__name__
        message = "no room left on the warehouse's disk" if disk_full else _one_line(exc)
        return {"failed": failed, "message": message}
    return done.to_json()


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
