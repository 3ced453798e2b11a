"""Small builders shared by the sink tests."""

from __future__ import annotations

import io
import signal
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import pyarrow as pa
from isbre.rest.cli import main
from isbre.sinks.contract import CommitInfo, OffsetSpan, SourceFields
from isbre.sinks.iceberg import IcebergSink
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from tests import zygote
from tests.server import IsbreServer

# A producer that commits 300 rows and is killed before it hears back ("after-commit"), or also
# while a second push has a data file written and not committed ("mid-push").
CRASHING_PRODUCER = textwrap.dedent(
    """
    import os, signal, sys
    from pyiceberg.catalog.rest import RestCatalog
    from isbre.sinks.iceberg import IcebergSink
    from tests.sink_helpers import rows, span

    catalog = RestCatalog("isbre", uri=sys.argv[1])
    sink = IcebergSink(catalog, sys.argv[2])
    for start in range(0, 300, 100):
        sink.push(rows(start, start + 100), span(start, start + 100))
    sink.finish()  # durable now; the process dies before anyone hears of it
    if sys.argv[3] == "mid-push":
        sink = IcebergSink(catalog, sys.argv[2], target_file_bytes=1)
        sink.push(rows(300, 400), span(300, 400))  # a data file is written, never committed
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def rows(start: int, end: int, **extra: pa.Array) -> pa.RecordBatch:
    """A payload batch whose `n` column equals the offset each row is pushed at."""
    numbers = pa.array(range(start, end), pa.int64())
    labels = pa.array([f"row {i}" for i in range(start, end)])
    return pa.RecordBatch.from_pydict({"n": numbers, "label": labels, **extra})


def span(start: int, end: int, partition: int = 0, topic: str = "orders") -> OffsetSpan:
    return OffsetSpan("kafka-1", topic, partition, start, end)


def offsets_in(table: Table, prefix: str = "_twg_") -> list[tuple[int, int]]:
    """(partition, offset) of every row, sorted (duplicates kept)."""
    columns = (f"{prefix}source_partition", f"{prefix}source_offset")
    data = table.refresh().scan(selected_fields=columns).to_arrow()
    return sorted(zip(data[columns[0]].to_pylist(), data[columns[1]].to_pylist(), strict=True))


def write_once(
    catalog: Catalog,
    ident: str,
    batch: pa.RecordBatch,
    covered: OffsetSpan,
    source: SourceFields | None = None,
    **options: object,
) -> CommitInfo:
    """One sink session: one push, one commit."""
    with IcebergSink(catalog, ident, **options) as sink:
        sink.push(batch, covered, source)
        return sink.finish()[0]


def crash_and_replay(server: IsbreServer, catalog: Catalog, ident: str, crash: str) -> None:
    """A producer dies unacknowledged, then replays everything from offset 0: the table holds every
    offset once, and a further replay commits nothing."""
    child = zygote.run([sys.executable, "-c", CRASHING_PRODUCER, server.url, ident, crash], timeout=120)
    assert child.returncode == -signal.SIGKILL
    sink = IcebergSink(catalog, ident)
    for start in range(0, 600, 150):
        sink.push(rows(start, start + 150), span(start, start + 150))
    info, covered = sink.finish()
    sink.close()
    assert covered == span(0, 600)
    assert offsets_in(catalog.load_table(ident)) == [(0, i) for i in range(600)]
    assert info.commit_seq == server.high_water()
    before = server.high_water()
    again = IcebergSink(catalog, ident)
    again.push(rows(0, 600), span(0, 600))
    assert again.finish()[0].snapshot_id is None
    assert server.high_water() == before


@dataclass(frozen=True)
class Ran:
    """What a command said and how it ended, as `subprocess.run` reports them."""

    returncode: int
    stdout: str
    stderr: str


def ingest(server: IsbreServer, *args: str) -> Ran:
    """`isbre ingest ARGS` against `server`, 7 rows a batch: the command's own entry point, run in
    this process (a process of its own costs a second of start-up a call; tests/test_cli.py runs
    the commands as processes)."""
    said, complained = io.StringIO(), io.StringIO()
    with redirect_stdout(said), redirect_stderr(complained):
        try:
            code = main(["ingest", *args, "--uri", server.url, "--batch-size", "7"])
        except SystemExit as exit:  # argparse's refusals
            code = exit.code if isinstance(exit.code, int) else 2
    return Ran(code, said.getvalue(), complained.getvalue())


def compacted(table: Table) -> bool:
    """Whether the table's current snapshot is a replace: the catalog's compaction committed."""
    current = table.refresh().current_snapshot()
    return (
        current is not None and current.summary is not None and current.summary.operation.value == "replace"
    )
