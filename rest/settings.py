"""isbre's one settings model: defaults < TOML file < ISBRE_* environment < command-line flags."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from isbre.catalog.change_types import NET_MAX_ROWS
from isbre.catalog.stores import is_database_url
from isbre.events.relay_settings import Relay
from isbre.rest.roles import Role
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

if TYPE_CHECKING:
    from isbre.catalog.warehouse_config import Warehouse

# A warehouse's name is its catalog prefix: one URL path segment.
NAME = r"^[A-Za-z0-9_-]+$"


# Iceberg REST catalogs' customary port (the Java reference's, PyIceberg's examples).
DEFAULT_PORT = 8181


class Principal(BaseModel):
    """Who may call isbre: an OAuth2 client (client_id + secret) or a holder of a static token."""

    model_config = ConfigDict(extra="forbid")

    name: str
    roles: list[Role]
    client_id: str | None = None
    secret_sha256: str | None = Field(None, description="SHA-256 (hex) of the client secret.")
    token_sha256: str | None = Field(None, description="SHA-256 (hex) of a static bearer token.")
    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces (and everything under them) it may use; empty: all."
    )


class AuthSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    token_secret: str | None = Field(
        None, description="Key signing access tokens; without it a random one (tokens end with the process)."
    )
    token_ttl_seconds: int = Field(3600, ge=1)
    principals: list[Principal] = Field(default_factory=list)
    max_failed_logins: int = Field(
        5, ge=1, description="Wrong secrets for one client id within the window before it gets 429."
    )
    failed_login_window_seconds: float = Field(
        60.0, gt=0, description="Window of max_failed_logins, and how long a client then waits."
    )

    @model_validator(mode="after")
    def _unique(self) -> AuthSettings:
        # Two principals with one name would share tokens; one client id for two would pick one at random.
        for what in ("name", "client_id", "token_sha256"):
            values = [getattr(p, what) for p in self.principals if getattr(p, what)]
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"principals share a {what}: {', '.join(twice)}")
        return self


class S3Settings(BaseModel):
    """How the server reaches a warehouse on S3 or an S3-compatible store. Unset fields come from the
    standard AWS chain: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, …"""

    model_config = ConfigDict(extra="forbid")

    endpoint: str | None = Field(None, description="S3 endpoint URL (MinIO, a local store); unset: AWS.")
    region: str | None = Field(None, description="Region of the bucket (default us-east-1).")
    path_style: bool = Field(False, description="Path-style addressing (http://endpoint/bucket/key).")
    access_key_id: str | None = Field(None, description="The server's own access key.")
    secret_access_key: str | None = Field(None, description="The server's own secret key.")
    session_token: str | None = Field(None, description="With temporary server credentials.")


class DelegationSettings(BaseModel):
    """What engines get when they ask for access (X-Iceberg-Access-Delegation) to an S3 table."""

    model_config = ConfigDict(extra="forbid")

    vended_credentials: bool = Field(
        True, description="Hand out STS credentials limited to the table's prefix (needs role_arn)."
    )
    remote_signing: bool = Field(True, description="Sign S3 requests for the table's objects.")
    role_arn: str | None = Field(None, description="The IAM role vended credentials are a session of.")
    sts_endpoint: str | None = Field(None, description="STS endpoint URL; unset: the S3 endpoint, or AWS.")
    credential_seconds: int = Field(
        3600, ge=900, le=43200, description="Lifetime of vended credentials (STS allows 900 to 43200)."
    )


PlanningMode = Literal["client", "server"]
PLANNING_MODE = (
    "`scan-planning-mode` advertised to clients: `server` makes them plan scans on this server "
    "(its CPU, its manifest cache), `client` leaves planning to them (the plan endpoints answer either way)."
)


class WarehouseSettings(BaseModel):
    """A warehouse besides the default one, served under its own prefix."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field(description="A directory, or s3://bucket/prefix.")
    s3: S3Settings = Field(default_factory=S3Settings)
    delegation: DelegationSettings = Field(default_factory=DelegationSettings)
    scan_planning_mode: PlanningMode = Field("client", description=PLANNING_MODE)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ISBRE_", env_nested_delimiter="__", extra="forbid")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    workers: int | None = Field(
        None, ge=1, description="Server processes on the port (default: the cores, up to max_workers)."
    )
    max_workers: int = Field(8, ge=1, description="Cap on the default number of worker processes.")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="Port to listen on (0 picks a free one).")
    warehouse: str = Field(
        "warehouse", description="The default warehouse's root: a directory, or s3://bucket/prefix."
    )
    prefix: str = Field(
        "isbre", pattern=NAME, description="Name and catalog prefix of the default warehouse."
    )
    store: str | None = Field(
        None,
        description="Where the catalog's state lives: an LMDB directory (default: isbre.lmdb in a local "
        "warehouse, else ./isbre.lmdb), or postgresql://user:password@host:port/db, which several "
        "servers can share.",
    )
    state_dir: Path | None = Field(
        None,
        description="This server's own files (its lock, the events socket, worker counters, lineage status); "
        "default: beside an LMDB store, ./isbre-state with a PostgreSQL store.",
    )
    s3: S3Settings = Field(default_factory=S3Settings)
    delegation: DelegationSettings = Field(default_factory=DelegationSettings)
    scan_planning_mode: PlanningMode = Field("client", description=PLANNING_MODE)
    warehouses: dict[str, WarehouseSettings] = Field(
        default_factory=dict, description="More warehouses, by name (their catalog prefix)."
    )
    table_defaults: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Properties a new table gets under its own, by warehouse (`lake`) or by warehouse "
        "and namespace (`lake.raw`); the most specific wins.",
    )
    map_size_mb: int = Field(256, ge=1, description="Initial LMDB map size; it doubles on its own when full.")
    max_batch: int = Field(512, ge=1, description="Most mutations the writer commits in one transaction.")
    metadata_sync_seconds: float = Field(
        1.0,
        ge=0,
        description="How often table metadata files written since are synced together (their bytes "
        "wait in the store until then); 0: each commit syncs its own file.",
    )
    commit_wait_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="How long a store transaction waits for more commits to join it, counted from the "
        "arrival of its oldest: fewer transactions and syncs under load, at most this much later an "
        "answer. 0: a transaction takes the commits waiting and starts.",
    )
    shared_commits: bool = Field(
        True,
        description="With several workers: the server's supervisor runs the store transactions of "
        "every worker's table commits, so that one transaction and one sync hold the commits of them "
        "all; false: each worker groups its own.",
    )
    allowed_locations: list[str] = Field(
        default_factory=list,
        description="Location prefixes (URIs) outside the warehouse where tables and views may live.",
    )
    idempotency_key_lifetime_minutes: int = Field(
        30, ge=1, description="How long a retry may reuse an Idempotency-Key (advertised in /v1/config)."
    )
    max_queue: int = Field(
        10_000, ge=1, description="Mutations that may wait for the writer; beyond it requests get 503."
    )
    max_body_mb: float = Field(32.0, gt=0, description="Largest request body accepted (413 beyond).")
    max_header_kb: int = Field(
        64, ge=1, description="Largest request line and headers together (431 beyond, connection closed)."
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="Time a connection has to send a whole request head (closed after)."
    )
    keepalive_timeout_seconds: int = Field(
        5, ge=1, description="Whole seconds an idle kept-alive connection is held between requests."
    )
    slow_request_seconds: float = Field(
        2.0, ge=0, description="A request answered later than this is logged as a warning (0: never)."
    )
    max_property_value_kb: int = Field(
        256, ge=1, description="Largest value of one table, view or namespace property (400 beyond)."
    )
    max_metadata_mb: float = Field(
        64.0, gt=0, description="Largest table or view metadata file a commit may produce (413 beyond)."
    )
    min_free_disk_mb: int = Field(
        64, ge=0, description="Commits are refused (507) while the warehouse's disk has less free space."
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names served with authentication off, besides loopback and `host`; '*': any.",
    )
    console: bool = Field(True, description="Serve the web console at /ui (read-only, same port and auth).")
    max_page_size: int = Field(1000, ge=1, description="Largest pageSize a list request may ask for.")
    log_level: str = Field("info", description="Python logging level name.")
    auth: AuthSettings = Field(default_factory=AuthSettings)
    allow_insecure_bind: bool = Field(
        False, description="Serve a non-loopback address with authentication off (refused otherwise)."
    )
    events_keepalive_seconds: float = Field(15.0, gt=0, description="Interval of SSE keep-alive comments.")
    events_retry_ms: int = Field(3000, ge=0, description="Reconnect delay suggested to SSE clients.")
    events_process: bool = Field(
        True,
        description="Serve event streams from a process of their own, off the commits' interpreter lock.",
    )
    events_ring_size: int = Field(
        4096, ge=1, description="Recent events held in memory for live subscribers; slower ones read the log."
    )
    events_ring_mb: float = Field(
        64.0, gt=0, description="Most memory the recent events may take; beyond it the oldest are dropped."
    )
    events_retention_records: int = Field(
        10_000_000, ge=1, description="Commit records kept at least; older ones may be trimmed."
    )
    events_retention_days: float = Field(
        30.0, gt=0, description="Age after which commit records may be trimmed."
    )
    lineage_url: str | None = Field(
        None,
        description="OpenLineage HTTP endpoint (Marquez, OpenMetadata); default: OPENLINEAGE_URL.",
    )
    lineage_api_key: str | None = Field(None, description="Bearer token for lineage_url.")
    lineage_transport: dict[str, Any] | None = Field(
        None, description="A full openlineage-python transport configuration; wins over lineage_url."
    )
    lineage_namespace: str | None = Field(
        None,
        description="OpenLineage namespace of isbre's datasets and jobs (default: each warehouse's root).",
    )
    events_trim_interval_seconds: float = Field(
        60.0, gt=0, description="How often the log is checked for trimming."
    )
    plan_page_size: int = Field(
        1000, ge=1, description="File scan tasks in one answer of a scan plan; the rest come as plan tasks."
    )
    change_net_max_rows: int = Field(
        NET_MAX_ROWS,
        ge=0,
        description="The most rows the files of one copy-on-write commit may hold for a change plan to net "
        "out the rows it carried over (they are read in memory); a larger commit's tasks say "
        "`carried-rows-included` and the reader nets them.",
    )
    plan_wait_seconds: float = Field(
        30.0,
        ge=0,
        description="How long a plan request waits for its plan before answering `submitted` (the "
        "client then polls with the plan id).",
    )
    plan_max_filter_terms: int = Field(
        10_000,
        ge=1,
        description="Predicates and values a scan plan request's filter may hold (an `in` list counts each "
        "value); a larger filter gets 400.",
    )
    max_concurrent_plans: int = Field(
        4, ge=1, description="Scan plans one server process works on at once; more wait, then get 503."
    )
    manifest_cache_mb: int = Field(
        256,
        ge=0,
        description="Decoded manifest lists and manifests kept for scan plans and for stale appends made "
        "again, per server process (estimated).",
    )
    maintenance: bool = Field(
        True,
        description="Run table maintenance after commits (tables whose isbre.maintenance.enabled is true).",
    )
    maintenance_interval_seconds: float = Field(
        1.0, gt=0, description="How often the maintenance thread reads the commit log for tables due."
    )
    relays: list[Relay] = Field(
        default_factory=list,
        description="Where the commit log is relayed, each commit once and in order: NATS JetStream "
        "streams and webhooks (`[[relays]]` tables; docs/events.md).",
    )

    @model_validator(mode="after")
    def _warehouse_names(self) -> Settings:
        for name in self.warehouses:
            if not re.match(NAME, name) or name == self.prefix:
                raise ValueError(
                    f"warehouse name {name!r} must be letters, digits, '-' or '_', and not the prefix"
                )
        return self

    @model_validator(mode="after")
    def _relay_names(self) -> Settings:
        names = [relay.key() for relay in self.relays]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"relays share a name (give each a name of its own): {', '.join(twice)}")
        principals = {principal.name for principal in self.auth.principals}
        for relay in self.relays:
            if relay.principal is not None and relay.principal not in principals:
                raise ValueError(f"relay {relay.key()}: no principal {relay.principal!r} in auth.principals")
            unknown = [
                name for name in relay.warehouses if name != self.prefix and name not in self.warehouses
            ]
            if unknown:
                raise ValueError(f"relay {relay.key()}: no warehouse {', '.join(unknown)} is served")
        return self

    def worker_count(self) -> int:
        return self.workers or max(1, min(os.cpu_count() or 1, self.max_workers))

    def served(self) -> list[tuple[str, WarehouseSettings]]:
        """Every warehouse, the default (named `prefix`) first."""
        first = WarehouseSettings(
            root=self.warehouse,
            s3=self.s3,
            delegation=self.delegation,
            scan_planning_mode=self.scan_planning_mode,
        )
        return [(self.prefix, first), *self.warehouses.items()]

    def shares_store(self) -> bool:
        """The store is a database that other servers may share."""
        return self.store is not None and is_database_url(self.store)

    def store_location(self) -> str:
        """The store: a database URL, or the LMDB directory's absolute path."""
        from isbre.catalog.warehouse_config import default_store

        if self.shares_store():
            assert self.store is not None
            return self.store
        path = Path(self.store) if self.store else default_store(_warehouse(self.prefix, self.served()[0][1]))
        return str(path.resolve())

    def state_path(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir.resolve()
        if self.shares_store():
            return Path("isbre-state").resolve()
        return Path(self.store_location()).parent

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: flags (passed as init arguments), then environment, then the TOML file.
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)


# Variables of isbre's that are not settings: the client commands' credentials (a person sets
# them), and what a server hands its own processes.
CLIENT_VARIABLES = frozenset({"ISBRE_TOKEN", "ISBRE_CREDENTIAL"})
NOT_SETTINGS = CLIENT_VARIABLES | {
    "ISBRE_HELPER_STORE",
    "ISBRE_WORKER_SETTINGS",
    "ISBRE_LINEAGE_DELIVERY",
    "ISBRE_RELAY_SETTINGS",
}


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse an `ISBRE_*` variable that names no setting, as the TOML file refuses an unknown key:
    a typo must not leave the server on a default, nor send a client command to the default
    server (ValueError naming the closest variable)."""
    known = {f"ISBRE_{name.upper()}" for name in Settings.model_fields} | CLIENT_VARIABLES
    for key in sorted(environ):
        if not key.startswith("ISBRE_") or key in NOT_SETTINGS:
            continue
        top = key.split("__", 1)[0]
        if top not in known:
            close = difflib.get_close_matches(top, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else " (see docs/configuration.md)"
            raise ValueError(f"unknown setting in the environment: {key}{hint}")


def load_settings(config_file: Path | None = None, **flags: Any) -> Settings:
    """Settings from `config_file` (if any), the environment, and the flags that were given."""
    check_environment(os.environ)
    given = {key: value for key, value in flags.items() if value is not None}
    if config_file is None:
        return Settings(**given)
    if not config_file.is_file():
        raise FileNotFoundError(f"config file not found: {config_file}")

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=config_file)

    try:
        return _FromFile(**given)
    except tomllib.TOMLDecodeError as exc:  # its message has the line, not the file
        raise ValueError(f"{config_file} is not valid TOML: {exc}") from exc


def _warehouse(name: str, settings: WarehouseSettings) -> Warehouse:
    from isbre.catalog.s3_options import S3Options
    from isbre.catalog.warehouse_config import Warehouse

    s3 = settings.s3
    options = S3Options(
        s3.endpoint, s3.region, s3.path_style, s3.access_key_id, s3.secret_access_key, s3.session_token
    )
    return Warehouse(name, settings.root, options)


def warehouses(settings: Settings) -> list[Warehouse]:
    served = [_warehouse(name, each) for name, each in settings.served()]
    defaults: dict[str, dict[tuple[str, ...], dict[str, str]]] = {w.name: {} for w in served}
    for key, properties in settings.table_defaults.items():
        name, *namespace = key.split(".")
        if name not in defaults:
            raise ValueError(f"table_defaults: {key!r} names no warehouse served ({', '.join(defaults)})")
        defaults[name][tuple(namespace)] = properties
    return [dataclasses.replace(w, table_defaults=defaults[w.name]) for w in served]
