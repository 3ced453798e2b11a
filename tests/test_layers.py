"""The packages' imports (as `isbre.catalog`, `isbre.rest`, ...) point one way: `catalog` at the
bottom imports none of the others, and no two packages import each other, directly or round a
longer cycle. Read from the source, so an import inside a function counts too."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("catalog", "rest", "events", "lineage", "sinks", "console")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("isbre", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _imported(path: Path) -> Iterator[str]:
    """Every module name an import in `path` names (at module level, in a function, under
    TYPE_CHECKING alike), and for `from m import n` also `m.n`, which may be a module."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def sources() -> dict[str, Path]:
    """isbre's modules by name (isbre.catalog.store, ...), each with its file."""
    return {
        _module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
    }


def module_imports() -> dict[str, set[str]]:
    """module -> the isbre modules it imports."""
    modules = sources()
    graph = {}
    for name, path in modules.items():
        found = set()
        for imported in _imported(path):
            # Installed as isbre.<package>; a bare `catalog` would be another copy of it.
            assert imported.split(".")[0] not in PACKAGES, f"{path}: import {imported}, not isbre.{imported}"
            if imported in modules and imported != name:
                found.add(imported)
        graph[name] = found
    return graph


def imports_between_packages() -> dict[str, dict[str, list[str]]]:
    """package -> package it imports -> the files that do."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    files = sources()
    for module, imported in module_imports().items():
        package = module.split(".")[1]
        for target in sorted({name.split(".")[1] for name in imported} - {package}):
            found[package][target].append(str(files[module].relative_to(ROOT)))
    return found


def test_no_module_imports_itself_round_a_cycle() -> None:
    """Inside a package too: a cycle through an import in a function or under TYPE_CHECKING is a
    cycle a reader has to hold in mind all the same."""
    try:
        TopologicalSorter(module_imports()).prepare()
    except CycleError as cycle:
        raise AssertionError(f"module import cycle: {' -> '.join(cycle.args[1])}") from None


MAX_LINES = 500
# The catalog's modules are what a maintainer reads to follow a commit (docs/commit-flow.md).
MAX_CATALOG_LINES = 400


def test_every_module_fits_on_a_few_screens() -> None:
    lines = {name: len(path.read_text().splitlines()) for name, path in sources().items()}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"
    catalog = {
        name: n for name, n in lines.items() if name.startswith("isbre.catalog.") and n > MAX_CATALOG_LINES
    }
    assert catalog == {}, f"catalog modules over {MAX_CATALOG_LINES} lines: {catalog}"


def test_catalog_imports_nothing_above_it() -> None:
    assert dict(imports_between_packages()["catalog"]) == {}


def test_no_two_packages_import_each_other() -> None:
    graph = imports_between_packages()
    try:
        TopologicalSorter({p: set(graph[p]) for p in PACKAGES}).prepare()
    except CycleError as cycle:
        packages = cycle.args[1]
        files = {f"{a} -> {b}": graph[a][b] for a, b in pairwise(packages)}
        raise AssertionError(f"import cycle {' -> '.join(packages)}: {files}") from None


def test_the_layers_are_the_documented_ones() -> None:
    """What README.md's layout says: rest on top, catalog at the bottom, the others between."""
    graph = imports_between_packages()
    assert set(graph["rest"]) >= {"catalog", "events", "lineage", "sinks"}  # the imports were read
    for package in ("events", "lineage", "sinks", "console"):
        assert set(graph[package]) <= {"catalog"}, (package, dict(graph[package]))
    assert "rest" not in {target for targets in graph.values() for target in targets}


TABLES = ("pyarrow", "pyiceberg")
# The server's side of the catalog: its store, its writer, the operations that commit, the app.
SERVER = (
    "isbre.catalog.store",
    "isbre.catalog.writer",
    "isbre.catalog.service_core",
    "isbre.catalog.table_commit",
    "isbre.catalog.table_operations",
    "isbre.catalog.embedded",
    "isbre.rest.app",
)


@pytest.mark.parametrize(
    ("module", "left_out"),
    [
        # A consumer of the log (a tool reading records, the events fan-out process that a server
        # restarts when it dies) does not pay for the table machinery (a second of start-up).
        ("isbre.catalog.records", TABLES),
        ("isbre.events.fanout_process", TABLES),
        # A server and each of its workers load openlineage-python only in the lineage worker's
        # process, when lineage is on (a fifth of a second for every process).
        ("isbre.rest.serve", ("openlineage",)),
        ("isbre.rest.app", ("openlineage",)),
        # A client is not a server: a feed, the event stream's reader and the command line load none
        # of the server's side (a feed's name rules live where both read them: catalog.identifiers).
        ("isbre.events.table_feed", SERVER),
        # Nor is a sink, a pipeline or `isbre ingest`: they reach a catalog over REST, or open an
        # embedded one (the server's side, loaded then) when they are given a warehouse directory.
        ("isbre.sinks.iceberg", SERVER),
        ("isbre.sinks.pipeline", SERVER),
        ("isbre.sinks.ingest", SERVER),
        ("isbre.events.client", (*SERVER, *TABLES)),
        ("isbre.rest.cli", (*SERVER, *TABLES, "fastapi")),
        # `isbre serve` checks its settings before it loads the server: a mistake is answered at once.
        ("isbre.rest.settings", (*TABLES, "fastapi", "openlineage")),
    ],
)
def test_a_process_loads_only_what_it_uses(module: str, left_out: tuple[str, ...]) -> None:
    check = f"import sys, {module}; print(sorted({set(left_out)!r} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
