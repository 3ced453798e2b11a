"""The FileIO through which the server's own jobs and purges reach a table's files.

Every path such a job opens comes from metadata a client wrote: manifest lists, manifests, data
and delete files. Read with the server's own access, a manifest naming another table's data file
would copy that table's rows into the writer's table, and a manifest list naming `/etc/passwd`
would be opened. Every read, write and delete here first passes the table's own path check
(catalog/deletion.py's `TableFiles`, the one purge uses): under one of the table's places, not in
another table's, and on local disk not led elsewhere by a link. A path that fails it is refused
before anything is opened, and remembered, so that the job can say what it met.
"""

from __future__ import annotations

from isbre.catalog.deletion import OutsideTableError, TableFiles
from pyiceberg.io import FileIO, InputFile, OutputFile


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

    def check(self, location: str) -> str:
        """`location` if it is the table's, else ForeignPathError (and it is remembered)."""
        try:
            if self._files is None:
                raise OutsideTableError(f"{location!r}: the table's places are not the server's to touch")
            return self._files.check(location)
        except OutsideTableError as exc:
            self.foreign.append(location)
            raise ForeignPathError(f"{location} is outside the table: {exc}") from exc

    def new_input(self, location: str) -> InputFile:
        return self._io.new_input(self.check(location))

    def new_output(self, location: str) -> OutputFile:
        output = self._io.new_output(self.check(location))
        self.written.append(location)
        return output

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        self.check(path)
        assert self._files is not None
        self._files.delete(path)
