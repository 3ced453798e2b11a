"""isbre as a user installs it: a wheel built from this checkout, installed into a new virtual
environment, holds one top-level package, `isbre`, and serves, embeds and ingests from there.

The new environment reaches the test environment's other packages through a path file (no
download), but not its editable install of this checkout, and runs outside the checkout, so
nothing is imported from the repository's folders.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from pathlib import Path

import httpx

from tests.http_client import http
from tests.server import free_port
from tests.test_layers import PACKAGES

ROOT = Path(__file__).parent.parent


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_built_wheel_installs_one_package_that_serves_embeds_and_ingests(tmp_path: Path) -> None:
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        tmp_path,
    )
    (wheel,) = tmp_path.glob("isbre-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"isbre"}
    # Every module of the folders, subpackages too (a package missing from pyproject.toml's list is
    # left out of the wheel, and only a fresh install shows it).
    sources = {
        f"isbre/{path.relative_to(ROOT).as_posix()}"
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert sources - set(names) == set()

    environment = tmp_path / "env"
    venv.create(environment, with_pip=False)
    python = environment / "bin" / "python"
    site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path
        ).stdout.strip()
    )
    (site / "test-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        tmp_path,
    )
    where = run([str(python), "-c", "import isbre.rest; print(isbre.rest.__file__)"], tmp_path).stdout
    assert where.startswith(str(site / "isbre" / "rest")), where

    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    server = subprocess.Popen(
        [
            str(environment / "bin" / "isbre"),
            "serve",
            "--warehouse",
            str(work / "served"),
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline
            try:
                if http.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert http.get(f"{url}/ui/").status_code == 200  # the console's files are in the wheel
        (work / "rows.csv").write_text("id,amount\n1,1.5\n2,2\n")
        isbre = str(environment / "bin" / "isbre")
        run(
            [isbre, "ingest", "rows.csv", "--table", "landing.rows", "--uri", url, "--source-id", "wheel"],
            work,
        )
        loaded = http.get(f"{url}/v1/isbre/namespaces/landing/tables/rows").json()
        assert loaded["metadata"]["current-snapshot-id"] is not None
    finally:
        server.terminate()
        server.wait(timeout=30)

    embedded = (
        "from pyiceberg.catalog import load_catalog\n"
        "import pyarrow as pa\n"
        "impl = {'py-catalog-impl': 'isbre.catalog.embedded.LmdbCatalog', 'warehouse': 'embedded'}\n"
        "catalog = load_catalog('local', **impl)\n"
        "catalog.create_namespace('demo')\n"
        "table = catalog.create_table('demo.t', pa.schema([('id', pa.int64())]))\n"
        "table.append(pa.table({'id': [1, 2, 3]}))\n"
        "print(len(catalog.load_table('demo.t').scan().to_arrow()))\n"
    )
    assert (
        run([str(python), "-c", embedded], work, env={**os.environ, "PYTHONPATH": ""}).stdout.strip() == "3"
    )
