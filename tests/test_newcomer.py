"""What a newcomer meets first: a clone that tests itself, reports for staged tables, CTAS."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from pyiceberg.catalog import load_catalog

from tests import lineage_receiver, openapi, zygote
from tests.http_client import http
from tests.server import IsbreServer

REPOSITORY = Path(__file__).resolve().parents[1]
# A second `isbre serve` on the server's warehouse names the process that serves it.
SERVER_PROCESS = True


def test_the_specs_the_tests_read_are_inside_the_repository() -> None:
    for spec in (openapi.SPEC, lineage_receiver.SPECS):
        assert spec.exists()
        assert REPOSITORY in spec.resolve().parents, f"{spec} is outside the repository"
    readme = (REPOSITORY / "tests" / "specs" / "README.md").read_text()
    assert "Apache-2.0" in readme and "Upstream commit" in readme


def test_a_metrics_report_for_a_staged_table_is_accepted_and_counted(
    server: IsbreServer, namespace: str
) -> None:
    """Spark's CTAS reports its commit while the table is only staged: the report must not be lost."""
    report = {
        "report-type": "commit-report",
        "table-name": f"{namespace}.staged",
        "snapshot-id": 1,
        "sequence-number": 1,
        "operation": "append",
        "metrics": {},
    }
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/staged/metrics"
    assert http.post(url, json=report).status_code == 204
    counted = [
        line for line in http.get(f"{server.url}/metrics").text.splitlines() if "commit-report" in line
    ]
    assert counted == ['isbre_metrics_reports_total{type="commit-report"} 1']


@pytest.mark.parametrize("events_process", ["true", "false"], ids=["fan-out process", "in process"])
def test_a_stream_sees_every_commit_of_another_process(tmp_path: Path, events_process: str) -> None:
    warehouse = tmp_path / "warehouse"
    server = IsbreServer(warehouse, env={"ISBRE_EVENTS_PROCESS": events_process}).start()
    embedded = load_catalog(
        "local", **{"py-catalog-impl": "isbre.catalog.embedded.LmdbCatalog", "warehouse": str(warehouse)}
    )
    arrived: list[int] = []
    start = server.high_water()
    opened = threading.Event()

    def listen() -> None:
        with http.stream("GET", f"{server.url}/v1/events", params={"after": start}, timeout=30) as stream:
            for line in stream.iter_lines():
                opened.set()  # the retry hint came: the stream is served
                if line.startswith("id: "):
                    arrived.append(int(line[4:]))
                    if len(arrived) == 20:
                        return

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        assert opened.wait(30)
        for i in range(20):
            embedded.create_namespace(f"elsewhere{i}")
        listener.join(timeout=20)
        # How soon they arrive is measured by `make bench` (tests/bench/events.py), not here.
        assert arrived == list(range(start + 1, start + 21)), "the stream missed another process's commits"
    finally:
        embedded.close()
        server.stop()


def test_a_second_server_on_one_warehouse_is_refused_with_a_reason(server: IsbreServer) -> None:
    second = zygote.run(
        [
            sys.executable,
            "-m",
            "isbre.rest.cli",
            "serve",
            "--warehouse",
            str(server.warehouse),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2
    assert "already served" in second.stderr and str(server.process.pid) in second.stderr
    assert "Traceback" not in second.stderr
