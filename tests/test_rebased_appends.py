"""Stale fast appends are made again on the branch's head by the catalog: with their client's
retries off, every attempt of N writer processes on one table is acknowledged, nothing is lost or
doubled, and what must still be refused is."""

from __future__ import annotations

import json
import multiprocessing
import re
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from multiprocessing.managers import SyncManager
from multiprocessing.pool import Pool
from pathlib import Path

import pytest
from isbre.catalog import append_rebase
from isbre.catalog.embedded import LmdbCatalog
from isbre.catalog.job_process import JOB_MAIN
from isbre.catalog.manifest_lists import first_row_id, read_manifests
from isbre.catalog.rebase import REBASED_FROM_PARENT
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import StringType

from tests.appenders import NO_CLIENT_RETRIES, ROWS, SCHEMA, V3Appender, append_batches, rows, tags
from tests.http_client import http
from tests.server import IsbreServer
from tests.waiting import eventually

WRITERS = 8
# The server in a process of its own, as `isbre serve` runs: its maintenance job processes then
# race the appends as they would in production (in the test process they lose more often).
SERVER_PROCESS = True


@pytest.fixture(scope="module")
def writers() -> Iterator[tuple[Pool, SyncManager]]:
    """Processes that write, started once for the module: each test's writers take one each.
    Forked from a forkserver that has imported them (this process's, which maintenance jobs of
    an in-process server may have started already, then importing the jobs' code only), not
    spawned as eight interpreters importing PyIceberg each."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([JOB_MAIN, "tests.appenders"])
    with context.Manager() as manager, context.Pool(WRITERS) as pool:
        yield pool, manager


def run_writers(
    writers: tuple[Pool, SyncManager],
    url: str,
    identifier: str,
    count: int,
    commits: int,
    v3: bool = False,
    until_replaced: int = 0,
) -> list[list[str]]:
    pool, manager = writers
    barrier = manager.Barrier(count)  # held until `count` writers wait: each runs in a process of its own
    started = [
        pool.apply_async(append_batches, (url, identifier, writer, commits, v3, barrier, until_replaced))
        for writer in range(count)
    ]
    return [result.get(timeout=600) for result in started]


def rebases(server: IsbreServer) -> Counter[str]:
    text = http.get(f"{server.url}/metrics").text
    return Counter(
        {
            m[1]: int(m[2])
            for m in re.finditer(r'^isbre_commit_rebases_total\{outcome="([^"]+)"\} (\d+)$', text, re.M)
        }
    )


def history(table: Table) -> list[Snapshot]:
    """The main branch's snapshots, oldest first."""
    found = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        found.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return found[::-1]


def batches_in(table: Table, snapshot_id: int) -> Counter[tuple[int, int]]:
    read = table.scan(snapshot_id=snapshot_id).to_arrow()
    return Counter(zip(read["writer"].to_pylist(), read["seq"].to_pylist(), strict=True))


def check_every_append_once(table: Table, acknowledged: set[tuple[int, int]]) -> list[Snapshot]:
    """Each acknowledged batch is one snapshot of the branch that reads the rows before it and its
    own ten; sequence numbers rise strictly. The branch's history, oldest first."""
    snapshots = history(table)
    own = [(int(s.summary["test.writer"]), int(s.summary["test.seq"])) for s in snapshots if s.summary]
    assert sorted(own) == sorted(acknowledged) and len(own) == len(snapshots)
    numbers = [s.sequence_number for s in snapshots]
    assert all(a < b for a, b in pairwise(numbers)), numbers
    before: Counter[tuple[int, int]] = Counter()
    for snapshot, batch in zip(snapshots, own, strict=True):
        now = batches_in(table, snapshot.snapshot_id)
        assert now - before == Counter({batch: ROWS}) and not before - now, f"snapshot {snapshot.snapshot_id}"
        before = now
    assert table.scan().to_arrow().num_rows == ROWS * len(acknowledged)
    return snapshots


def check_row_ids(table: Table) -> None:
    """v3: each snapshot's row ids follow the one before's, ten per append, from 0; the head's data
    manifests hold row-id ranges that are disjoint and together every id given."""
    snapshots = history(table)
    assert [s.first_row_id for s in snapshots] == [ROWS * i for i in range(len(snapshots))]
    assert {s.added_rows for s in snapshots} == {ROWS}
    assert table.metadata.next_row_id == ROWS * len(snapshots)
    current = table.current_snapshot()
    assert current is not None
    ranges = sorted(
        (first_row_id(m), first_row_id(m) + m.added_rows_count + m.existing_rows_count)  # type: ignore[operator]
        for m in read_manifests(PyArrowFileIO(), current.manifest_list, 3)
    )
    assert ranges[0][0] == 0 and ranges[-1][1] == ROWS * len(snapshots)
    assert all(a[1] == b[0] for a, b in pairwise(ranges)), ranges


def create(catalog: Catalog, identifier: str, v3: bool = False, **properties: str) -> Table:
    extra = {"format-version": "3"} if v3 else {}
    return catalog.create_table(identifier, SCHEMA, properties={**NO_CLIENT_RETRIES, **extra, **properties})


@pytest.mark.parametrize("v3", [False, True], ids=["v2", "v3"])
@pytest.mark.parametrize("count", [2, 4, 8])
def test_every_append_of_n_writer_processes_lands_with_client_retries_off(
    server: IsbreServer,
    rest_catalog: RestCatalog,
    namespace: str,
    writers: tuple[Pool, SyncManager],
    count: int,
    v3: bool,
) -> None:
    identifier = f"{namespace}.hot"
    create(rest_catalog, identifier, v3)
    before = rebases(server)
    commits = max(3, 12 // count)
    outcomes = run_writers(writers, server.url, identifier, count, commits, v3)
    assert [o for writer in outcomes for o in writer if o] == []
    table = rest_catalog.load_table(identifier)
    assert table.metadata.format_version == (3 if v3 else 2)
    snapshots = check_every_append_once(table, {(w, s) for w in range(count) for s in range(commits)})
    rebased = [s for s in snapshots if s.summary and REBASED_FROM_PARENT in s.summary.additional_properties]
    # All writers loaded one head before any appended: all first appends but one were stale.
    assert len(rebased) >= count - 1
    for snapshot in rebased:
        assert snapshot.summary is not None
        assert snapshot.summary[REBASED_FROM_PARENT] != str(snapshot.parent_snapshot_id)
    assert rebases(server)["committed"] - before["committed"] == len(rebased)
    if v3:
        check_row_ids(table)


def test_appends_land_while_the_catalog_compacts_the_table(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, writers: tuple[Pool, SyncManager]
) -> None:
    """Four writers append while the catalog's own compaction commits between them (each goes on
    until one of its appends has landed on the compaction's replace): every append lands once,
    and the replace lands between them."""
    identifier = f"{namespace}.compacted"
    create(
        rest_catalog,
        identifier,
        **{
            "isbre.maintenance.enabled": "true",
            "isbre.maintenance.compact.enabled": "true",
            "isbre.maintenance.compact.min-input-files": "4",
        },
    )
    outcomes = run_writers(writers, server.url, identifier, 4, 8, until_replaced=300)
    assert [o for writer in outcomes for o in writer if o] == []
    acknowledged = {(w, s) for w, attempts in enumerate(outcomes) for s in range(len(attempts))}
    table = rest_catalog.load_table(identifier)
    read = table.scan().to_arrow()
    assert Counter(zip(read["writer"].to_pylist(), read["seq"].to_pylist(), strict=True)) == Counter(
        {batch: ROWS for batch in acknowledged}
    )
    snapshots = history(table)
    operations = [s.summary.operation.value if s.summary else None for s in snapshots]
    last_append = len(operations) - 1 - operations[::-1].index("append")
    assert "replace" in operations and operations.index("replace") < last_append, operations
    appended = [s for s in snapshots if s.summary and s.summary.operation.value == "append"]
    assert sorted((int(s.summary["test.writer"]), int(s.summary["test.seq"])) for s in appended) == sorted(
        acknowledged
    )


def stale_pair(catalog: Catalog, identifier: str, **properties: str) -> tuple[Table, Table]:
    """Two views of one table, the second stale once the first has appended."""
    create(catalog, identifier, **properties)
    first = catalog.load_table(identifier)
    first.append(rows(0, 0), snapshot_properties=tags(0, 0))
    second = catalog.load_table(identifier)
    first = catalog.load_table(identifier)
    first.append(rows(0, 1), snapshot_properties=tags(0, 1))
    return first, second


def refused(server: IsbreServer, outcome: str, commit: object) -> None:
    before = rebases(server)
    with pytest.raises(CommitFailedException, match=r"branch main (has changed|was created concurrently)"):
        commit()  # type: ignore[operator]
    assert rebases(server)[outcome] - before[outcome] == 1


@pytest.mark.parametrize(
    "marker",
    [
        {"flink.max-committed-checkpoint-id": "7", "flink.job-id": "a1"},
        {"kafka.connect.offsets.control.group": '{"0": 12}'},
        {"kafka.connect.commit-id": "5d7c2b1e-58c5-4e3a-9d0b-3c1ab0d0f00d"},
    ],
    ids=["flink", "kafka-connect-offsets", "kafka-connect-commit"],
)
def test_an_exactly_once_committers_stale_append_is_refused(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, marker: dict[str, str]
) -> None:
    _, stale = stale_pair(rest_catalog, f"{namespace}.fenced")
    refused(server, "exactly-once-writer", lambda: stale.append(rows(1, 0), snapshot_properties=marker))
    stale.refresh()
    stale.append(rows(1, 0), snapshot_properties=marker)  # on the head it lands as ever


def test_stale_commits_that_are_no_fast_append_are_refused(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    merging = {"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"}
    _, stale = stale_pair(rest_catalog, f"{namespace}.merged", **merging)
    refused(server, "not-a-fast-append", lambda: stale.append(rows(1, 0)))

    _, stale = stale_pair(rest_catalog, f"{namespace}.overwritten")
    with pytest.raises(CommitFailedException, match="branch main has changed"):
        stale.overwrite(rows(1, 0))

    _, stale = stale_pair(rest_catalog, f"{namespace}.evolved")

    def evolve_and_append() -> None:
        with stale.transaction() as transaction:
            with transaction.update_schema() as schema:
                schema.add_column("note", StringType())
            transaction.append(rows(1, 0))

    refused(server, "not-a-fast-append", evolve_and_append)
    for name in ("merged", "overwritten", "evolved"):
        assert rest_catalog.load_table(f"{namespace}.{name}").scan().to_arrow().num_rows == 2 * ROWS


def test_a_table_turns_rebasing_off(server: IsbreServer, rest_catalog: RestCatalog, namespace: str) -> None:
    first, stale = stale_pair(rest_catalog, f"{namespace}.off", **{"isbre.commit.rebase-appends": "false"})
    refused(server, "turned-off", lambda: stale.append(rows(1, 0)))
    with first.transaction() as transaction:
        transaction.set_properties({"isbre.commit.rebase-appends": "true"})
    stale.append(rows(1, 0), snapshot_properties=tags(1, 0))
    table = rest_catalog.load_table(f"{namespace}.off")
    assert table.scan().to_arrow().num_rows == 3 * ROWS
    assert table.current_snapshot().summary[REBASED_FROM_PARENT] != str(
        table.current_snapshot().parent_snapshot_id
    )
    answer = http.post(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables/off",
        json={"updates": [{"action": "set-properties", "updates": {"isbre.commit.rebase-appends": "maybe"}}]},
    )
    assert answer.status_code == 400 and "isbre.commit.rebase-appends" in answer.text


def test_a_killed_server_loses_no_acknowledged_rebased_append(tmp_path: Path) -> None:
    """Eight writers append to one table, most of them stale, until the server is killed with
    SIGKILL; after a restart every acknowledged append is there once, and one in flight at most
    once. The namespace whose table defaults turn rebasing off refuses a stale append."""
    defaults = {"isbre.fenced": {"isbre.commit.rebase-appends": "false"}}
    env = {"ISBRE_TABLE_DEFAULTS": json.dumps(defaults)}
    server = IsbreServer(tmp_path / "warehouse", env=env).start()
    catalog = RestCatalog("isbre", uri=server.url)
    for name in ("hot", "fenced"):
        catalog.create_namespace(name)
    create(catalog, "hot.t")
    acknowledged: list[tuple[int, int]] = []
    stop = threading.Event()

    def write(writer: int) -> None:
        table = RestCatalog(f"w{writer}", uri=server.url).load_table("hot.t")
        for seq in range(1000):
            if stop.is_set():
                return
            try:
                table.append(rows(writer, seq), snapshot_properties=tags(writer, seq))
            except Exception:
                return  # the server went away with this append in flight: it may or may not have landed
            acknowledged.append((writer, seq))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: len(acknowledged) >= 40, "40 acknowledged appends", timeout=120)
        server.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        server.process.wait()  # type: ignore[union-attr]
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        landed = list(acknowledged)
        server = IsbreServer(tmp_path / "warehouse", port=server.port, env=env).start()
        catalog = RestCatalog("isbre", uri=server.url)
        table = catalog.load_table("hot.t")
        found = batches_in(table, table.current_snapshot().snapshot_id)  # type: ignore[union-attr]
        assert set(landed) <= set(found) and set(found.values()) == {ROWS}
        assert len(found) - len(landed) <= WRITERS  # each writer had one append in flight at most
        assert any(
            s.summary and REBASED_FROM_PARENT in s.summary.additional_properties for s in table.snapshots()
        )

        create(catalog, "fenced.t")
        fenced, stale = catalog.load_table("fenced.t"), catalog.load_table("fenced.t")
        fenced.append(rows(0, 0))
        refused(server, "turned-off", lambda: stale.append(rows(1, 0)))
    finally:
        stop.set()
        server.stop()


def test_a_sinks_stale_append_is_rebased_unless_its_offsets_are_held(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    """A sink's commit declares the source offsets it carries: made again on the head only when
    the table holds none of them yet, so that its writer, refused, re-reads the coverage and
    drops what landed (exactly once)."""

    def spans(start: int, end: int) -> dict[str, str]:
        span = {"source-id": "s", "topic": "t", "partition": 0, "start": start, "end": end}
        return {"isbre.sink.spans": json.dumps([span])}

    first, stale = stale_pair(rest_catalog, f"{namespace}.sunk")
    first.append(rows(0, 2), snapshot_properties=spans(0, 10))
    refused(
        server, "offsets-already-held", lambda: stale.append(rows(1, 0), snapshot_properties=spans(5, 15))
    )
    stale.append(rows(1, 0), snapshot_properties=spans(10, 20))  # none held yet: rebased
    coverage = http.get(f"{server.url}/v1/isbre/namespaces/{namespace}/tables/sunk/coverage").json()
    assert coverage["coverage"][0]["ranges"] == [[0, 20]]


def test_a_rebase_that_keeps_losing_gives_up_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound on how often one commit is made again, at 0 here: the stale append is refused
    at once, and the refusal says that the catalog gave up."""
    monkeypatch.setattr(append_rebase, "MAX_REBASES", 0)
    catalog = LmdbCatalog("local", warehouse=str(tmp_path / "warehouse"))
    catalog.create_namespace("n")
    _, stale = stale_pair(catalog, "n.t")
    with pytest.raises(CommitFailedException, match="made the append again on the new head of main 0 times"):
        stale.append(rows(1, 0))
    assert catalog.service.tables.rebase.outcomes["gave-up"] == 1


def test_a_table_whose_codec_isbre_cannot_write_keeps_the_refusal(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    """The manifest list's codec is the table's property, which its writers set to anything: a
    stale append on a table naming no codec isbre writes is refused as before, not failed."""
    identifier = f"{namespace}.odd"
    create(rest_catalog, identifier, v3=True, **{"write.avro.compression-codec": "bogus"})
    first, stale = V3Appender(server.url, identifier), V3Appender(server.url, identifier)
    first.append(rows(0, 0), tags(0, 0))
    refused(server, "not-a-fast-append", lambda: stale.append(rows(1, 0), tags(1, 0)))


@pytest.mark.parametrize("spelling", ["other table", "dot-dot"])
def test_a_stale_append_naming_a_manifest_outside_its_table_is_not_rebased(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str, spelling: str
) -> None:
    """The catalog writes the manifests a rebased append added into a list of its own: each must be
    the table's file. One in another table's folder, however spelled, keeps the stale append's
    409, and no list the catalog writes names it."""
    identifier = f"{namespace}.mine"
    create(rest_catalog, identifier, v3=True)
    other = create(rest_catalog, f"{namespace}.theirs", v3=True)
    location = rest_catalog.load_table(identifier).metadata.location
    theirs = f"{other.metadata.location}/metadata"
    if spelling == "dot-dot":
        theirs = f"{location}/metadata/../../{other.metadata.location.rsplit('/', 1)[1]}/metadata"
    first, stale = V3Appender(server.url, identifier), V3Appender(server.url, identifier)
    first.append(rows(0, 0), tags(0, 0))
    refused(server, "not-a-fast-append", lambda: stale.append(rows(1, 0), tags(1, 0), manifests_at=theirs))
    table = rest_catalog.load_table(identifier)
    assert len(table.snapshots()) == 1 and table.scan().to_arrow().num_rows == ROWS


def test_a_stale_append_whose_entries_are_not_what_its_list_says_is_not_rebased(
    server: IsbreServer, rest_catalog: RestCatalog, namespace: str
) -> None:
    """The rebase trusts the entries, not the counters a writer put in its list: a manifest holding
    an EXISTING entry with a sequence number of its own, listed as one ADDED file, keeps the stale
    append's 409, and the table reads what it held before."""
    identifier = f"{namespace}.disguised"
    create(rest_catalog, identifier, v3=True)
    first, stale = V3Appender(server.url, identifier), V3Appender(server.url, identifier)
    first.append(rows(0, 0), tags(0, 0))
    refused(server, "not-a-fast-append", lambda: stale.append(rows(1, 0), tags(1, 0), disguised=True))
    table = rest_catalog.load_table(identifier)
    assert len(table.snapshots()) == 1 and table.scan().to_arrow().num_rows == ROWS
    stale.metadata = V3Appender(server.url, identifier).metadata
    stale.append(rows(1, 0), tags(1, 0))  # the same append written plainly is made on the head
