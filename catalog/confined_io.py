"""The FileIO through which the server's own jobs and purges reach a table's files.

Every path such a job opens comes from metadata a client wrote: manifest lists, manifests, data
and delete files. Read with the server's own access, a manifest naming another table's data file
would copy that table's rows into the writer's table, and a manifest list naming `/etc/passwd`
would be opened. Every read, write and delete here first passes the table's own path check
(catalog/deletion.py's `TableFiles`, the one purge uses): under one of the table's places, not in
another table's. A path that fails it is refused before anything is opened, and remembered, so
that the job can say what it met. On local disk the file is then opened through directory
handles from a trusted root, never through a link (catalog/table_handles.py): a folder swapped
for a link after the check is refused when it is reached, and remembered the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from isbre.catalog.deletion import OutsideTableError, Reached, TableFiles
from isbre.catalog.table_handles import open_below, replace_below, stat_below
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream

T = TypeVar("T")


class ForeignPathError(OutsideTableError):
    """A path of the table's metadata that is not the table's to read, write or delete."""


class ConfinedIO(FileIO):
    def __init__(self, io: FileIO, files: TableFiles | None) -> None:
        """`files`: the table's path check (None: the table's places are not the server's to touch,
        so every path is refused)."""
        super().__init__(properties=io.properties)
        self._io = io
        self._files = files
        self.foreign: list[str] = []  # every path refused, in the order met
        self.written: list[str] = []  # every file opened for writing

    def confined(self, location: str, reach: Callable[[TableFiles], T]) -> T:
        """What `reach` does with the table's files for `location`; ForeignPathError (remembered)
        when `location` is not the table's, or leads out of it."""
        try:
            if self._files is None:
                raise OutsideTableError(f"{location!r}: the table's places are not the server's to touch")
            return reach(self._files)
        except OutsideTableError as exc:
            self.foreign.append(location)
            raise ForeignPathError(f"{location} is outside the table: {exc}") from exc

    def check(self, location: str) -> str:
        """`location` if it is the table's, else ForeignPathError (and it is remembered)."""
        return self.confined(location, lambda files: files.check(location))

    def new_input(self, location: str) -> InputFile:
        reached = self.confined(location, lambda files: files.reach(location))
        return _LocalInput(self, location, reached) if reached else self._io.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        reached = self.confined(location, lambda files: files.reach(location))
        self.written.append(location)
        return _LocalOutput(self, location, reached) if reached else self._io.new_output(location)

    def publish(self, location: str, data: bytes) -> None:
        """Write the table's file `location` whole, synced, or not at all, replacing what is there: a
        reader sees it before or after, never in part (an object store's PUT is so; on local disk
        it is written beside and renamed, through handles)."""
        reached = self.confined(location, lambda files: files.reach(location))
        self.written.append(location)
        if reached is None:
            with self._io.new_output(location).create(overwrite=True) as stream:
                stream.write(data)
            return
        self.confined(location, lambda _: replace_below(*reached, location, data, sync=True))

    def names_in(self, folder: str) -> list[str]:
        """The names in the table's local folder `folder`, listed through handles."""
        return self.confined(folder, lambda files: files.names_in(folder))

    def files(self, place: str) -> list[tuple[str, float]]:
        """Every file under the table's local place `place` and its modification time, listed
        through handles (a linked folder is not entered)."""
        return self.confined(place, lambda files: list(files.files(place)))

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        self.confined(path, lambda files: files.delete(path))


class _LocalInput(InputFile):
    """A table's file on local disk, opened through handles each time it is read."""

    def __init__(self, io: ConfinedIO, location: str, reached: Reached) -> None:
        super().__init__(location)
        self._io = io
        self._reached = reached

    def __len__(self) -> int:
        return self._io.confined(self.location, lambda _: stat_below(*self._reached, self.location).st_size)

    def exists(self) -> bool:
        try:
            len(self)
        except FileNotFoundError:
            return False
        return True

    def open(self, seekable: bool = True) -> InputStream:
        found = self._io.confined(self.location, lambda _: open_below(*self._reached, self.location))
        return os.fdopen(found, "rb")


class _LocalOutput(OutputFile):
    """A new file of the table on local disk, created through handles."""

    def __init__(self, io: ConfinedIO, location: str, reached: Reached) -> None:
        super().__init__(location)
        self._io = io
        self._reached = reached

    def __len__(self) -> int:
        return len(self.to_input_file())

    def exists(self) -> bool:
        return self.to_input_file().exists()

    def to_input_file(self) -> InputFile:
        return _LocalInput(self._io, self.location, self._reached)

    def create(self, overwrite: bool = False) -> OutputStream:
        if not overwrite and self.exists():
            raise FileExistsError(f"Cannot create file, already exists: {self.location}")
        reached = self._reached
        found = self._io.confined(self.location, lambda _: open_below(*reached, self.location, write=True))
        return os.fdopen(found, "wb")
