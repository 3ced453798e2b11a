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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from isbre.catalog.identifiers import Identifier
from isbre.catalog.maintenance import JobReport
from isbre.catalog.processes import die_with_parent
from isbre.catalog.stores import helper_environment, helper_store

if TYPE_CHECKING:
    from isbre.catalog.warehouses import Warehouse

log = logging.getLogger("isbre.catalog.job_process")  # by name: the module runs as __main__
JOB_ENV = "ISBRE_JOB"
# The last lines of a failed job's error output that its error message carries.
_ERROR_LINES = 5


class JobProcessError(RuntimeError):
    """The job's process failed or did not answer."""


@dataclass(frozen=True)
class JobProcesses:
    """How a server runs a job in a process of its own: the store it opens and its warehouses."""

    store: str
    warehouses: Sequence[Warehouse]
    timeout_s: float = 3600.0

    def run(self, warehouse: str, ident: Identifier, job: str, now_ms: int) -> JobReport:
        """Run `job` on the table in a new process and wait for its report."""
        job_settings = {
            "warehouses": [w.for_helper() for w in self.warehouses],
            "warehouse": warehouse,
            "namespace": list(ident.namespace),
            "name": ident.name,
            "job": job,
            "now_ms": now_ms,
        }
        try:
            done = subprocess.run(
                [sys.executable, "-m", "isbre.catalog.job_process"],
                env=helper_environment(self.store, **{JOB_ENV: json.dumps(job_settings)}),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise JobProcessError(f"{job} on {ident} did not end within {self.timeout_s:g} s") from exc
        if done.returncode != 0 or not done.stdout.strip():
            said = " | ".join(done.stderr.strip().splitlines()[-_ERROR_LINES:])
            raise JobProcessError(f"{job} on {ident} failed in its process ({done.returncode}): {said}")
        return JobReport.from_json(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.nice(10)
    # Imported once the process is a job's: this module is imported by every server.
    from isbre.catalog.warehouses import Warehouse, open_warehouses

    found = json.loads(os.environ.pop(JOB_ENV))
    services = open_warehouses(helper_store(), [Warehouse.in_helper(w) for w in found["warehouses"]])
    try:
        (service,) = (s for s in services if s.name == found["warehouse"])
        ident = Identifier.of(tuple(found["namespace"]), found["name"])
        (report,) = service.maintain(ident, [found["job"]], found["now_ms"], here=True)
    finally:
        services[0].close()
    print(json.dumps(report.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
