"""A writer of a local table writes its folders directly, and may swap one of them for a symbolic
link to another table's files at any moment, between the server's check of a path and its use.
At each step of orphan removal, compaction and purge, the writer's folder is swapped for a link
to the victim's data folder: nothing of the victim's is deleted or changed (its files hashed
before and after), nothing outside the writer's table is opened (every descriptor the server
opens for the job is looked up in /proc), and no victim row lands in the writer's table."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from isbre.catalog import Identifier, confined_io
from isbre.catalog.deletion import TableFiles
from isbre.catalog.embedded import LmdbCatalog
from isbre.catalog.file_uris import local_path
from isbre.catalog.purge import PurgeIncompleteError
from isbre.catalog.table_handles import OutsideTableError
from isbre.catalog.table_staging import TableChange
from isbre.catalog.warehouses import open_catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import SetPropertiesUpdate
from pyiceberg.types import LongType, NestedField

T = Identifier.of(("a",), "t")
OLD = 10**9  # a modification time long past every orphan age


def numbers(start: int) -> pa.Table:
    return pa.table({"n": pa.array([start, start + 1], pa.int64())})


def tree(root: Path) -> dict[str, str]:
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


class Setting:
    """A victim table with data, and the writer's table whose data folder (`write.data.path`,
    also where compaction writes) is its own `wdata`, with three small files and two old orphans."""

    def __init__(self, base: Path) -> None:
        self.catalog = LmdbCatalog("local", warehouse=str(base / "warehouse"))
        for namespace in ("a", "b"):
            self.catalog.create_namespace(namespace)
        victim = self.catalog.create_table("b.victim", schema=numbers(0).schema)
        victim.append(numbers(1000))
        self.victim_data = Path(str(local_path(victim.location()))) / "data"
        location = Path(str(local_path(f"{base / 'warehouse'}/a/t-own")))
        self.wdata = location / "wdata"
        self.table = self.catalog.create_table(
            "a.t",
            schema=numbers(0).schema,
            location=location.as_uri(),
            properties={
                "write.data.path": self.wdata.as_uri(),
                "write.folder-storage.path": self.wdata.as_uri(),
                "isbre.maintenance.compact.min-input-files": "2",
                "isbre.maintenance.orphan-files.min-age-ms": "1",
            },
        )
        for i in range(3):
            self.table.append(numbers(i * 10))
        for name in ("orphan-1.parquet", "orphan-2.parquet"):
            (self.wdata / name).write_bytes(b"nobody's")
            os.utime(self.wdata / name, (OLD, OLD))
        self.before = tree(self.victim_data)

    def swap(self) -> None:
        """The writer's move: its data folder becomes a link to the victim's."""
        self.wdata.rename(self.wdata.with_name("wdata.moved"))
        self.wdata.symlink_to(self.victim_data, target_is_directory=True)


STEPS = ("check", "reach", "delete", "names_in", "files")


@contextlib.contextmanager
def swapped_at(setting: Setting, step_at: int | None, opened: list[str]) -> Iterator[list[str]]:
    """Swap the folder just before the `step_at`-th use of the table's files (None: never), and
    record, for every file the server opens through handles, what the kernel opened."""
    calls: list[str] = []
    counting = threading.Lock()
    saved = {name: getattr(TableFiles, name) for name in STEPS}
    open_below = confined_io.open_below

    def step(name: str) -> None:
        with counting:  # PyIceberg reads a compaction's files in threads
            if step_at is not None and len(calls) == step_at:
                setting.swap()
            calls.append(name)

    def counted(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: TableFiles, *args: Any, **kwargs: Any) -> Any:
            step(name)
            return method(self, *args, **kwargs)

        return call

    def observed(*args: Any, **kwargs: Any) -> int:
        step("open")
        found = open_below(*args, **kwargs)
        opened.append(os.readlink(f"/proc/self/fd/{found}"))
        return found

    try:
        for name, method in saved.items():
            setattr(TableFiles, name, counted(name, method))
        confined_io.open_below = observed  # type: ignore[attr-defined]
        yield calls
    finally:
        for name, method in saved.items():
            setattr(TableFiles, name, method)
        confined_io.open_below = open_below  # type: ignore[attr-defined]


def run(setting: Setting, what: str) -> None:
    """Run `what` on the writer's table: refusing, or failing on a folder that vanished while it
    was swapped, is fine; what it opened and changed is what the test looks at."""
    service = setting.catalog.service
    if what == "purge":
        with contextlib.suppress(PurgeIncompleteError):  # it says what it left behind
            service.tables.drop(T, purge=True)
        return
    with contextlib.suppress(FileNotFoundError):
        service.maintenance.run(T, [what])


@pytest.mark.parametrize("what", ["remove-orphan-files", "compact-data-files", "purge"])
def test_a_folder_swapped_for_a_link_at_any_step_leads_nowhere(tmp_path: Path, what: str) -> None:
    baseline = Setting(tmp_path / "baseline")
    with swapped_at(baseline, None, []) as calls:
        run(baseline, what)
    assert len(calls) > 3, calls  # the job went through the table's files, step by step
    for step in range(len(calls) + 1):
        setting = Setting(tmp_path / f"step-{step}")
        opened: list[str] = []
        with swapped_at(setting, step, opened):
            run(setting, what)
        own = os.path.realpath(setting.wdata.parent)
        outside = [path for path in opened if not path.startswith(own + os.sep)]
        assert outside == [], (step, outside)
        # Nothing of the victim's went, changed or was added to (compaction writes into the folder).
        assert tree(setting.victim_data) == setting.before, step
        setting.catalog.service.close()


@pytest.mark.parametrize("metadata_sync_s", [0, 3600], ids=["synced", "kept"])
def test_a_metadata_folder_swapped_for_a_link_gets_no_new_file(
    tmp_path: Path, metadata_sync_s: float
) -> None:
    """The catalog writes a commit's metadata file into the writer's own metadata folder: swapped
    for a link to another table's, the commit is refused and nothing lands in the other folder."""
    service = open_catalog(tmp_path / "warehouse", metadata_sync_s=metadata_sync_s)
    try:
        for namespace in ("a", "b"):
            service.namespaces.create((namespace,), {})
        schema = Schema(NestedField(1, "n", LongType(), required=False))
        made = [
            service.tables.create(ident, schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER)
            for ident in (T, Identifier.of(("b",), "victim"))
        ]
        own, victim = (local_path(state.metadata_location or "") for state in made)
        assert own is not None and victim is not None
        before = tree(victim.parent)
        own.parent.rename(own.parent.with_name("metadata.moved"))
        own.parent.symlink_to(victim.parent, target_is_directory=True)

        with pytest.raises(OutsideTableError, match="link"):
            service.tables.commit(TableChange(T, (), (SetPropertiesUpdate(updates={"k": "v"}),)))
        assert tree(victim.parent) == before
        assert service.tables.load(T).metadata_location == made[0].metadata_location
    finally:
        service.close()
