"""The packages' imports (as `isbre.catalog`, `isbre.rest`, ...) point one way: `catalog` at the
bottom imports none of the others, and no two packages import each other, directly or round a
longer cycle. Read from the source, so an import inside a function counts too."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("catalog", "rest", "events", "lineage", "sinks", "console")


def imports_between_packages() -> dict[str, dict[str, list[str]]]:
    """package -> package it imports -> the files that do."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    parts = name.split(".")
                    # Installed as isbre.<package>; a bare `catalog` would be another copy of it.
                    assert parts[0] not in PACKAGES, f"{path}: import {name}, not isbre.{name}"
                    if parts[0] == "isbre" and len(parts) > 1 and parts[1] != package:
                        found[package][parts[1]].append(str(path.relative_to(ROOT)))
    return found


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
        # `isbre serve` checks its settings before it loads the server: a mistake is answered at once.
        ("isbre.rest.settings", (*TABLES, "fastapi", "openlineage")),
    ],
)
def test_a_process_loads_only_what_it_uses(module: str, left_out: tuple[str, ...]) -> None:
    check = f"import sys, {module}; print(sorted({set(left_out)!r} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
