"""The `isbre` command as a person meets it: a version, sentences instead of tracebacks, credentials
from the environment, retries that say so, and a quick start."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from isbre.events.client import subscribe
from isbre.rest.auth import sha256_hex

from tests import zygote
from tests.http_client import http
from tests.server import COMMIT_TIMEOUT, InProcessServer, IsbreServer, free_port, secured_server
from tests.waiting import eventually

PRINCIPALS = [
    {"name": "bi", "roles": ["reader"], "client_id": "bi", "secret_sha256": sha256_hex("bi-secret")},
    {"name": "svc", "roles": ["reader"], "token_sha256": sha256_hex("static-token")},
    {"name": "root", "roles": ["admin"], "token_sha256": sha256_hex("root-token")},
]
ROOT = {"Authorization": "Bearer root-token"}


def isbre(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ISBRE_")}
    return zygote.run(
        [sys.executable, "-m", "isbre.rest.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **(env or {})},
    )


def one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and all(word in lines[-1] for word in words), result.stderr


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    server = secured_server(
        tmp_path_factory.mktemp("cli") / "warehouse", PRINCIPALS, ISBRE_AUTH__TOKEN_TTL_SECONDS="2"
    )
    yield server
    server.stop()


def test_version() -> None:
    result = isbre("--version")
    assert result.returncode == 0
    assert result.stdout.strip().startswith("isbre 0.")


def test_help_version_and_tail_import_nothing_heavy() -> None:
    """What made `isbre --help` take seconds: importing the server, PyIceberg and PyArrow first."""
    probe = (
        "import sys; from rest.cli import build_parser; build_parser().parse_args(['events', 'tail']); "
        "print(sorted(m for m in ('pyiceberg', 'pyarrow', 'fastapi', 'uvicorn', 'lmdb') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["serve", "--port", "99999"], {}, ["port 99999"]),
        (["serve"], {"ISBRE_PORT": "abc"}, ["'port'", "abc"]),
        (["serve", "--config", "{config}"], {}, ["unknown setting 'prot'"]),
        (["serve", "--config", "/nonexistent/isbre.toml"], {}, ["config file not found"]),
        (["serve"], {"ISBRE_PROT": "9999"}, ["unknown setting", "ISBRE_PROT", "did you mean ISBRE_PORT?"]),
        (["serve"], {"ISBRE_LINEAGE_ULR": "http://x"}, ["ISBRE_LINEAGE_ULR", "ISBRE_LINEAGE_URL"]),
        (["tail", "demo.events"], {"ISBRE_PORTT": "{port}"}, ["ISBRE_PORTT", "did you mean ISBRE_PORT?"]),
        (["events", "tail"], {"ISBRE_TOKNE": "x"}, ["ISBRE_TOKNE", "did you mean ISBRE_TOKEN?"]),
        (["lineage", "status"], {"ISBRE_HOTS": "x"}, ["ISBRE_HOTS", "did you mean ISBRE_HOST?"]),
        (
            ["lineage", "status", "--url", "http://127.0.0.1:{port}"],
            {},
            ["isbre lineage status", "cannot reach"],
        ),
        (
            ["serve", "--workers", "1"],
            {"ISBRE_STORE": "postgresql://isbre@127.0.0.1:{port}/catalog"},
            ["the catalog database is unavailable", "Connection refused"],
        ),
        (
            ["ingest", "{config}", "--table", "t", "--uri", "http://127.0.0.1:{port}"],
            {},
            ["needs a namespace"],
        ),
        (["ingest", "{config}", "--table", "n.t", "--uri", "http://127.0.0.1:{port}"], {}, ["cannot reach"]),
    ],
    ids=[
        "port out of range",
        "port not a number",
        "misspelled key",
        "missing config",
        "misspelled variable",
        "misspelled lineage variable",
        "misspelled variable for tail",
        "misspelled variable for events tail",
        "misspelled variable for lineage status",
        "no server",
        "no database",
        "ingest table without namespace",
        "ingest with no server",
    ],
)
def test_ordinary_mistakes_are_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], words: list[str]
) -> None:
    config = tmp_path / "isbre.toml"
    config.write_text("prot = 9000\n")
    args = [arg.format(config=config, port=free_port()) for arg in args]
    env = {name: value.format(port=free_port()) for name, value in env.items()}
    if args[0] == "serve":
        args += ["--warehouse", str(tmp_path / "warehouse")]
        if "--port" not in args and "ISBRE_PORT" not in env:  # never the default: `make run` may hold it
            args += ["--port", str(free_port())]
        env["ISBRE_STATE_DIR"] = str(tmp_path / "state")
    one_line_error(isbre(*args, env=env), *words)


def test_debug_shows_the_traceback() -> None:
    result = isbre("--debug", "lineage", "status", "--url", f"http://127.0.0.1:{free_port()}")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_refused_credentials_are_one_line(secured: IsbreServer) -> None:
    one_line_error(isbre("lineage", "status", "--url", secured.url), "401")
    one_line_error(isbre("lineage", "status", "--url", secured.url, env={"ISBRE_TOKEN": "wrong"}), "401")
    one_line_error(isbre("events", "tail", "--url", secured.url, "--after", "0"), "401")


def test_client_commands_take_credentials_from_the_environment(secured: IsbreServer) -> None:
    by_token = isbre("lineage", "status", "--url", secured.url, env={"ISBRE_TOKEN": "static-token"})
    assert by_token.returncode == 0, by_token.stderr
    assert json.loads(by_token.stdout) == {"enabled": False}
    by_credential = isbre("lineage", "status", "--url", secured.url, env={"ISBRE_CREDENTIAL": "bi:bi-secret"})
    assert by_credential.returncode == 0, by_credential.stderr
    by_option = isbre("lineage", "status", "--url", secured.url, "--credential", "bi:bi-secret")
    assert by_option.returncode == 0, by_option.stderr


def test_events_tail_authenticates(secured: IsbreServer) -> None:
    create_namespace(secured, "tailed")
    tail = zygote.popen(
        [sys.executable, "-m", "isbre.rest.cli", "events", "tail", "--url", secured.url, "--after", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ISBRE_CREDENTIAL": "bi:bi-secret"},
    )
    try:
        assert tail.stdout is not None
        assert json.loads(tail.stdout.readline())["namespace"] == ["tailed"]
    finally:
        tail.terminate()
        tail.wait(10)


def test_the_python_client_renews_its_token_across_expiry(secured: IsbreServer) -> None:
    """Tokens live 2 s on this server: a subscription with client credentials outlives several."""
    start = secured.high_water("root-token")
    events = iter(subscribe(secured.url, after=start, credential="bi:bi-secret", max_delay=0.5))
    seen = []
    for i in range(4):
        create_namespace(secured, f"renewed{i}")
        seen.append(next(events).record["namespace"][0])
        time.sleep(1.5)
    assert seen == [f"renewed{i}" for i in range(4)]


@pytest.mark.parametrize("after", [None, "0"], ids=["from now", "with --after"])
def test_events_tail_waits_for_a_server_that_is_not_there_yet(tmp_path: Path, after: str | None) -> None:
    port = free_port()
    args = [sys.executable, "-m", "isbre.rest.cli", "events", "tail", "--url", f"http://127.0.0.1:{port}"]
    args += ["--after", after] if after else []
    tail = zygote.popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = None
    try:
        assert tail.stderr is not None and tail.stdout is not None
        complaint = tail.stderr.readline()
        assert "cannot reach" in complaint and "retrying in" in complaint
        server = InProcessServer(tmp_path / "warehouse", port=port).start()
        url = f"{server.url}/v1/isbre/namespaces"
        stdout = tail.stdout

        def commit_then_printed() -> bool:
            """A commit after the tail has connected is printed; one before it may not be."""
            http.post(
                url, json={"namespace": [f"late{time.monotonic_ns()}"]}, timeout=COMMIT_TIMEOUT
            ).raise_for_status()
            return _readable(stdout, 0.3)

        eventually(commit_then_printed, "the tail printing a commit")
        assert json.loads(tail.stdout.readline())["kind"] == "namespace.create"
    finally:
        tail.terminate()
        tail.wait(10)
        if server is not None:
            server.stop()


def _readable(stream: object, wait: float) -> bool:
    return bool(select.select([stream], [], [], wait)[0])


def create_namespace(server: IsbreServer, name: str) -> None:
    http.post(
        f"{server.url}/v1/isbre/namespaces", json={"namespace": [name]}, headers=ROOT, timeout=COMMIT_TIMEOUT
    ).raise_for_status()


def test_requests_refused_by_authentication_are_counted_under_their_route(secured: IsbreServer) -> None:
    assert http.get(f"{secured.url}/v1/isbre/namespaces/sales/tables").status_code == 401
    assert http.get(f"{secured.url}/v1/namespaces/sales/tables").status_code == 401  # the unprefixed alias
    metrics = http.get(f"{secured.url}/metrics").text
    wanted = 'route="/v1/{prefix}/namespaces/{namespace}/tables",status="401"} 2'
    assert wanted in metrics, [line for line in metrics.splitlines() if "401" in line]


def test_an_unknown_option_gets_its_command_s_usage() -> None:
    for command in (["serve"], ["events", "tail"], ["store", "copy", "--from", "x"]):
        result = isbre(*command, "--bogus")
        assert result.returncode == 2
        assert result.stderr.startswith(f"usage: isbre {' '.join(command[:2])}"), result.stderr
        assert "unrecognized arguments: --bogus" in result.stderr


def test_a_broken_toml_file_is_named(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text("port = = 3\n")
    one_line_error(
        isbre("serve", "--config", str(config), "--warehouse", str(tmp_path / "w")), str(config), "TOML"
    )


def test_a_port_in_use_is_named_with_how_to_choose_another(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = isbre("serve", "--port", str(port), "--warehouse", str(tmp_path / "w"), "--workers", "1")
    one_line_error(result, f"port {port}", "in use", "--port", "ISBRE_PORT")
    assert "Application startup" not in result.stderr


def test_the_client_commands_find_the_server_that_the_settings_start(
    secured: IsbreServer, tmp_path: Path
) -> None:
    """`lineage status`, `events tail` and `ingest` reach the server on the port `ISBRE_PORT` or the
    TOML file names, without a URL; `--url` and `--uri` are one flag in each."""
    from isbre.rest import cli, settings

    assert (cli.DEFAULT_HOST, cli.DEFAULT_PORT) == ("127.0.0.1", settings.DEFAULT_PORT)
    port = secured.url.rsplit(":", 1)[1]
    token = {"ISBRE_TOKEN": "root-token"}
    assert isbre("lineage", "status", env={"ISBRE_PORT": port, **token}).returncode == 0
    config = tmp_path / "isbre.toml"
    config.write_text(f'host = "0.0.0.0"\nport = {port}\n')
    assert isbre("lineage", "status", "--config", str(config), env=token).returncode == 0
    for flag in ("--url", "--uri"):
        assert isbre("lineage", "status", flag, secured.url, env=token).returncode == 0
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n1\n2\n")
    for flag in ("--url", "--uri"):
        ingested = isbre("ingest", str(rows), "--table", f"cli.t{flag[2:]}", flag, secured.url, env=token)
        assert ingested.returncode == 0, ingested.stderr
    by_port = isbre("ingest", str(rows), "--table", "cli.byport", env={"ISBRE_PORT": port, **token})
    assert by_port.returncode == 0, by_port.stderr
    tail = zygote.popen(
        [sys.executable, "-m", "isbre.rest.cli", "events", "tail", "--after", "0", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("ISBRE_")}, **token},
    )
    try:
        assert tail.stdout is not None and tail.stderr is not None
        said = tail.stderr.readline().rstrip()
        assert said == f"isbre events tail: connected to {secured.url}, events after commit_seq 0", said
        first = json.loads(tail.stdout.readline())
        assert first["commit_seq"] >= 1
    finally:
        tail.kill()
        tail.wait()


def test_the_benchmarks_help_names_every_benchmark() -> None:
    from tests.bench.__main__ import BENCHMARKS

    said = zygote.run(
        [sys.executable, "-m", "tests.bench", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    assert all(name in said for name in BENCHMARKS), said


def test_the_suite_cpu_counter_counts_what_a_command_spends() -> None:
    """The README's CPU figure for `make test` comes from tests/bench/suite_cpu.py: a process the
    command started that spins half a second of CPU after the command has ended (handed to init,
    as a forkserver whose test process has gone is) is counted, and the exit status passed on."""
    spin = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(0.2)\n"
        "    end = time.process_time() + 0.5\n"
        "    while time.process_time() < end: pass\n"
        "    os._exit(0)\n"
        "os._exit(3)"
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.suite_cpu", sys.executable, "-c", spin],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    run = float(said.split("the run's processes ")[1].split(" core-seconds")[0])
    machine = float(said.split("the whole machine ")[1].split(";")[0])
    assert 0.45 <= run < 5 and machine >= 0.45, said


def test_a_reader_that_goes_away_ends_events_tail_quietly(secured: IsbreServer) -> None:
    namespaces = f"{secured.url}/v1/isbre/namespaces"
    http.post(namespaces, json={"namespace": ["reader_here"]}, headers=ROOT).raise_for_status()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ISBRE_")}
    tail = zygote.popen(
        [sys.executable, "-m", "isbre.rest.cli", "events", "tail", "--after", "0", "--url", secured.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, "ISBRE_TOKEN": "root-token"},
    )
    assert tail.stdout is not None and tail.stderr is not None
    assert json.loads(tail.stdout.readline())["commit_seq"] >= 1
    tail.stdout.close()  # as `| head -1` does; the next event written finds the pipe closed
    http.post(namespaces, json={"namespace": ["reader_gone"]}, headers=ROOT).raise_for_status()
    assert tail.wait(timeout=30) == 0
    assert "Broken pipe" not in tail.stderr.read()
