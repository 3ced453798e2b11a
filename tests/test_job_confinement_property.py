"""Generated: whatever a table's metadata holds (every property PyIceberg reads, with hostile
values, and manifests naming other tables' files, the system's files and places outside the
warehouse), the server's maintenance jobs and purge read, write and delete nothing outside the
table, and import no module the metadata names."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isbre.catalog import confined_io
from isbre.catalog.embedded import LmdbCatalog
from isbre.catalog.file_uris import local_path
from isbre.catalog.identifiers import Identifier
from isbre.catalog.locations import inside, normalized
from isbre.catalog.maintenance import JOBS
from isbre.catalog.metadata_files import Loaded, parse_table_metadata
from isbre.catalog.purge import PurgeIncompleteError
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import TableProperties

from tests.crafted import crafted_snapshot

# Every table property PyIceberg reads, and isbre's own maintenance policy.
PYICEBERG_PROPERTIES = sorted(
    value for name, value in vars(TableProperties).items() if name.isupper() and "." in str(value)
)
ISBRE_PROPERTIES = [
    "isbre.maintenance.enabled",
    "isbre.maintenance.compact.enabled",
    "isbre.maintenance.compact.min-input-files",
    "isbre.maintenance.compact.target-file-size-bytes",
    "isbre.maintenance.orphan-files.min-age-ms",
    "write.object-storage.path",
    "write.folder-storage.path",
    "py-io-impl",
    "io-impl",
]
CANARY = f"isbre_property_canary_{uuid.uuid4().hex[:8]}"


def numbers(start: int) -> pa.Table:
    return pa.table({"n": pa.array([start, start + 1], pa.int64())})


class Opened:
    """Every location PyIceberg's Arrow FileIO is asked to open, read or write, and every file the
    server opens through directory handles, as the kernel names what it opened (observed, not
    changed)."""

    def __init__(self) -> None:
        self.locations: list[str] = []

    def __enter__(self) -> Opened:
        self._saved = (PyArrowFileIO.new_input, PyArrowFileIO.new_output)
        self._open_below = confined_io.open_below
        new_input, new_output = self._saved
        opened = self.locations
        open_below = self._open_below

        def observed_handle(*args: Any, **kwargs: Any) -> int:
            found = open_below(*args, **kwargs)
            opened.append(Path(os.readlink(f"/proc/self/fd/{found}")).as_uri())
            return found

        confined_io.open_below = observed_handle  # type: ignore[attr-defined]

        def observed_input(io: PyArrowFileIO, location: str) -> Any:
            opened.append(location)
            return new_input(io, location)

        def observed_output(io: PyArrowFileIO, location: str) -> Any:
            opened.append(location)
            return new_output(io, location)

        PyArrowFileIO.new_input, PyArrowFileIO.new_output = observed_input, observed_output  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        PyArrowFileIO.new_input, PyArrowFileIO.new_output = self._saved  # type: ignore[method-assign]
        confined_io.open_below = self._open_below  # type: ignore[attr-defined]


def tree(root: Path, leave_out: Path | None = None) -> dict[str, str]:
    """Every file under `root` (but `leave_out`) with a digest of its contents."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and (leave_out is None or leave_out not in path.parents):
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def canary_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory on the import path holding the canary module: importing it leaves a mark."""
    where = tmp_path_factory.mktemp("canary")
    marker = where / "imported"
    (where / f"{CANARY}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        "class Provider:\n    def __init__(self, *a, **k): pass\n"
    )
    sys.path.insert(0, str(where))
    yield marker
    sys.path.remove(str(where))


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_job_or_purge_reaches_outside_the_table(
    tmp_path_factory: pytest.TempPathFactory, canary_path: Path, data: st.DataObject
) -> None:
    base = tmp_path_factory.mktemp("confined")
    warehouse, outside = base / "warehouse", base / "outside"
    outside.mkdir()
    (outside / "secret.parquet").write_bytes(b"PAR1 not yours")
    catalog = LmdbCatalog("local", warehouse=str(warehouse))
    for namespace in ("a", "b"):
        catalog.create_namespace(namespace)
    victim = catalog.create_table("b.victim", schema=numbers(0).schema)
    victim.append(numbers(100))
    victim = victim.refresh()
    victim_files = [task.file.file_path for task in victim.scan().plan_files()]
    victim_manifest = victim.current_snapshot().manifests(victim.io)[0].manifest_path  # type: ignore[union-attr]
    table = catalog.create_table(
        "a.t",
        schema=numbers(0).schema,
        properties={
            "isbre.maintenance.compact.min-input-files": "2",
            "history.expire.min-snapshots-to-keep": "1",
            "history.expire.max-snapshot-age-ms": "1",
        },
    )
    for i in range(3):
        table.append(numbers(i))
    table = table.refresh()
    own_files = [task.file.file_path for task in table.scan().plan_files()]

    # Manifests naming foreign paths, committed as a hostile engine would (data files are the
    # engines' to name: only manifest lists and manifests are the table's own).
    foreign = [*victim_files, victim_manifest, "file:///etc/passwd", (outside / "secret.parquet").as_uri()]
    named = data.draw(
        st.lists(st.sampled_from(foreign), min_size=0, max_size=3, unique=True), "foreign files"
    )
    if named:
        updates = crafted_snapshot(
            table.metadata,
            f"{table.location()}/metadata/snap-{uuid.uuid4()}.avro",
            [(f"{table.location()}/metadata/{uuid.uuid4()}-m0.avro", own_files + named)],
        )
        catalog.service.tables.commit(_change(updates))

    # Properties as an older server might have stored them: written into the metadata file itself.
    hostile_values = st.sampled_from(
        [
            f"{CANARY}.Provider",
            victim.location(),
            f"{victim.location()}/data",
            outside.as_uri(),
            "file:///etc",
            str(warehouse),
            "true",
            "-1",
            "0",
            "99999999999999999999",
            "not a value",
        ]
    )
    properties = data.draw(
        st.dictionaries(st.sampled_from(PYICEBERG_PROPERTIES + ISBRE_PROPERTIES), hostile_values, max_size=6),
        "stored properties",
    )
    service = catalog.service
    location = table.refresh().metadata_location
    current = local_path(location)
    assert current is not None
    stored = json.loads(current.read_text())
    stored["properties"] = {**stored["properties"], **properties}
    current.write_text(json.dumps(stored))
    # Read as a server started since would read it (the process's cache holds what it wrote).
    service.core.table_files.put(
        location, Loaded(parse_table_metadata(service.core.io, location), current.read_bytes())
    )
    assert service.tables.load(Identifier.of(("a",), "t")).metadata.properties == stored["properties"]

    own = local_path(table.location())
    assert own is not None
    before = tree(base, leave_out=own)
    ident = Identifier.of(("a",), "t")
    reports = []
    here = base / "working-directory"  # relative paths would land here
    here.mkdir()
    try:
        with Opened() as opened, contextlib.chdir(here):
            for job in JOBS:
                with contextlib.suppress(Exception):  # refusing a hostile table is fine
                    reports += service.maintenance.run(ident, [job])
            with contextlib.suppress(PurgeIncompleteError):  # it says what it left behind
                service.tables.drop(ident, purge=True)
    finally:
        service.close()
    if named and not properties:  # compaction planned them with the table's own, and said so
        assert any(report.foreign_paths for report in reports), reports
    roots = [normalized(table.location())]
    for location in opened.locations:
        found = normalized(location)
        assert any(inside(found, root) for root in roots), f"opened {location} outside the table"
    after = tree(base, leave_out=own)
    changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    # The store's own files change with every commit; nothing else outside the table may.
    assert {path for path in changed if "isbre.lmdb" not in path} == set(), changed
    assert not canary_path.exists() and CANARY not in sys.modules
    assert not any(here.iterdir())


def _change(updates: list[dict[str, Any]]) -> Any:
    from isbre.catalog import TableChange
    from isbre.rest.models import CommitTableRequest

    request = CommitTableRequest.model_validate({"updates": updates})
    return TableChange(Identifier.of(("a",), "t"), tuple(request.requirements), tuple(request.updates))
