"""Whatever spelling a commit carries, a purge deletes nothing outside the table's own resolved location.

Hypothesis builds hostile paths (percent-encoded separators and dots, `..`,
literal `%2F` directories, symbolic links planted in the table's directory,
other tables' files, the store, files outside the warehouse) and puts them in
every place a commit can carry a path: the table's location, manifest lists,
manifests, data files, statistics and the metadata log (through register).
Each is refused when committed or, when only a purge can meet it, left alone by
the purge; files outside the table's resolved directory are compared before
and after.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isbre.catalog import CatalogService, Identifier, TableChange
from isbre.catalog.deletion import OutsideTableError, TableFiles
from isbre.catalog.file_uris import local_path
from isbre.catalog.purge import PurgeIncompleteError
from isbre.catalog.warehouses import open_catalog
from pydantic import TypeAdapter
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import TableUpdate

from tests.crafted import crafted_snapshot

SCHEMA = Schema.model_validate(
    {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
)
DECOY = "q%2Fr%2Fs%2Ft%2F"
names = itertools.count()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CatalogService, Path]]:
    base = tmp_path_factory.mktemp("deletion")
    service = open_catalog(base / "wh")
    service.namespaces.create(("ns",), {})
    other = service.tables.create(Identifier(("ns",), "other"), SCHEMA, *_unpartitioned())
    (local_path(other.metadata.location) / "data").mkdir(parents=True)  # type: ignore[operator]
    (local_path(other.metadata.location) / "data" / "other.parquet").write_bytes(b"theirs")  # type: ignore[operator]
    (base / "outside").mkdir()
    (base / "outside" / "secret").write_text("outside the warehouse")
    yield service, base
    service.close()


def _unpartitioned() -> tuple:
    return UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER


def every_file(base: Path, except_under: Path) -> set[str]:
    """Every file and link below `base`, but those under `except_under`."""
    found = set()
    for directory, _, files in os.walk(base, followlinks=False):
        found |= {
            str(Path(directory) / name) for name in files if not Path(directory).is_relative_to(except_under)
        }
    return found


SEGMENT = st.sampled_from(
    [
        "..",
        ".",
        DECOY,
        "link",
        "data",
        "metadata",
        "%2e%2e",
        "%2E%2E%2F%2E%2E",
        "a%252Fb",
        "",
        "x;y",
        "x?y",
        "x#y",
        "isbre.lmdb",
        "ns",
        "outside",
        "\\..\\",
    ]
)
TARGET = st.sampled_from(["secret", "data.mdb", "other.parquet", "real.parquet", "lock.mdb", "x"])


@st.composite
def hostile_paths(draw: st.DrawFn, root: str, base: str, other: str) -> str:
    """A path aimed outside the table at `root`: a known way out, or segments put together at random."""
    up = "/".join([".."] * 4)  # from the decoy directory: data, the table, the namespace, the warehouse
    other_file = f"{other}/data/other.parquet"
    from_warehouse = os.path.relpath(other_file, f"{base}/wh")
    known = [
        f"{root}/link/secret",  # through a planted link to a directory outside
        f"{root}/data/secret",  # a planted link to a file outside: the link may go, never its target
        f"{root}/data/linkother/data/other.parquet",
        f"{root}/data/{DECOY}/{up}/isbre.lmdb/data.mdb",  # inside when decoded, outside when resolved
        f"{root}/data/{DECOY}/{up}/{from_warehouse}",
        f"{root}/data/%2e%2e/%2e%2e/%2e%2e/isbre.lmdb/data.mdb",
        f"{root}/../{os.path.basename(other)}/data/other.parquet",
        f"{root}/data/../../../outside/secret",
        f"{base}/outside/secret",
        other_file,
        f"{base}/wh/isbre.lmdb/data.mdb",
        f"{root}-sibling/x",
        f"{root}/data/real.parquet",
    ]
    start = draw(st.sampled_from([root, root + "/data", f"{base}/wh", other, base + "/outside"]))
    composed = "/".join([start, *draw(st.lists(SEGMENT, max_size=6)), draw(TARGET)])
    path = draw(st.one_of(st.sampled_from(known), st.just(composed)))
    return "file://" + path if draw(st.booleans()) else path


def updates_of(raw: list[dict]) -> tuple[TableUpdate, ...]:
    return tuple(TypeAdapter(TableUpdate).validate_python(update) for update in raw)


def plant(root: Path, base: Path, other: Path) -> None:
    """What an engine with access to the table's directory can put there."""
    (root / "data" / DECOY).mkdir(parents=True, exist_ok=True)
    (root / "metadata").mkdir(exist_ok=True)
    (root / "data" / "real.parquet").write_bytes(b"ours")
    for link, target in (
        ("link", base / "outside"),
        ("data/linkother", other),
        ("data/secret", base / "outside" / "secret"),
    ):
        if not (root / link).is_symlink():  # a table placed where an earlier one planted its links
            (root / link).unlink(missing_ok=True)
            (root / link).symlink_to(target)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_spelling_of_any_path_lets_a_purge_leave_the_table(
    home: tuple[CatalogService, Path], data: st.DataObject
) -> None:
    service, base = home
    ident = Identifier(("ns",), f"t{next(names)}")
    other = local_path(service.tables.load(Identifier(("ns",), "other")).metadata.location)
    assert other is not None
    hostile = hostile_paths(
        str(service.core.places.namespace_location(("ns",)).removeprefix("file://")) + f"/{ident.name}",
        str(base),
        str(other),
    )
    # The table's own location may be hostile too: refused, or a place like any other.
    location = data.draw(st.one_of(st.none(), hostile))
    try:
        state = service.tables.create(ident, SCHEMA, *_unpartitioned(), location=location)
    except (ValueError, PermissionError):
        state = service.tables.create(ident, SCHEMA, *_unpartitioned())
    root = local_path(state.metadata.location)
    assert root is not None
    plant(root, base, other)
    hostile = hostile_paths(str(root), str(base), str(other))
    before = every_file(base, Path(os.path.realpath(root)))

    data_paths = data.draw(st.lists(hostile, min_size=1, max_size=6))
    manifest = str(root / "metadata" / "m0.avro")
    for manifest_list in (data.draw(hostile), str(root / "metadata" / "list.avro")):
        raw = crafted_snapshot(
            state.metadata,
            manifest_list,
            [(manifest, data_paths)],
            write_list_at=str(root / "metadata" / "list.avro"),
        )
        try:
            service.tables.commit(TableChange(ident, (), updates_of(raw)))
            break
        except ValueError:
            continue  # a manifest list that cannot be committed: the table's own one then
    metadata: TableMetadata = service.tables.load(ident).metadata
    statistics = data.draw(hostile)
    stats = {
        "action": "set-statistics",
        "snapshot-id": metadata.current_snapshot_id,
        "statistics": {
            "snapshot-id": metadata.current_snapshot_id,
            "statistics-path": statistics,
            "file-size-in-bytes": 1,
            "file-footer-size-in-bytes": 1,
            "blob-metadata": [],
        },
    }
    with contextlib.suppress(ValueError):
        service.tables.commit(TableChange(ident, (), updates_of([stats])))
    if data.draw(st.booleans()):  # the metadata log, through a register of crafted metadata
        state = service.tables.load(ident)
        crafted = json.loads(state.json)
        crafted["metadata-log"] = [
            {"metadata-file": p, "timestamp-ms": 1}
            for p in data.draw(st.lists(hostile, min_size=1, max_size=3))
        ]
        path = root / "metadata" / "99999-crafted.metadata.json"
        path.write_text(json.dumps(crafted))
        with contextlib.suppress(ValueError):
            service.tables.register(ident, str(path), overwrite=True)
    # An incomplete purge says so; what it must never do is leave the table.
    with contextlib.suppress(PurgeIncompleteError):
        service.tables.drop(ident, purge=True)
    after = every_file(base, Path(os.path.realpath(root)))
    assert before <= after, f"deleted outside the table: {sorted(before - after)}"


@given(
    path=st.lists(
        st.sampled_from(["..", ".", "%2e%2e", "%2F", "..%2F..", "sentinel", "data", "", "\\..", ";", "?x"]),
        min_size=1,
        max_size=6,
    ).map("/".join)
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_deleter_refuses_or_stays_below_the_root(tmp_path: Path, path: str) -> None:
    root = tmp_path / "wh" / "t"
    (root / "data").mkdir(parents=True, exist_ok=True)
    files = TableFiles(PyArrowFileIO(), [str(root)], [str(tmp_path / "wh")])
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("x")
    with contextlib.suppress(
        OutsideTableError, FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError
    ):
        files.delete(f"{root}/{path}")
    assert sentinel.exists()
