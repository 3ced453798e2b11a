"""What a table's writer can make the server do, through the table's properties, manifests and
metadata alone: nothing outside the table, and no code it names."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow as pa
import pytest
from isbre.catalog import TableChange
from isbre.catalog.file_uris import local_path
from isbre.catalog.job_process import JobProcesses
from isbre.catalog.store import CommitStateUnknownError, StoreUnavailableError
from isbre.catalog.warehouse_config import Warehouse, default_store
from isbre.catalog.warehouses import open_warehouses
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import SetPropertiesUpdate
from pyiceberg.types import LongType, NestedField

from tests.commit_dropping_proxy import CommitDroppingProxy
from tests.crafted import crafted_snapshot
from tests.disks import fill
from tests.http_client import http
from tests.postgres import PostgresServer
from tests.row_deltas import commit_deletes, position_deletes
from tests.server import InProcessServer, IsbreServer, job_process
from tests.waiting import eventually

COMPACTING = {
    "isbre.maintenance.compact.enabled": "true",
    "isbre.maintenance.compact.min-input-files": "2",
    "isbre.maintenance.compact.target-file-size-bytes": str(64 << 20),
}


@pytest.fixture(scope="module")
def trusted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    server = InProcessServer(tmp_path_factory.mktemp("trust") / "warehouse").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def catalog(trusted: IsbreServer) -> RestCatalog:
    catalog = RestCatalog("isbre", uri=trusted.url)
    for namespace in ("a", "b"):
        catalog.create_namespace(namespace)
    return catalog


def url(server: IsbreServer, name: str, namespace: str = "a") -> str:
    return f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}"


def numbers(start: int) -> pa.Table:
    return pa.table({"n": pa.array([start, start + 1], pa.int64())})


def new_table(catalog: RestCatalog, name: str, properties: dict[str, str] | None = None) -> Table:
    table = catalog.create_table(name, schema=numbers(0).schema, properties=properties or {})
    for i in range(3):
        table.append(numbers(1000 * i))
    return table.refresh()


def secrets(catalog: RestCatalog) -> Table:
    """Another namespace's table with rows, whichever test asks first."""
    if catalog.table_exists("b.secrets"):
        return catalog.load_table("b.secrets")
    return new_table(catalog, "b.secrets")


def set_properties(server: IsbreServer, name: str, updates: dict[str, str]) -> Any:
    body = {"updates": [{"action": "set-properties", "updates": updates}]}
    return http.post(url(server, name), json=body)


# -- 1. no code named by a table


@pytest.mark.parametrize(
    "key",
    [
        "write.py-location-provider.impl",
        "py-io-impl",
        "io-impl",
        "write.location-provider.impl",
        "s3.retry-strategy-impl",
        "PY-IO-IMPL",
    ],
)
def test_a_property_naming_code_is_refused_naming_it(
    trusted: IsbreServer, catalog: RestCatalog, key: str
) -> None:
    name = f"code_{uuid.uuid4().hex[:8]}"
    catalog.create_table(f"a.{name}", schema=numbers(0).schema)
    refused = set_properties(trusted, name, {key: "canary.Provider"})
    assert refused.status_code == 400 and key in refused.json()["error"]["message"], refused.text
    assert key not in catalog.load_table(f"a.{name}").properties
    created = http.post(
        f"{trusted.url}/v1/isbre/namespaces/a/tables",
        json={"name": f"{name}_new", "schema": {"type": "struct", "fields": []}, "properties": {key: "x.Y"}},
    )
    assert created.status_code == 400 and key in created.text
    assert http.head(url(trusted, f"{name}_new")).status_code == 404


CANARY = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")


class Provider:
    def __init__(self, *args, **kwargs):
        pathlib.Path({marker!r}).write_text("called")
"""


def test_a_job_never_imports_a_module_a_stored_property_names(tmp_path: Path) -> None:
    """The probe as an attacker made it: a module in the table's own data directory (and in the job's
    working directory), named by `write.py-location-provider.impl` and `py-io-impl` in metadata
    stored before such properties were refused. The compaction job runs, and never imports it."""
    from isbre.catalog.embedded import LmdbCatalog

    warehouse = tmp_path / "warehouse"
    embedded = LmdbCatalog("local", warehouse=str(warehouse))
    embedded.create_namespace("a")
    table = embedded.create_table("a.t", schema=numbers(0).schema, properties=COMPACTING)
    for i in range(4):
        table.append(numbers(10 * i))
    table = table.refresh()
    data = local_path(table.location())
    assert data is not None
    marker = tmp_path / "canary-ran"
    module = f"isbre_canary_{uuid.uuid4().hex[:8]}"
    for directory in (data / "data", tmp_path):
        (directory / f"{module}.py").write_text(CANARY.format(marker=str(marker)))
    # Stored as an older server stored it: in the current metadata file itself.
    current = local_path(table.metadata_location)
    assert current is not None
    found = json.loads(current.read_text())
    found["properties"] |= {
        "write.py-location-provider.impl": f"{module}.Provider",
        "py-io-impl": f"{module}.IO",
    }
    current.write_text(json.dumps(found))
    embedded.service.close()

    store = Warehouse("local", str(warehouse))
    jobs = JobProcesses(str(default_store(store)), [store], directory=tmp_path)
    report = jobs.run("local", _ident("a", "t"), "compact-data-files", int(time.time() * 1000))
    assert report.committed and report.rewritten_files == 4, report
    assert not marker.exists(), marker.read_text()
    assert module not in sys.modules


def _ident(namespace: str, name: str) -> Any:
    from isbre.catalog.identifiers import Identifier

    return Identifier.of((namespace,), name)


# -- 2. a server job reads, writes and deletes only inside the table


def test_a_manifest_naming_another_namespace_s_file_is_never_read_by_compaction(
    trusted: IsbreServer, catalog: RestCatalog
) -> None:
    other = secrets(catalog)
    secret_files = [task.file.file_path for task in other.scan().plan_files()]
    mine = catalog.create_table("a.thief", schema=numbers(0).schema, properties=COMPACTING)
    mine.append(numbers(0))
    mine = mine.refresh()
    root = local_path(mine.location())
    assert root is not None
    manifest = f"{mine.location()}/metadata/stolen-m0.avro"
    updates = crafted_snapshot(
        mine.metadata, f"{mine.location()}/metadata/snap-stolen.avro", [(manifest, secret_files)]
    )
    committed = http.post(url(trusted, "thief"), json={"updates": updates})
    assert committed.status_code == 200, committed.text  # data files are the engines' to name
    before = {p for p in (root / "data").iterdir()}

    answer = http.post(
        f"{url(trusted, 'thief')}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    (job,) = answer.json()["jobs"]
    assert not job["committed"] and set(job["foreign-paths"]) & set(secret_files), job
    assert {p for p in (root / "data").iterdir()} == before  # nothing written, so no row copied
    health = http.get(f"{trusted.url}/health").json()["components"]["maintenance"]
    assert health["status"] == "degraded" and any("a.thief" in why for why in health["failing"]), health
    metrics = http.get(f"{trusted.url}/metrics").text
    assert "isbre_maintenance_foreign_paths_total 0" not in metrics
    assert catalog.load_table("b.secrets").scan().to_arrow().num_rows == 6
    # A table dropped is no longer degraded: /health forgets it.
    assert http.delete(url(trusted, "thief")).status_code == 204

    def forgotten() -> bool:
        health = http.get(f"{trusted.url}/health").json()["components"]["maintenance"]
        return not any("a.thief" in why for why in health.get("failing", []))

    eventually(forgotten, "/health still names the dropped table")


def test_a_delete_file_that_is_another_namespace_s_file_is_never_read_by_compaction(
    trusted: IsbreServer, catalog: RestCatalog
) -> None:
    """Compaction reads a file with the deletes that apply to it: a delete file a commit named in
    another table's place stops the job before any file is read, as a data file there does."""
    other = secrets(catalog)
    stolen = next(task.file.file_path for task in other.scan().plan_files())
    mine = new_table(catalog, "a.deleter", COMPACTING)
    target = next(task.file for task in mine.scan().plan_files())
    made = position_deletes(mine, target, [0])
    # A position delete file that is another table's data file; its bounds name this table's file.
    deletes = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=stolen,
        file_format=FileFormat.PARQUET,
        partition=made.partition,
        record_count=1,
        file_size_in_bytes=made.file_size_in_bytes,
        lower_bounds=made.lower_bounds,
        upper_bounds=made.upper_bounds,
    )
    deletes.spec_id = made.spec_id
    commit_deletes(mine, [deletes])
    root = local_path(mine.location())
    assert root is not None
    before = {p for p in (root / "data").iterdir()}
    answer = http.post(
        f"{url(trusted, 'deleter')}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    (job,) = answer.json()["jobs"]
    assert not job["committed"] and stolen in job["foreign-paths"], job
    assert {p for p in (root / "data").iterdir()} == before  # nothing written
    assert catalog.load_table("b.secrets").scan().to_arrow().num_rows == 6
    assert http.delete(url(trusted, "deleter")).status_code == 204


def test_a_manifest_list_outside_the_table_is_refused_at_commit(
    trusted: IsbreServer, catalog: RestCatalog
) -> None:
    table = catalog.create_table("a.lister", schema=numbers(0).schema)
    for manifest_list in (
        "file:///etc/passwd",
        f"{secrets(catalog).location()}/metadata/x.avro",
    ):
        updates = crafted_snapshot(
            table.metadata, manifest_list, [], write_list_at=f"{table.location()}/metadata/l.avro"
        )
        refused = http.post(url(trusted, "lister"), json={"updates": updates})
        assert refused.status_code == 400 and "outside the table" in refused.text, refused.text


# -- 3. every location property is confined


@pytest.mark.parametrize(
    "key",
    ["write.data.path", "write.object-storage.path", "write.folder-storage.path", "write.metadata.path"],
)
def test_location_properties_stay_inside_the_table_or_an_allowed_place(
    trusted: IsbreServer, catalog: RestCatalog, tmp_path: Path, key: str
) -> None:
    name = f"placed_{uuid.uuid4().hex[:8]}"
    table = catalog.create_table(f"a.{name}", schema=numbers(0).schema)
    other = secrets(catalog).location()
    hostile = (f"{table.location()}/../{name}_out", f"{table.location()}/%2e%2e/x", f"{table.location()}/a;b")
    for place in (tmp_path.as_uri(), f"{other}/data", other, "file:///etc", *hostile):
        refused = set_properties(trusted, name, {key: place})
        assert refused.status_code == 400 and key in refused.json()["error"]["message"], (place, refused.text)
    inside = f"{table.location()}/elsewhere"
    assert set_properties(trusted, name, {key: inside}).status_code == 200
    # And another table may not move into it.
    squatter = catalog.create_table(f"a.{name}_2", schema=numbers(0).schema)
    moved = http.post(
        url(trusted, f"{name}_2"), json={"updates": [{"action": "set-location", "location": inside}]}
    )
    assert moved.status_code == 400, moved.text
    assert squatter.refresh().location() != inside


def test_compaction_writes_where_write_data_path_says_inside_the_table(
    trusted: IsbreServer, catalog: RestCatalog
) -> None:
    table = new_table(catalog, "a.aimed", COMPACTING)
    aimed = f"{table.location()}/aimed"
    assert set_properties(trusted, "aimed", {"write.data.path": aimed}).status_code == 200
    answer = http.post(
        f"{url(trusted, 'aimed')}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=60
    )
    (job,) = answer.json()["jobs"]
    assert job["committed"], job
    files = [task.file.file_path for task in table.refresh().scan().plan_files()]
    assert len(files) == 1 and files[0].startswith(aimed + "/")


# -- 7. ETags that change when the answer does


def test_an_etag_is_matched_whole_and_changes_with_every_part_of_the_answer(
    trusted: IsbreServer, catalog: RestCatalog
) -> None:
    from isbre.rest.table_routes import etag, not_modified

    table = catalog.create_table("a.tagged", schema=numbers(0).schema)
    first = http.get(url(trusted, "tagged"))
    tag = first.headers["etag"]
    assert http.get(url(trusted, "tagged"), headers={"If-None-Match": tag}).status_code == 304
    assert http.get(url(trusted, "tagged"), headers={"If-None-Match": f'W/{tag}, "x"'}).status_code == 304
    for near in (tag[:-2] + '"', '"x' + tag[1:], f"{tag[:-1]}0{tag[-1]}", tag.strip('"')):
        assert http.get(url(trusted, "tagged"), headers={"If-None-Match": near}).status_code == 200, near
    refs = http.get(url(trusted, "tagged"), params={"snapshots": "refs"})
    assert refs.headers["etag"] != tag
    table.append(numbers(0))
    assert http.get(url(trusted, "tagged"), headers={"If-None-Match": tag}).status_code == 200
    base = ("file:///m/00001.metadata.json", "all", {"s3.endpoint": "http://a"})
    variants = [
        ("file:///m/00002.metadata.json", "all", {"s3.endpoint": "http://a"}),
        (base[0], "refs", base[2]),
        (base[0], base[1], {"s3.endpoint": "http://b"}),
        (base[0], base[1], {"s3.endpoint": "http://a", "s3.path-style-access": "true"}),
        (base[0], base[1], None),
    ]
    tags = {etag(*base)} | {etag(*variant) for variant in variants}
    assert len(tags) == 1 + len(variants)
    assert not not_modified(None, etag(*base)) and not_modified("*", etag(*base))


# -- 5. job failures look like commit failures


def test_compaction_on_a_full_disk_answers_507_in_one_line_and_leaves_no_partial_file(
    small_disk: Path,
) -> None:
    warehouse = small_disk / "warehouse"
    server = InProcessServer(warehouse, env={"ISBRE_MIN_FREE_DISK_MB": "0"})
    server.log_path = small_disk.parent / "full-disk-server.log"  # the log must not fill the disk
    server.start()
    try:
        catalog = RestCatalog("isbre", uri=server.url)
        catalog.create_namespace("a")
        table = new_table(catalog, "a.full", COMPACTING)
        data = local_path(table.location())
        assert data is not None
        before = set((data / "data").iterdir())
        fill(small_disk / "filler")
        answer = http.post(
            f"{url(server, 'full')}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=60
        )
        assert answer.status_code == 507, answer.text
        error = answer.json()["error"]
        assert error["type"] == "InsufficientStorageException" and "\n" not in error["message"], error
        assert "Traceback" not in error["message"] and "compact-data-files" in error["message"]
        assert set((data / "data").iterdir()) == before  # the job removed what it had begun
        (small_disk / "filler").unlink()
        again = http.post(
            f"{url(server, 'full')}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=60
        )
        assert again.status_code == 200 and again.json()["jobs"][0]["committed"], again.text
        assert sorted(catalog.load_table("a.full").scan().to_arrow()["n"].to_pylist()) == [
            0,
            1,
            1000,
            1001,
            2000,
            2001,
        ]
    finally:
        server.stop()


def test_a_job_process_whose_server_is_already_gone_ends_before_doing_anything(tmp_path: Path) -> None:
    """The job's process is told which server it works for (its parent is the jobs' forkserver,
    which ends with the server): if the server is gone by the time the process has asked the
    kernel for the parent-death signal (a server killed during the job's start), it ends there,
    before its next statement."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    marker = tmp_path / "went-on"
    script = (
        "from isbre.catalog.processes import die_with_parent\n"
        f"die_with_parent(server={gone.pid})\n"
        f"open({str(marker)!r}, 'w').write('went on')\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script], timeout=60)
    assert done.returncode == -signal.SIGTERM and not marker.exists()


def test_kill_9_of_the_server_ends_its_job_process_and_commits_nothing(tmp_path: Path) -> None:
    """The job's process, held still as it starts, its server killed meanwhile: once it may run
    again it ends before committing anything (it starts in milliseconds, forked: without being
    held it could finish a small compaction before the kill reached the server)."""
    server = IsbreServer(tmp_path / "warehouse").start()
    catalog = RestCatalog("isbre", uri=server.url)
    catalog.create_namespace("a")
    table = new_table(catalog, "a.killed", COMPACTING)
    snapshots = len(table.metadata.snapshots)
    server_process = psutil.Process(server.pid)

    def ask() -> None:
        with contextlib.suppress(httpx.HTTPError):
            http.post(
                f"{url(server, 'killed')}/maintenance", json={"jobs": ["compact-data-files"]}, timeout=60
            )

    asking = threading.Thread(target=ask)
    asking.start()
    job = eventually(lambda: job_process(server_process), "the job's process", 60, 0.001)
    job.suspend()
    server.kill()
    asking.join()
    job.resume()
    _, alive = psutil.wait_procs([job], timeout=30)
    assert not alive
    restarted = IsbreServer(tmp_path / "warehouse").start()
    try:
        reloaded = RestCatalog("isbre", uri=restarted.url).load_table("a.killed")
        assert len(reloaded.metadata.snapshots) == snapshots
        assert all(
            s.summary is None or s.summary.operation.value != "replace" for s in reloaded.metadata.snapshots
        )
    finally:
        restarted.stop()


# -- 6. a commit whose outcome is unknown never loses its metadata file


def test_a_commit_whose_answer_the_database_lost_keeps_its_file(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The COMMIT reaches PostgreSQL and its answer is lost. When the store can be asked, the
    commit is answered as the success it was; when it cannot, the answer says the outcome is
    unknown, and either way the file the table may point at stays."""
    database = postgres.database(f"isbre_{uuid.uuid4().hex[:12]}")
    with CommitDroppingProxy(postgres.port) as proxy:
        through = database.replace(f":{postgres.port}/", f":{proxy.port}/")
        (service,) = open_warehouses(through, [Warehouse("isbre", str(tmp_path / "warehouse"))])
        try:
            service.namespaces.create(("a",), {})
            ident = _ident("a", "t")
            schema = Schema(NestedField(1, "n", LongType(), required=False))
            service.tables.create(ident, schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER)

            def commit(value: str) -> Any:
                change = TableChange(ident, (), (SetPropertiesUpdate(updates={"v": value}),))
                return service.tables.commit(change)

            proxy.drop_next_commit.set()
            landed = commit("1")
            assert proxy.dropped == 1
            assert landed.metadata.properties["v"] == "1" and _exists(landed.metadata_location)
            assert service.tables.load(ident).metadata_location == landed.metadata_location

            proxy.drop_next_commit.set()
            proxy.refusing.set()
            with pytest.raises(CommitStateUnknownError, match="unknown"):
                commit("2")
            assert proxy.dropped == 2
            proxy.refusing.clear()
            after = eventually(lambda: _loaded(service, ident), "the store back", 30)
            assert after.metadata.properties["v"] == "2" and _exists(after.metadata_location)
        finally:
            service.close()


def _loaded(service: Any, ident: Any) -> Any:
    with contextlib.suppress(StoreUnavailableError):
        return service.tables.load(ident)
    return None


def _exists(location: str | None) -> bool:
    path = local_path(location or "")
    return path is not None and path.exists()


def test_an_unknown_commit_state_is_the_spec_s_500(trusted: IsbreServer) -> None:
    from isbre.rest.errors import render_error

    answer = json.loads(render_error(CommitStateUnknownError("The commit's outcome is unknown")).body)
    assert answer["error"]["code"] == 500 and answer["error"]["type"] == "CommitStateUnknownException"
