"""DuckDB with its iceberg extension, installed offline from the extensions' PyPI wheels into the
test's own directory (never the user's ~/.duckdb)."""

from __future__ import annotations

import importlib
from pathlib import Path

import duckdb


def extension_file(name: str) -> Path:
    package = importlib.import_module(f"duckdb_extension_{name}")
    (found,) = Path(package.__path__[0]).glob(f"extensions/*/{name}.duckdb_extension")
    return found


def connect(workdir: Path) -> duckdb.DuckDBPyConnection:
    home = workdir / "duckdb-home"
    config = {
        "extension_directory": str(home / "extensions"),
        "secret_directory": str(home / "secrets"),
        "home_directory": str(home),
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "false",
    }
    home.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(config=config)
    for name in ("httpfs", "avro", "iceberg"):
        con.execute(f"INSTALL '{extension_file(name)}'")
        con.execute(f"LOAD {name}")
    return con
