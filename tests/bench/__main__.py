"""`make bench`: isbre's figures side by side with a peer measured in the same run."""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path

from tests.bench import (
    commits,
    events,
    lineage,
    load_table,
    object_storage,
    replicas,
    signing,
    sinks,
    workers,
)


def main() -> None:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"# isbre benchmarks on {machine}", end="\n\n")
    with tempfile.TemporaryDirectory(prefix="isbre-bench-") as workdir:
        reports = [
            commits.run(Path(workdir)),
            object_storage.run(Path(workdir)),
            signing.run(Path(workdir)),
            load_table.run(Path(workdir)),
            *workers.run(Path(workdir)),
            *replicas.run(Path(workdir)),
            *events.run(Path(workdir)),
            lineage.run(Path(workdir)),
            *sinks.run(Path(workdir)),
        ]
    print()
    for report in reports:
        print(report.markdown(), end="\n\n")


if __name__ == "__main__":
    main()
