from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog.rest import RestCatalog

from catalog import CatalogService
from tests.server import IsbreServer


@pytest.fixture(autouse=True)
def no_server_outlives_its_test() -> Iterator[None]:
    """Servers a test started and left running (it failed before stopping them) are killed."""
    before = len(IsbreServer.started)
    yield
    for leftover in IsbreServer.started[before:]:
        leftover.kill()
    del IsbreServer.started[before:]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module with `SERVER_WORKERS = (1, 2)` runs its tests against a server of each size."""
    sizes = getattr(metafunc.module, "SERVER_WORKERS", None)
    if sizes and "workers" in metafunc.fixturenames:
        metafunc.parametrize("workers", sizes, ids=[f"{n}-worker" for n in sizes], scope="module")


@pytest.fixture(scope="module")
def workers() -> int:
    return 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, workers: int) -> Iterator[IsbreServer]:
    """One isbre server per test module (per worker count); tests keep apart by namespace."""
    running = IsbreServer(tmp_path_factory.mktemp("isbre") / "warehouse", workers=workers).start()
    yield running
    running.stop()


@pytest.fixture
def rest_catalog(server: IsbreServer) -> RestCatalog:
    return RestCatalog("isbre", uri=server.url)


_counter = itertools.count()


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
    running = CatalogService.open(tmp_path / "wh")
    yield running
    running.close()
