"""The table properties that say how the catalog maintains a table, read as Iceberg reads them
(`history.expire.*`, `write.metadata.*`, `commit.manifest.*`) with isbre's own beside them
(`isbre.maintenance.*`, `isbre.consumers.*`): their names, defaults and checks. Every commit checks
them (catalog/table_commit.py); catalog/maintenance.py applies them.
"""

from __future__ import annotations

from isbre.catalog.compaction import COMPACT_ENABLED, MIN_INPUT_FILES, TARGET_FILE_SIZE
from isbre.catalog.table_properties import REBASE_APPENDS

MAX_SNAPSHOT_AGE_MS = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_TO_KEEP = "history.expire.min-snapshots-to-keep"
MAX_REF_AGE_MS = "history.expire.max-ref-age-ms"
DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"
ENABLED = "isbre.maintenance.enabled"
ORPHAN_MIN_AGE_MS = "isbre.maintenance.orphan-files.min-age-ms"
ORPHAN_INTERVAL_MS = "isbre.maintenance.orphan-files.interval-ms"
# How far behind a table's consumers may fall and still keep the snapshots they have not read
# from expiry (as PostgreSQL bounds what a replication slot holds back): the age of the oldest of
# them, and their number. A consumer past either is left behind: its plans then answer 410.
CONSUMER_MAX_LAG_MS = "isbre.consumers.max-lag-ms"
CONSUMER_MAX_SNAPSHOTS = "isbre.consumers.max-snapshots"
DEFAULT_CONSUMER_MAX_LAG_MS = 7 * 24 * 3600 * 1000
DEFAULT_CONSUMER_MAX_SNAPSHOTS = 10_000
# Iceberg's own: an append merges manifests once there are this many (the sink's, when enabled);
# for the catalog, a table holding this many is due for `rewrite-manifests`.
MIN_COUNT_TO_MERGE = "commit.manifest.min-count-to-merge"
DEFAULT_MIN_COUNT_TO_MERGE = 100

# Iceberg's defaults: five days of snapshots, at least one; refs kept forever; 100 old versions.
DEFAULT_MAX_SNAPSHOT_AGE_MS = 5 * 24 * 3600 * 1000
DEFAULT_MIN_SNAPSHOTS_TO_KEEP = 1
DEFAULT_PREVIOUS_VERSIONS_MAX = 100

# A table an isbre sink provisions says so; the catalog gives it STREAMING_DEFAULTS where the sink
# sets none of its own.
SINK_MANAGED = "isbre.sink.managed"
# One commit a second keeps at most ~600 snapshots (ten minutes of time travel), and 20 old
# metadata files: the metadata a commit rewrites stays small. A sink's exactly-once coverage
# lives in the catalog's index, not in old snapshots, so expiring them changes none of it.
STREAMING_DEFAULTS = {
    ENABLED: "true",
    MAX_SNAPSHOT_AGE_MS: str(10 * 60 * 1000),
    MIN_SNAPSHOTS_TO_KEEP: "20",
    DELETE_AFTER_COMMIT: "true",
    PREVIOUS_VERSIONS_MAX: "20",
    # The sink then merges small manifests as it appends, once there are 10 (Iceberg's default
    # is 100): a scan plans over a few manifests, not one per commit.
    "commit.manifest-merge.enabled": "true",
    MIN_COUNT_TO_MERGE: "10",
    # And the catalog compacts its small data files, once 50 have piled up in a partition: at a
    # commit a second, a job process a minute or so; a scan opens at most about as many files.
    COMPACT_ENABLED: "true",
    MIN_INPUT_FILES: "50",
}

# A file younger than this may be a commit's, written and not yet committed (Iceberg's own
# remove-orphan-files waits as long by default).
DEFAULT_ORPHAN_MIN_AGE_MS = 3 * 24 * 3600 * 1000
# remove-orphan-files lists the table and reads every manifest it keeps: after commits, the
# catalog runs it on a table once a day (Iceberg's guidance is daily or weekly).
DEFAULT_ORPHAN_INTERVAL_MS = 24 * 3600 * 1000

_POSITIVE = (
    MAX_SNAPSHOT_AGE_MS,
    MIN_SNAPSHOTS_TO_KEEP,
    MAX_REF_AGE_MS,
    PREVIOUS_VERSIONS_MAX,
    ORPHAN_MIN_AGE_MS,
    ORPHAN_INTERVAL_MS,
    MIN_COUNT_TO_MERGE,
    TARGET_FILE_SIZE,
    MIN_INPUT_FILES,
    CONSUMER_MAX_LAG_MS,
    CONSUMER_MAX_SNAPSHOTS,
)
_BOOLEAN = (DELETE_AFTER_COMMIT, ENABLED, COMPACT_ENABLED, REBASE_APPENDS)


class InvalidPolicyError(ValueError):
    """A maintenance property's value is not one the catalog can apply."""


def check_policy(properties: dict[str, str]) -> None:
    """Refuse a maintenance property whose value the catalog could not apply, naming it."""
    for key in _POSITIVE:
        if key in properties:
            value = properties[key]
            if not value.isdigit() or int(value) < 1:
                raise InvalidPolicyError(
                    f"Table property {key} must be a whole number above 0, not {value!r}"
                )
    for key in _BOOLEAN:
        if key in properties and properties[key].lower() not in ("true", "false"):
            raise InvalidPolicyError(f"Table property {key} must be true or false, not {properties[key]!r}")


def with_streaming_defaults(properties: dict[str, str]) -> dict[str, str]:
    """A new table's properties: a sink-provisioned one's with the streaming defaults under them."""
    if properties.get(SINK_MANAGED) != "true":
        return properties
    return {**STREAMING_DEFAULTS, **properties}


def enabled(properties: dict[str, str]) -> bool:
    return properties.get(ENABLED, "false").lower() == "true"


def consumer_bounds(properties: dict[str, str]) -> tuple[int, int]:
    """(max lag in ms, max snapshots) a table's consumers are held within."""
    return (
        int_property(properties, CONSUMER_MAX_LAG_MS, DEFAULT_CONSUMER_MAX_LAG_MS),
        int_property(properties, CONSUMER_MAX_SNAPSHOTS, DEFAULT_CONSUMER_MAX_SNAPSHOTS),
    )


def int_property(properties: dict[str, str], key: str, default: int) -> int:
    return int(properties.get(key, default))


def orphan_min_age_ms(properties: dict[str, str]) -> int:
    return int_property(properties, ORPHAN_MIN_AGE_MS, DEFAULT_ORPHAN_MIN_AGE_MS)


def orphan_interval_ms(properties: dict[str, str]) -> int:
    return int_property(properties, ORPHAN_INTERVAL_MS, DEFAULT_ORPHAN_INTERVAL_MS)


def min_count_to_merge(properties: dict[str, str]) -> int:
    return int_property(properties, MIN_COUNT_TO_MERGE, DEFAULT_MIN_COUNT_TO_MERGE)
