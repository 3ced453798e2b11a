"""What a table's properties may make the server do: data it reads against an allow-list, never
code it loads.

Table properties are written by whoever may commit to the table. PyIceberg turns some of them
into imports (`write.py-location-provider.impl` names a class it imports and calls), and the Java
library more (`io-impl`, `write.location-provider.impl`, ...). A server that handed a table's
properties to PyIceberg as they are would run whatever module a writer named, as the server. So:

- a commit, create or register that sets a property naming code is refused, naming the property;
- whatever a server process builds from table metadata (its jobs' writers, location providers,
  snapshot producers) sees only the properties on `HONOURED` below: a property stored before it
  was refused, or one PyIceberg learns to read later, never reaches PyIceberg there;
- the location provider is built here from those properties, not looked up by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pyiceberg.table.locations import LocationProvider, ObjectStoreLocationProvider, SimpleLocationProvider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.properties import property_as_bool

# Where a table's files go besides its location: Iceberg's data-path properties (the Java library
# reads the deprecated two when `write.data.path` is unset) and its metadata path.
METADATA_PATH = "write.metadata.path"
DATA_PATH = "write.data.path"
OBJECT_STORAGE_PATH = "write.object-storage.path"
FOLDER_STORAGE_PATH = "write.folder-storage.path"
PLACE_PROPERTIES = (METADATA_PATH, DATA_PATH, OBJECT_STORAGE_PATH, FOLDER_STORAGE_PATH)
OBJECT_STORAGE_ENABLED = "write.object-storage.enabled"

# The properties the server passes on to PyIceberg when it writes a table's files itself: how to
# lay out and encode them, where they go (checked at every commit), when to merge manifests.
HONOURED = frozenset(
    {
        "write.target-file-size-bytes",
        "write.format.default",
        "write.avro.compression-codec",
        "write.summary.partition-limit",
        OBJECT_STORAGE_ENABLED,
        "write.object-storage.partitioned-paths",
        *PLACE_PROPERTIES,
        "schema.name-mapping.default",
        "commit.manifest.target-size-bytes",
        "commit.manifest.min-count-to-merge",
        "commit.manifest-merge.enabled",
        "write.metadata.previous-versions-max",
        "write.metadata.delete-after-commit.enabled",
    }
)
HONOURED_PREFIXES = ("write.parquet.", "write.metadata.metrics.", "history.expire.", "isbre.")

# A property naming code to load: Java's `*-impl`/`*.impl` (io-impl, write.location-provider.impl,
# metrics-reporter-impl, ...) and every `py-` property of PyIceberg (py-io-impl,
# write.py-location-provider.impl).
_NAMES_CODE = re.compile(r"(^|[.-])impl$|(^|\.)py-", re.IGNORECASE)


class CodePropertyError(ValueError):
    """A property that would name code for a reader to load."""


def names_code(key: str) -> bool:
    return _NAMES_CODE.search(key) is not None


def check_no_code(keys: Iterable[str], what: str = "Table") -> None:
    """Refuse properties that name code to load (ValueError: 400)."""
    for key in keys:
        if names_code(key):
            raise CodePropertyError(
                f"{what} property {key!r} names code to load, which this catalog never sets or "
                "honours: properties ending in 'impl' and 'py-' properties are refused"
            )


def honoured(key: str) -> bool:
    return key in HONOURED or key.startswith(HONOURED_PREFIXES)


def honoured_properties(properties: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in properties.items() if honoured(key)}


def honoured_metadata(metadata: TableMetadata) -> TableMetadata:
    """`metadata` as a server process hands it to PyIceberg: only the honoured properties."""
    kept = honoured_properties(metadata.properties)
    if len(kept) == len(metadata.properties):
        return metadata
    return metadata.model_copy(update={"properties": kept})


def location_provider(location: str, properties: Mapping[str, str]) -> LocationProvider:
    """Where new files of the table at `location` go, as PyIceberg's own providers place them
    (object-storage layout when `write.object-storage.enabled`), never a provider a property names."""
    kept = honoured_properties(properties)
    if property_as_bool(kept, OBJECT_STORAGE_ENABLED, False):
        return ObjectStoreLocationProvider(location, kept)
    return SimpleLocationProvider(location, kept)


# Whether the catalog makes a stale fast append again on the branch's head (catalog/append_rebase.py).
REBASE_APPENDS = "isbre.commit.rebase-appends"
