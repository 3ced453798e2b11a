from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from isbre.catalog import CatalogService
from isbre.catalog.warehouses import open_catalog
from isbre.rest.settings import DEFAULT_PORT
from pyiceberg.catalog.rest import RestCatalog

from tests.lineage_receiver import Receiver
from tests.postgres import PostgresServer, binaries, new_database
from tests.server import InProcessServer, IsbreServer

_counter = itertools.count()


# Settings of the test suite itself, not of a server: kept.
SUITE_SETTINGS = frozenset({"ISBRE_CHROMIUM", "ISBRE_CONSOLE_SCREENSHOTS"})


def server_settings(environ: Mapping[str, str]) -> list[str]:
    """The names in `environ` that would configure an isbre server or OpenLineage."""
    return [k for k in environ if k.startswith(("ISBRE_", "OPENLINEAGE")) and k not in SUITE_SETTINGS]


def pytest_configure(config: pytest.Config) -> None:
    """A developer's own isbre and OpenLineage settings stay out of the servers the tests start in
    this process, as `IsbreServer` keeps them out of those it starts as processes."""
    for key in server_settings(os.environ):
        del os.environ[key]


@pytest.fixture(autouse=True)
def no_server_outlives_its_test() -> Iterator[None]:
    """Servers a test started and left running (it failed before stopping them) are killed."""
    before = len(IsbreServer.started)
    yield
    for leftover in IsbreServer.started[before:]:
        leftover.kill()
    del IsbreServer.started[before:]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module with `SERVER_WORKERS = (1, 2)` runs its tests against a server of each size; one
    with `SERVER_STORES = ("lmdb", "postgresql")` also against a server on PostgreSQL (with the
    most workers it asks for)."""
    sizes = getattr(metafunc.module, "SERVER_WORKERS", (1,))
    stores = getattr(metafunc.module, "SERVER_STORES", ("lmdb",))
    if not {"workers", "store_kind"} & set(metafunc.fixturenames) or (len(sizes), len(stores)) == (1, 1):
        return
    variants = [(n, "lmdb") for n in sizes] + [(max(sizes), s) for s in stores if s != "lmdb"]
    ids = [f"{store}-{n}-worker" for n, store in variants]
    metafunc.parametrize(("workers", "store_kind"), variants, ids=ids, scope="module")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers by what a test starts besides a one-process server: `postgres` (a PostgreSQL
    server), `browser` (Chromium), `multi_process` (several workers, or replicas); e.g.
    `pytest -m "not postgres and not browser"` runs the others."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        values = set(map(str, callspec.params.values())) if callspec is not None else set()
        names = set(getattr(item, "fixturenames", ()))
        module = item.module.__name__ if item.module is not None else ""
        if "postgres" in names or "postgresql" in values or module.endswith("test_replicas"):
            item.add_marker(pytest.mark.postgres)
        if "browser" in names:
            item.add_marker(pytest.mark.browser)
        workers = callspec.params.get("workers", 1) if callspec is not None else 1
        if workers > 1 or module.endswith(("test_workers", "test_replicas")):
            item.add_marker(pytest.mark.multi_process)
    # Parallel test processes take whole modules in this order: the longest go first, so that no
    # process is left running one of them after the others have finished.
    items.sort(key=lambda item: _rank(item.module.__name__ if item.module is not None else ""))


# The longest modules (pytest --durations=0, summed per module), longest first.
LONGEST = (
    "test_workers", "test_events", "test_object_storage", "test_console", "test_maintenance",
    "test_replicas", "test_lineage", "test_cli", "test_table_trust", "test_rebased_appends",
    "test_plans_exact", "test_table_feed", "test_fuzz", "test_protocol", "test_swapped_links",
    "test_scan_planning",
)  # fmt: skip


def _rank(module: str) -> int:
    name = module.rpartition(".")[2]
    return LONGEST.index(name) if name in LONGEST else len(LONGEST)


@pytest.fixture(scope="module")
def workers() -> int:
    return 1


@pytest.fixture(scope="module")
def store_kind() -> str:
    return "lmdb"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session; each catalog on it gets a database of its own."""
    if (why := binaries()) is not None:
        pytest.skip(why)
    running = PostgresServer.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def new_store(store_kind: str, request: pytest.FixtureRequest) -> Callable[[], str | None]:
    """Makes the store of a new server: None for the default (LMDB beside its warehouse), or a new
    database's URL."""
    if store_kind == "lmdb":
        return lambda: None
    return lambda: new_database(request)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    workers: int,
    new_store: Callable[[], str | None],
    request: pytest.FixtureRequest,
) -> Iterator[IsbreServer]:
    """One isbre server per test module (per worker count and store); tests keep apart by namespace.
    One worker runs in the test process unless the module says `SERVER_PROCESS = True`."""
    warehouse = tmp_path_factory.mktemp("isbre") / "warehouse"
    kind = IsbreServer if workers > 1 or getattr(request.module, "SERVER_PROCESS", False) else InProcessServer
    running = kind(warehouse, workers=workers, store=new_store()).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """An OpenLineage receiver on loopback, for a module's server to deliver to."""
    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture
def rest_catalog(server: IsbreServer) -> RestCatalog:
    return RestCatalog("isbre", uri=server.url)


@pytest.fixture
def namespace(rest_catalog: RestCatalog, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for one test."""
    name = f"{request.node.name.split('[')[0]}_{next(_counter)}"
    rest_catalog.create_namespace(name)
    return name


@pytest.fixture
def warehouse(server: IsbreServer) -> Path:
    return server.warehouse


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CatalogService]:
    """The catalog in-process, on a fresh warehouse."""
    running = open_catalog(tmp_path / "wh")
    yield running
    running.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MB tmpfs: a disk that fills up in a moment."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="session", autouse=True)
def default_port_taken() -> Iterator[None]:
    """The README has a newcomer keep `make run` going beside `make test`: the suite holds the
    default port itself (where it is free), answering every connection by closing it, so a test
    that counts on 8181 being free, or on nothing answering there, fails here as it would there."""
    try:
        listener = socket.create_server(("127.0.0.1", DEFAULT_PORT))
    except OSError:
        yield  # something holds it already (another test process, or `make run`)
        return
    listener.settimeout(0.2)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                connection, _ = listener.accept()
                connection.close()

    holder = threading.Thread(target=answer, name="default-port-holder", daemon=True)
    holder.start()
    yield
    stop.set()
    holder.join()
    listener.close()
