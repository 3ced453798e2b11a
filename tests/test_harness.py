"""The test harness itself: what a test run starts does not outlive it, however the run ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import zygote
from tests.http_client import http
from tests.postgres import binaries
from tests.server import IsbreServer
from tests.waiting import eventually
from tests.zygote import ForkedProcess

ROOT = Path(__file__).parent.parent

# A test run that starts an isbre server and a PostgreSQL server, then dies as a run killed by a
# time limit does: no teardown runs.
KILLED_RUN = """
import json, os, signal, sys
from pathlib import Path
from tests.postgres import PostgresServer
from tests.server import IsbreServer

home = Path(sys.argv[1])
isbre = IsbreServer(home / "warehouse").start()
postgres = PostgresServer.start()
(home / "started.json").write_text(json.dumps(
    {"isbre": isbre.process.pid, "postgres_port": postgres.port, "postgres_home": str(postgres.home)}
))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(binaries() is not None, reason=str(binaries()))
def test_servers_of_a_killed_test_run_are_stopped(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_RUN), str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == -9, run.stderr
    started = json.loads((tmp_path / "started.json").read_text())
    eventually(lambda: not _running(started["isbre"]), "the isbre server ended with its test run")
    eventually(lambda: not _answers(started["postgres_port"]), "PostgreSQL ended with its test run")
    eventually(
        lambda: not Path(started["postgres_home"]).exists(), "PostgreSQL's files went with its test run"
    )


def test_a_forked_server_is_a_process_of_its_own_with_its_settings_and_exit_status(tmp_path: Path) -> None:
    """What the zygote forks behaves as the `python -m isbre.rest.cli serve` it stands for: a
    session of its own, the environment it was given (and no setting of the zygote's own), its
    exit status on a signal; one that needs a new interpreter gets one."""
    forked = IsbreServer(tmp_path / "forked", env={"ISBRE_CONSOLE": "false"}).start()
    fresh = IsbreServer(tmp_path / "fresh", env={"PYTHONINTMAXSTRDIGITS": "640"}).start()
    assert isinstance(forked.process, ForkedProcess) and isinstance(fresh.process, subprocess.Popen)
    for server in (forked, fresh):
        assert os.getsid(server.pid) == server.pid != os.getpid()
    assert http.get(f"{forked.url}/ui/").status_code == 404  # its ISBRE_CONSOLE, read at run time
    assert http.get(f"{fresh.url}/ui/").status_code == 200
    forked.process.send_signal(signal.SIGKILL)
    assert forked.process.wait(timeout=30) == -signal.SIGKILL
    fresh.stop()
    assert fresh.process.returncode == -signal.SIGTERM  # as uvicorn ends on SIGTERM, forked or not


FORKED_COMMAND = """
import os, sys
print(sys.argv[1:], os.getcwd(), os.environ.get("ISBRE_PROBE"), sys.path[0] == "", sys.stdin.read())
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_command_runs_as_python_would_run_it(tmp_path: Path) -> None:
    """`python -c CODE ARGS` forked: its arguments, directory, environment, input, both outputs and
    exit status as a new interpreter gives them; `python -m` runs the module as `__main__`."""
    env = {**os.environ, "ISBRE_PROBE": "here"}
    command = [sys.executable, "-c", FORKED_COMMAND, "3", "two words"]
    forked = zygote.popen(
        command,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert isinstance(forked, ForkedProcess)
    out, err = forked.communicate("fed in", timeout=60)
    expected = subprocess.run(
        command, env=env, cwd=tmp_path, input="fed in", capture_output=True, text=True, timeout=60
    )
    assert (forked.returncode, out, err) == (expected.returncode, expected.stdout, expected.stderr)
    assert out == f"['3', 'two words'] {tmp_path} here True fed in\n" and forked.returncode == 3
    usage = zygote.run(
        [sys.executable, "-m", "isbre.rest.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 0 and usage.stdout.startswith("usage: isbre") and usage.stderr == ""
    merged = zygote.run(
        [*command[:3], "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    assert merged.stdout.endswith("to stderr\n") and merged.stderr is None
