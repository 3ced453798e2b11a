"""isbre reaches into four libraries' private parts, each through one module: PyIceberg's
(catalog/pyiceberg_internals.py), sse-starlette's (rest/sse_starlette_internals.py), uvicorn's
protocol (rest/connections.py) and supervisor (rest/uvicorn_supervisor.py), and multiprocessing's
forkserver (catalog/forkserver.py). Nothing else does,
and each use is checked here against the installed library, so that an upgrade that changes one
fails here, by name."""

from __future__ import annotations

import ast
import inspect
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from isbre.catalog import pyiceberg_internals as pyiceberg
from isbre.rest.sse_starlette_internals import EventStream
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import SetPropertiesUpdate
from pyiceberg.types import LongType, NestedField
from sse_starlette import EventSourceResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from tests.test_layers import PACKAGES, ROOT

SEAMS = {
    "catalog/pyiceberg_internals.py",
    "rest/sse_starlette_internals.py",
    "rest/connections.py",
    "rest/uvicorn_supervisor.py",
    "catalog/forkserver.py",
}
SCHEMA = Schema(NestedField(1, "x", LongType(), required=False))


def test_no_other_module_imports_a_private_name_of_another_library() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), where)):
                if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                    continue
                if node.module.split(".")[0] == "isbre":
                    continue
                private = [a.name for a in node.names if a.name.startswith("_")]
                inside = node.module.startswith(("uvicorn.protocols", "uvicorn.supervisors"))
                if (private or inside) and where not in SEAMS:
                    found.append(f"{where}: from {node.module} import {private or '...'}")
    assert found == []


def _metadata(tmp_path: Path):  # type: ignore[no-untyped-def]
    return new_table_metadata(
        SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, tmp_path.as_uri(), {}, uuid.uuid4()
    )


def test_pyiceberg_applies_an_update_and_logs_a_metadata_file(tmp_path: Path) -> None:
    metadata = _metadata(tmp_path)
    context = pyiceberg.UpdateContext()
    updated = pyiceberg.apply_table_update(SetPropertiesUpdate(updates={"a": "b"}), metadata, context)
    assert updated.properties["a"] == "b"
    logged = pyiceberg.add_to_metadata_log(updated, "file:///t/metadata/1.json", metadata.last_updated_ms)
    assert [entry.metadata_file for entry in logged.metadata_log] == ["file:///t/metadata/1.json"]
    assert pyiceberg.empty_table_metadata().format_version == 1  # what a create by updates upgrades


def test_pyiceberg_writes_parquet_data_files(tmp_path: Path) -> None:
    from isbre.sinks.datafiles import PARQUET

    metadata = _metadata(tmp_path)
    rows = pa.table({"x": pa.array([1, 2, 3], pa.int64())})
    assert pyiceberg.arrow_schema_without_ids(rows.schema).find_field("x").field_type == LongType()
    (batch,) = rows.to_batches()
    shaped = pyiceberg.as_file_schema(SCHEMA, SCHEMA, batch, PARQUET)
    assert shaped.schema.field("x").metadata[b"PARQUET:field_id"] == b"1"
    options = pyiceberg.parquet_writer_options(metadata.properties)
    assert {"compression", "compression_level"} <= set(options)  # the sink takes both out
    (written,) = pyiceberg.data_files_of(metadata, rows, PyArrowFileIO(), uuid.uuid4())
    assert written.record_count == 3 and Path(written.file_path.removeprefix("file://")).is_file()


def test_pyiceberg_reads_a_file_s_rows_with_their_positions(tmp_path: Path) -> None:
    """A data file read whole, its position deletes applied after: the rows kept and where they are."""
    from isbre.catalog.embedded import LmdbCatalog
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    from tests.row_deltas import commit_deletes, position_deletes

    catalog = LmdbCatalog("seams", warehouse=str(tmp_path))
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=SCHEMA)
    table.append(pa.table({"x": pa.array([10, 11, 12, 13, 14], pa.int64())}))
    (data,) = [task.file for task in table.scan().plan_files()]
    table = commit_deletes(table, [position_deletes(table, data, [1, 3])])
    tasks = [FileScanTask(t.file, delete_files=t.delete_files) for t in table.scan().plan_files()]
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    ((rows, positions),) = pyiceberg.rows_at_positions(scan, table.io, tasks)
    assert rows["x"].to_pylist() == [10, 12, 14] and positions.to_pylist() == [0, 2, 4]
    catalog.close()


def test_pyiceberg_rest_catalog_builds_requests_as_the_seam_does() -> None:
    split = inspect.signature(RestCatalog._split_identifier_for_path)
    assert list(split.parameters)[:2] == ["self", "identifier"]
    assert "self._session" in inspect.getsource(RestCatalog.__init__)
    assert "self._session.get(" in inspect.getsource(RestCatalog)


def test_sse_starlette_sends_every_chunk_through_the_overridden_method() -> None:
    sent = EventSourceResponse._send_with_timeout
    assert inspect.iscoroutinefunction(sent)
    assert list(inspect.signature(sent).parameters) == ["self", "send", "message"]
    assert "_send_with_timeout(" in inspect.getsource(EventSourceResponse._stream_response)
    assert EventStream._send_with_timeout is not sent


def test_uvicorn_supervisor_has_what_the_patient_one_uses() -> None:
    from uvicorn.supervisors.multiprocess import Multiprocess, Process

    assert list(inspect.signature(Multiprocess.__init__).parameters) == ["self", "config", "sockets"]
    assert "keep_subprocess_alive" in vars(Multiprocess)
    assert "self.processes" in inspect.getsource(Multiprocess.keep_subprocess_alive)
    assert list(inspect.signature(Process.ping).parameters) == ["self", "timeout"]
    assert "self.process = " in inspect.getsource(Process.__init__)


def test_multiprocessing_forkserver_has_what_the_forked_one_uses() -> None:
    """catalog/forkserver.py starts multiprocessing's forkserver loop in a fork of its own and tells
    multiprocessing where it listens, as `ForkServer.ensure_running` would; a process forked from
    it closes the forkserver's end of the pipe it was handed."""
    import multiprocessing.forkserver

    main = multiprocessing.forkserver.main  # type: ignore[attr-defined]
    assert list(inspect.signature(main).parameters)[:3] == ["listener_fd", "alive_r", "preload"]
    ensure = inspect.getsource(multiprocessing.forkserver.ForkServer.ensure_running)
    for attribute in ("_forkserver_pid", "_forkserver_address", "_forkserver_alive_fd", "_preload_modules"):
        assert f"self.{attribute}" in ensure, attribute
    assert "os.waitpid(self._forkserver_pid, os.WNOHANG)" in ensure
    serve_one = inspect.getsource(multiprocessing.forkserver._serve_one)  # type: ignore[attr-defined]
    assert "_forkserver._forkserver_alive_fd" in serve_one


def test_uvicorn_protocol_has_what_the_guarded_protocol_uses() -> None:
    for method in (
        "connection_made",
        "connection_lost",
        "data_received",
        "on_url",
        "on_header",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "on_response_complete",
    ):
        assert callable(getattr(HttpToolsProtocol, method)), method
    protocol = inspect.getsource(HttpToolsProtocol)
    for attribute in ("self.cycle", "self.pipeline", "self.transport", "self.scope", "self.loop"):
        assert attribute in protocol, attribute
    cycle = inspect.getsource(RequestResponseCycle.__init__)
    for attribute in ("self.scope", "self.response_started", "self.disconnected"):
        assert attribute in cycle, attribute


def test_a_lean_transaction_works_out_the_metadata_pyiceberg_does_once(tmp_path: Path) -> None:
    """The sink commits through LeanTransaction: the metadata its staged updates make must be
    PyIceberg's own, worked out once per change of them."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Transaction

    catalog = SqlCatalog("seam", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    catalog.create_namespace("n")
    table = catalog.create_table("n.t", SCHEMA)
    table.append(pa.table({"x": pa.array([1], pa.int64())}))
    data = pa.table({"x": pa.array([2, 3], pa.int64())})
    (data_file,) = pyiceberg.data_files_of(table.metadata, data, table.io, uuid.uuid4())
    worked_out = []
    for kind in (Transaction, pyiceberg.LeanTransaction):
        tx = kind(table)
        before = tx.table_metadata
        assert before.model_dump() == table.metadata.model_dump()
        with tx.update_snapshot(snapshot_properties={"k": "v"}).fast_append() as append:
            append.append_data_file(data_file)
        worked_out.append(tx.table_metadata)
        if kind is pyiceberg.LeanTransaction:
            assert tx.table_metadata is tx.table_metadata  # once, until the updates change
            assert tx.table_metadata is not before
    ours, theirs = (
        m.model_dump(exclude={"last_updated_ms", "snapshots", "refs", "snapshot_log", "current_snapshot_id"})
        for m in worked_out
    )
    assert ours == theirs
    assert worked_out[0].snapshots[-1].summary == worked_out[1].snapshots[-1].summary  # what was added
    assert [s.summary.additional_properties["k"] for s in worked_out[1].snapshots[1:]] == ["v"]
    assert worked_out[1].current_snapshot().parent_snapshot_id == table.metadata.current_snapshot_id


def test_pyiceberg_s_overwrite_makes_a_replace_snapshot(tmp_path: Path) -> None:
    """Compaction commits what `replace_files` stages: a snapshot that removes and adds files, as
    PyIceberg's overwrite makes it, its operation `replace`, its totals those of the files kept,
    the files it adds of the data sequence number it is given (the starting snapshot's)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import ValidationException
    from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId

    catalog = SqlCatalog("seam", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    catalog.create_namespace("n")
    table = catalog.create_table("n.t", SCHEMA)
    for x in (1, 2):
        table.append(pa.table({"x": pa.array([x], pa.int64())}))
    table = table.refresh()
    small = [task.file for task in table.scan().plan_files()]
    rows = pa.table({"x": pa.array([1, 2], pa.int64())})
    (merged,) = pyiceberg.data_files_of(table.metadata, rows, table.io, uuid.uuid4())
    started = table.current_snapshot()
    assert started is not None and started.sequence_number == 2
    requirements, updates = pyiceberg.replace_files(
        ("n", "t"), table.metadata, table.metadata_location, table.io, small, [merged], {"k": "v"}, 2
    )
    assert requirements == (AssertRefSnapshotId(ref="main", snapshot_id=table.metadata.current_snapshot_id),)
    (snapshot,) = [u.snapshot for u in updates if isinstance(u, AddSnapshotUpdate)]
    assert snapshot.summary is not None and snapshot.summary.operation.value == "replace"
    assert {
        k: snapshot.summary[k] for k in ("total-data-files", "total-records", "deleted-data-files", "k")
    } == {
        "total-data-files": "1",
        "total-records": "2",
        "deleted-data-files": "2",
        "k": "v",
    }
    assert snapshot.sequence_number == 3
    entries = [e for m in snapshot.manifests(table.io) for e in m.fetch_manifest_entry(table.io)]
    assert [(e.data_file.file_path, e.sequence_number) for e in entries if e.status.name == "ADDED"] == [
        (merged.file_path, 2)
    ]
    table.overwrite(pa.table({"x": pa.array([9], pa.int64())}))  # the small files are gone
    with pytest.raises(ValidationException):
        pyiceberg.replace_files(
            ("n", "t"), table.metadata, table.metadata_location, table.io, small, [merged], {}, 2
        )
