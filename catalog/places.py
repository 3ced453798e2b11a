"""Where a warehouse's tables and views may live, and which files are whose.

Every table and view has places (its location, and the properties that send files elsewhere:
`named_places`); the store indexes each place under the object's uuid, so
that no two objects share one and no object lives in or around the store's own files. A create,
a register or a move is checked here before anything is written, and claimed again in the
commit's own transaction (another process may have claimed the place meanwhile). The catalog's
own jobs (purge, maintenance, plans, appends made again) reach a table's files only through its
places (`files_of`, `confined_io`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from isbre.catalog.confined_io import ConfinedIO
from isbre.catalog.deletion import TableFiles
from isbre.catalog.identifiers import path_segment
from isbre.catalog.locations import LocationNotAllowedError, LocationPolicy, inside, normalized
from isbre.catalog.store import ReadView, Store, WriteView
from isbre.catalog.table_properties import METADATA_PATH, PLACE_PROPERTIES
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)

# A place of a table or view: what names it ("location", or the property that sets it), and where.
Place = tuple[str, str]

# The location index holds an object's location under its uuid, and each other place under its
# uuid with a suffix: `#metadata` for `write.metadata.path`, `#<property>` for the data paths.
_SUFFIXES = {"location": "", METADATA_PATH: "#metadata"}


def named_places(location: str, properties: Mapping[str, str]) -> tuple[Place, ...]:
    """Where a table's or view's files go: its location, then each of the properties that send
    files elsewhere (`write.metadata.path`, the data paths) that is set."""
    found = [("location", location.rstrip("/"))]
    found += [(key, path) for key in PLACE_PROPERTIES if (path := properties.get(key, "").rstrip("/"))]
    return tuple(found)


def places_of(location: str, properties: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(place for _, place in named_places(location, properties))


def _place_suffix(name: str) -> str:
    return _SUFFIXES.get(name, f"#{name}")


def object_of(owner: str) -> str:
    """The uuid of the table or view that holds an indexed place."""
    return owner.split("#", 1)[0]


def unplace(view: WriteView, owner: str) -> None:
    for name in ("location", *PLACE_PROPERTIES):
        view.unplace(owner + _place_suffix(name))


def claim(
    view: WriteView, owner: str, location: str, what: str, moving: bool = True, mine: tuple[str, ...] = ()
) -> None:
    """Index `location` as `owner`'s, unless another table or view lives in, at or around it.

    `moving`: `owner` is already in the catalog and changes its place (its old place, and its
    other places, are no conflict); otherwise any object found there is another, even one with
    the same uuid, but for the places in `mine` (claimed by the same call)."""
    found = normalized(location)
    for other, other_owner in view.overlapping(found):
        if object_of(other_owner) != object_of(owner) or not (moving or other_owner in mine):
            raise LocationNotAllowedError(
                f"{what} {location!r} overlaps the files of another table or view, at {other}"
            )
    view.place(owner, found)


def claim_places(
    view: WriteView, owner: str, where: tuple[Place, ...], what: str, moving: bool = True
) -> None:
    """Index every place of the object `owner` (its location first), and forget those it no
    longer has."""
    claimed: tuple[str, ...] = ()
    for name, place in where:
        held = owner + _place_suffix(name)
        claim(view, held, place, f"{what} {name}", moving, claimed)
        claimed += (held,)
    for name in PLACE_PROPERTIES:
        if owner + _place_suffix(name) not in claimed:
            view.unplace(owner + _place_suffix(name))


class Places:
    """One warehouse's places: its root, the locations allowed (`policy`), and the store's own
    files (`protected`), which no table or view may be in or around."""

    def __init__(
        self,
        store: Store,
        scope: str,
        warehouse: str,
        io: FileIO,
        allowed_locations: tuple[str, ...] = (),
        protected: tuple[str, ...] = (),
    ) -> None:
        """`io`: the warehouse's FileIO, which `files_of` and `confined_io` confine."""
        self.store = store
        self.io = io
        self.scope = scope
        self.warehouse = warehouse.rstrip("/")
        self.policy = LocationPolicy.of(self.warehouse, allowed_locations)
        self.protected = tuple(normalized(location) for location in protected)

    def namespace_location(self, namespace: tuple[str, ...], view: ReadView | None = None) -> str:
        """Where the namespace's tables go by default: its `location` property, or under the warehouse."""
        if view is None:
            with self.store.read(self.scope) as view:
                properties = view.namespace(namespace) or {}
        else:
            properties = view.namespace(namespace) or {}
        default = "/".join((self.warehouse, *(path_segment(level) for level in namespace)))
        return properties.get("location", "").rstrip("/") or default

    def check_protected(self, location: str, what: str) -> None:
        found = normalized(location)
        for place in self.protected:
            if inside(found, place) or inside(place, found):
                raise LocationNotAllowedError(f"{what} {location!r} is in or around the catalog's own store")

    def check(
        self, location: str, what: str, policy: LocationPolicy | None, writes_to: str | None = ""
    ) -> None:
        """Where a table or view may live: allowed (by `policy`, the caller's, or the catalog's), and
        away from the store. `writes_to`: for a place isbre is about to write a metadata file in,
        the object moving there ("" for a new one): the place must not be in or around another
        object's before anything is written (the commit claims it again, `claim`); None for a
        register, which writes nothing."""
        (policy or self.policy).check(location, what)
        self.check_protected(location, what)
        if writes_to is None:
            return
        with self.store.read(self.scope) as view:
            others = [
                place
                for place, holder in view.overlapping(normalized(location))
                if object_of(holder) != writes_to
            ]
        if others:
            raise LocationNotAllowedError(
                f"{what} {location!r} overlaps the files of another table or view, at {others[0]}"
            )

    def check_all(
        self, where: tuple[Place, ...], what: str, policy: LocationPolicy | None, writes_to: str | None = ""
    ) -> None:
        """`check` for each place of a table or view (`table_staging.named_places`)."""
        for name, place in where:
            self.check(place, f"{what} {name}", policy, writes_to)

    def claimed_by_other(self, location: str, owner: str | None) -> bool:
        """Whether another object than `owner` (None: any) holds a place in, at or around `location`."""
        with self.store.read(self.scope) as view:
            return any(object_of(holder) != owner for _, holder in view.overlapping(location))

    def deletable(self, place: str, owner: str | None) -> bool:
        """Whether the catalog may delete files at `place` for `owner`: allowed, away from the store,
        and no other object's."""
        try:
            self.policy.check(place)
            self.check_protected(place, "Place")
            return not self.claimed_by_other(normalized(place), owner)
        except LocationNotAllowedError:
            return False

    def files_of(self, metadata: TableMetadata, owner: str | None = None) -> TableFiles | None:
        """The deleter of a table's files (None when its location may not be deleted from); `owner`:
        the table's uuid while it is in the catalog (a dropped one is no longer indexed: anyone
        found at a place is another)."""

        def claimed_by_other(location: str) -> bool:
            return self.claimed_by_other(location, owner)

        try:
            # A place property stored before it was checked as it is now counts only if it passes.
            location, *more = places_of(metadata.location, metadata.properties)
            where = [location, *(place for place in more if self.deletable(place, owner))]
            return TableFiles(self.io, where, self.policy.roots, self.protected, claimed_by_other)
        except LocationNotAllowedError as exc:
            log.warning("purge deletes nothing at %s: %s", metadata.location, exc)
            return None

    def confined_io(self, metadata: TableMetadata) -> ConfinedIO:
        """The FileIO the server's own jobs reach the table's files through: its files alone."""
        return ConfinedIO(self.io, self.files_of(metadata, owner=str(metadata.table_uuid)))
