"""Server CPU per operation: what isbre's server process spends on a set-properties commit, on an
add-snapshot commit to a table with 10 and with 1,000 snapshots, and on a loadTable, beside what
PyIceberg's SqlCatalog (SQLite) spends on the same operations, and isbre on PostgreSQL beside
isbre on LMDB.

Clients run in processes of their own (tests/bench/workers.py), WRITERS writers on a table each.
For isbre the figure is the CPU time of the server's process tree divided by the operations; for
SqlCatalog, a library, it is the CPU time of the processes that call it, which do the catalog's
whole work. Tables with history are registered from a metadata file written here, so that both
catalogs start from the same history; its snapshots name manifest lists that nothing opens (a
catalog never reads them).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path

import httpx
import psutil
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotLogEntry, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate, TableUpdate

from tests.bench.commits import SCHEMA, SCHEMA_JSON
from tests.bench.harness import RUNS, Report, cpu_seconds
from tests.bench.workers import ClientRun, _isbre_writers, _sql_writers, _threads, in_processes
from tests.postgres import PostgresServer
from tests.server import IsbreServer

WRITERS = 4
CLIENT_PROCESSES = 2
COMMITS = 100  # per writer and run
LOADS = 400  # per client and run
HISTORIES = (10, 1000)
JSON = {"Content-Type": "application/json"}


def _snapshot(snapshot_id: int, sequence: int, location: str) -> Snapshot:
    """An append's snapshot, with the summary PyIceberg writes for one 100-row file."""
    totals = {
        "total-records": 100 * sequence,
        "total-files-size": 1200 * sequence,
        "total-data-files": sequence,
    }
    summary = Summary(
        Operation.APPEND,
        **{"added-data-files": "1", "added-records": "100", "added-files-size": "1200"},
        **{"changed-partition-count": "1", **{k: str(v) for k, v in totals.items()}},
        **{"total-delete-files": "0", "total-position-deletes": "0", "total-equality-deletes": "0"},
    )
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=snapshot_id - 1 if snapshot_id > 1 else None,
        sequence_number=sequence,
        timestamp_ms=int(time.time() * 1000),  # as a writer stamps it: now
        manifest_list=f"{location}/metadata/snap-{snapshot_id}-1-{uuid.uuid4()}.avro",
        summary=summary,
        schema_id=0,
    )


def _history(location: str, snapshots: int) -> TableMetadata:
    """Metadata of a table at `location` whose main branch went through `snapshots` appends."""
    metadata = new_table_metadata(SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, location, {})
    history = [_snapshot(n, n, location) for n in range(1, snapshots + 1)]
    log = [SnapshotLogEntry(snapshot_id=s.snapshot_id, timestamp_ms=s.timestamp_ms) for s in history]
    main = SnapshotRef(snapshot_id=snapshots, snapshot_ref_type=SnapshotRefType.BRANCH)
    return metadata.model_copy(
        update={
            "snapshots": history,
            "snapshot_log": log,
            "current_snapshot_id": snapshots,
            "last_sequence_number": snapshots,
            "refs": {"main": main},
        }
    )


def write_tables(root: Path, snapshots: int) -> list[str]:
    """WRITERS table directories under `root`, each with a metadata file of `snapshots` snapshots;
    the files' locations."""
    locations = []
    for _ in range(WRITERS):
        table = root / f"t{uuid.uuid4().hex[:12]}"
        (table / "metadata").mkdir(parents=True)
        file = table / "metadata" / f"00000-{uuid.uuid4()}.metadata.json"
        file.write_text(_history(f"file://{table}", snapshots).model_dump_json(exclude_none=True))
        locations.append(f"file://{file}")
    return locations


def _append(
    metadata: TableMetadata | dict[str, object],
) -> tuple[AssertRefSnapshotId, tuple[TableUpdate, ...]]:
    """The requirement and updates of one more append on a table whose main is its newest snapshot."""
    if isinstance(metadata, dict):
        parent, sequence = metadata["current-snapshot-id"], metadata["last-sequence-number"]
        location = metadata["location"]
    else:
        parent, sequence, location = (
            metadata.current_snapshot_id,
            metadata.last_sequence_number,
            metadata.location,
        )
    assert isinstance(parent, int) and isinstance(sequence, int) and isinstance(location, str)
    snapshot = _snapshot(parent + 1, sequence + 1, location)
    ref = SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=parent + 1)
    return AssertRefSnapshotId(ref="main", snapshot_id=parent), (AddSnapshotUpdate(snapshot=snapshot), ref)


def _isbre_appends(urls: list[str], commits: int, tables: list[str], start: Barrier) -> None:
    def work(table: str) -> None:
        base = f"{urls[0]}/v1/isbre/namespaces/bench/tables/{table}"
        with httpx.Client(timeout=120) as client:
            metadata = client.get(base).json()["metadata"]
            for _ in range(commits):
                requirement, updates = _append(metadata)
                requirements = requirement.model_dump_json()
                changes = ",".join(u.model_dump_json(exclude_none=True) for u in updates)
                body = f'{{"requirements":[{requirements}],"updates":[{changes}]}}'
                response = client.post(base, content=body, headers=JSON)
                response.raise_for_status()
                metadata = response.json()["metadata"]

    _threads(work, tables, start)


def _sql_appends(uri: str, warehouse: str, commits: int, tables: list[str], start: Barrier) -> None:
    catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
    loaded = {table: catalog.load_table(("bench", table)) for table in tables}

    def work(name: str) -> None:
        table = loaded[name]
        for _ in range(commits):
            requirement, updates = _append(table.metadata)
            response = catalog.commit_table(table, (requirement,), updates)
            table.metadata, table.metadata_location = response.metadata, response.metadata_location

    _threads(work, tables, start)


def _isbre_loads(urls: list[str], requests: int, tables: list[str], start: Barrier) -> None:
    def work(table: str) -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(requests):
                client.get(f"{urls[0]}/v1/isbre/namespaces/bench/tables/{table}").raise_for_status()

    _threads(work, tables, start)


def _sql_loads(uri: str, warehouse: str, requests: int, tables: list[str], start: Barrier) -> None:
    catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)

    def work(table: str) -> None:
        for _ in range(requests):
            catalog.load_table(("bench", table))

    _threads(work, tables, start)


def _groups(tables: list[str]) -> list[list[str]]:
    return [tables[i::CLIENT_PROCESSES] for i in range(CLIENT_PROCESSES)]


class Isbre:
    """One isbre server and the tables of a run on it."""

    def __init__(self, server: IsbreServer) -> None:
        self.server = server
        self.process = psutil.Process(server.process.pid) if server.process else None

    def tables(self, snapshots: int) -> list[str]:
        client = httpx.Client(base_url=f"{self.server.url}/v1/isbre/namespaces/bench", timeout=60)
        run = uuid.uuid4().hex[:8]
        names = [f"i{run}_{w}" for w in range(WRITERS)]  # _isbre_writers reads the writer's number
        with client:
            if snapshots == 0:
                bodies = [{"name": name, "schema": SCHEMA_JSON} for name in names]
                for body in bodies:
                    client.post("/tables", json=body).raise_for_status()
            else:
                warehouse = Path(self.server.warehouse) / "bench-history"
                for name, location in zip(names, write_tables(warehouse, snapshots), strict=True):
                    body = {"name": name, "metadata-location": location}
                    client.post("/register", json=body).raise_for_status()
        return names

    def measure(self, target: Callable[..., None], tables: list[str], count: int) -> float:
        assert self.process is not None
        before = cpu_seconds(self.process)
        in_processes(target, _groups(tables), [self.server.url], count)
        return (cpu_seconds(self.process) - before) * 1000 / (len(tables) * count)


class Sql:
    """PyIceberg's SqlCatalog on SQLite, its tables and what its calling processes spend."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.directory = directory
        self.uri, self.warehouse = f"sqlite:///{directory / 'catalog.db'}", directory.as_uri()
        self.catalog = SqlCatalog("bench", uri=self.uri, warehouse=self.warehouse)
        self.catalog.create_namespace("bench")

    def tables(self, snapshots: int) -> list[str]:
        names = [f"s{uuid.uuid4().hex[:12]}" for _ in range(WRITERS)]
        if snapshots == 0:
            for name in names:
                self.catalog.create_table(("bench", name), schema=SCHEMA)
        else:
            for name, location in zip(names, write_tables(self.directory, snapshots), strict=True):
                self.catalog.register_table(("bench", name), location)
        return names

    def measure(self, target: Callable[..., None], tables: list[str], count: int) -> float:
        run: ClientRun = in_processes(target, _groups(tables), self.uri, self.warehouse, count)
        return run.cpu_seconds * 1000 / (len(tables) * count)


def _median(catalog: Isbre | Sql, target: Callable[..., None], snapshots: int, count: int) -> float:
    return statistics.median(catalog.measure(target, catalog.tables(snapshots), count) for _ in range(RUNS))


def run(workdir: Path) -> Report:
    report = Report(
        f"Server CPU per operation, milliseconds ({WRITERS} writers on a table each, clients in "
        f"{CLIENT_PROCESSES} processes), median of {RUNS} runs; SqlCatalog's is its calling processes' CPU",
        [
            "operation",
            "isbre LMDB",
            "isbre PostgreSQL",
            "SqlCatalog (SQLite)",
            "LMDB / SqlCatalog",
            "PostgreSQL / LMDB",
        ],
    )
    database = PostgresServer.start()
    lmdb_server = IsbreServer(workdir / "cpu-lmdb")
    postgres_server = IsbreServer(workdir / "cpu-postgres", store=database.database("isbre_cpu"))
    try:
        lmdb, postgres = (Isbre(s.start()) for s in (lmdb_server, postgres_server))
        for isbre in (lmdb, postgres):
            httpx.post(
                f"{isbre.server.url}/v1/isbre/namespaces", json={"namespace": ["bench"]}
            ).raise_for_status()
        sql = Sql(workdir / "cpu-sql")
        cases = [
            ("set-properties", _isbre_writers, _sql_writers, 0, COMMITS),
            *(
                (f"add-snapshot at {n:,} snapshots", _isbre_appends, _sql_appends, n, COMMITS)
                for n in HISTORIES
            ),
            ("loadTable (10 snapshots)", _isbre_loads, _sql_loads, 10, LOADS),
        ]
        at: dict[int, float] = {}
        for name, isbre_target, sql_target, snapshots, count in cases:
            on_lmdb = _median(lmdb, isbre_target, snapshots, count)
            on_postgres = _median(postgres, isbre_target, snapshots, count)
            peer = _median(sql, sql_target, snapshots, count)
            report.add(
                name, on_lmdb, on_postgres, peer, f"{on_lmdb / peer:.2f}", f"{on_postgres / on_lmdb:.2f}"
            )
            if isbre_target is _isbre_appends:
                at[snapshots] = on_lmdb
        low, high = HISTORIES
        report.add(f"add-snapshot, {high:,} / {low:,} snapshots", f"{at[high] / at[low]:.2f}", "", "", "", "")
    finally:
        lmdb_server.stop()
        postgres_server.stop()
        database.stop()
    return report
