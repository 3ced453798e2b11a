"""The process of one maintenance job (`python -m isbre.catalog.job_main`): bound to its server's
life, it opens the server's store and warehouses from its environment, runs the job, and prints
its report (or why it failed) as one line of JSON. catalog/job_process.py starts it."""

from __future__ import annotations

import json
import logging
import os

# Nothing heavier than the standard library before the process is bound to its server's life.
from isbre.catalog.job_process import DISK_FULL, JOB_ENV, PARENT_ENV
from isbre.catalog.processes import die_with_parent

log = logging.getLogger("isbre.catalog.job_main")  # by name: the module runs as __main__


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


def main() -> int:
    parent = os.environ.pop(PARENT_ENV, None)
    die_with_parent(expected_parent=int(parent) if parent else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.nice(10)
    # Imported once the process is bound to its server.
    from isbre.catalog.identifiers import Identifier
    from isbre.catalog.limits import Limits
    from isbre.catalog.store import InsufficientStorageError, is_disk_full
    from isbre.catalog.stores import helper_store
    from isbre.catalog.warehouse_config import Warehouse
    from isbre.catalog.warehouses import open_warehouses

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
            (report,) = service.maintenance.run(ident, [found["job"]], found["now_ms"], here=True)
        finally:
            services[0].close()
    except Exception as exc:
        log.exception("%s failed", found["job"])
        disk_full = isinstance(exc, InsufficientStorageError) or is_disk_full(exc)
        failed = DISK_FULL if disk_full else type(exc).__name__
        message = "no room left on the warehouse's disk" if disk_full else _one_line(exc)
        print(json.dumps({"failed": failed, "message": message}), flush=True)
        return 1
    print(json.dumps(report.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
