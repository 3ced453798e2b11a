"""`isbre serve`: settings checked, the warehouse claimed, limits raised, then uvicorn."""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import resource
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import uvicorn
from isbre.catalog.shared_writer import KEY_ENV, CommitServer, committer_socket
from isbre.catalog.warehouses import open_warehouses
from isbre.events.fanout import SharedFanout, shared_socket
from isbre.rest.connections import guarded_protocol
from isbre.rest.refusals import RefusedError
from isbre.rest.settings import Settings, warehouses
from isbre.rest.shared_counters import (
    SUPERVISOR_FOLDER,
    Counts,
    SharedCounters,
    forget_workers,
    running_workers,
)
from isbre.rest.startup import fanout_options, shut_down, start_lineage, start_relays
from isbre.rest.uvicorn_supervisor import PatientSupervisor, fork_the_workers_forkserver
from isbre.rest.workers import hand_down
from uvicorn.config import LOGGING_CONFIG

SERVER_LOCK = "isbre-serve.lock"
_claimed: list[int] = []  # the lock's descriptor, held open for the life of the process
log = logging.getLogger("isbre")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _UvicornOptions(TypedDict):
    """What both ways of running uvicorn are given, typed as uvicorn takes them."""

    host: str
    port: int
    log_level: str
    access_log: bool
    timeout_keep_alive: int


def serve(settings: Settings) -> None:
    if not settings.auth.enabled and not settings.allow_insecure_bind and not _is_loopback(settings.host):
        raise RefusedError(
            f"refusing to serve {settings.host} with authentication off; enable [auth] "
            "or set allow_insecure_bind = true (for example behind an authenticating proxy)"
        )
    holder = claim_state(settings.state_path())
    if holder is not None:
        if settings.shares_store():
            raise RefusedError(
                f"another isbre serve (process {holder}) uses the state directory {settings.state_path()}; "
                "give each server on this host a state_dir of its own"
            )
        raise RefusedError(
            f"{settings.store_location()} is already served by another isbre serve (process {holder}); "
            "point clients at that server, or use the embedded catalog beside it"
        )
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _raise_open_files_limit()
    _check_port_free(settings.host, settings.port)
    if settings.shares_store():
        from isbre.catalog.postgres.store import PostgresStore

        # Reached, and its schema brought up to date, before any process serves: an unreachable
        # database is one line at start, not a failed application start-up in each worker.
        PostgresStore(settings.store_location()).close()
    common = _uvicorn_options(settings)
    workers = settings.worker_count()
    if workers == 1:
        server = single_process_server(settings)
        _announce_when(lambda: server.started, settings, workers)
        server.run()
        return
    settings = hand_down(settings)
    committer_at = committer_socket(settings.state_path()) if settings.shared_commits else None
    if committer_at is not None:
        os.environ[KEY_ENV] = secrets.token_hex(32)  # before any worker is forked: they all get it
    elif settings.shared_commits:
        log.warning(
            "the state directory's path is too long for a Unix socket: each worker groups its own commits"
        )
    forget_workers(settings.state_path())
    if not fork_the_workers_forkserver():
        log.debug("threads run already: the workers' forkserver starts as a new interpreter")
    # The supervisor runs what there is one of per server: the lineage worker, the relays, the
    # fan-out, and the committer of the workers' table commits.
    services = open_warehouses(
        settings.store_location(),
        warehouses(settings),
        map_size=settings.map_size_mb << 20,
        max_batch=settings.max_batch,
        max_queue=settings.max_queue,
        commit_wait_s=settings.commit_wait_ms / 1000,
        metadata_sync_s=settings.metadata_sync_seconds,
        on_fatal=shut_down,
    )
    committer = None
    if committer_at is not None:
        committer = CommitServer(services[0].core.writer, committer_at, bytes.fromhex(os.environ[KEY_ENV]))
    counters = SharedCounters(settings.state_path(), SUPERVISOR_FOLDER)
    writer = services[0].core.writer
    publishing = counters.publish_every(
        lambda: Counts(writer.stats, queued=writer.queue_depth(), committing=writer.committing)
    )
    lineage = start_lineage(settings, services)
    relays = start_relays(settings, services)
    path = shared_socket(settings.state_path()) if settings.events_process else None
    fanout = SharedFanout(settings.store_location(), path, fanout_options(settings)) if path else None
    if fanout is not None:
        fanout.start()
    elif settings.events_process:
        log.warning("the store's path is too long for a Unix socket: each worker serves its own streams")
    state = settings.state_path()
    _announce_when(lambda: len(running_workers(state)) >= workers, settings, workers)
    try:
        config = uvicorn.Config(
            "isbre.rest.workers:worker_app",
            factory=True,
            workers=workers,
            http="isbre.rest.workers:WorkerHttpProtocol",
            **common,
        )
        # As uvicorn.run serves several workers, but patient with those still starting.
        PatientSupervisor(config, sockets=[config.bind_socket()]).run()
    finally:
        publishing.set()
        counters.close()
        if committer is not None:
            committer.close()
        if fanout is not None:
            fanout.stop()
        if lineage is not None:
            lineage.stop()
        if relays is not None:
            relays.stop()
        services[0].close()


def _uvicorn_options(settings: Settings) -> _UvicornOptions:
    return _UvicornOptions(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_keep_alive=settings.keepalive_timeout_seconds,
    )


def single_process_server(
    settings: Settings, log_config: dict[str, Any] | None = LOGGING_CONFIG
) -> uvicorn.Server:
    """The whole catalog served by one uvicorn server in this process (`run()` serves until it is
    told to stop). `log_config`: uvicorn's logging set-up, None to leave the process's own alone."""
    from isbre.rest.app import create_app  # here: a supervisor of several workers serves no request

    protocol = guarded_protocol(settings.max_header_kb << 10, settings.header_timeout_seconds)
    config = uvicorn.Config(
        create_app(settings), http=protocol, log_config=log_config, **_uvicorn_options(settings)
    )
    return uvicorn.Server(config)


def _announce_when(up: Callable[[], bool], settings: Settings, workers: int) -> None:
    """Log one line once every worker answers. uvicorn's "running on" line comes when the port is
    bound, which with workers is before any of them has started."""

    def wait() -> None:
        while not up():
            time.sleep(0.05)
        log.info("%s", up_line(settings, workers))

    threading.Thread(target=wait, name="isbre-announce", daemon=True).start()


def up_line(settings: Settings, workers: int) -> str:
    """What a newcomer needs once the server answers: where it answers, its console, where its
    tables and its store are (a database URL without its password)."""
    url = f"http://{settings.host}:{settings.port}"
    plural = "s" if workers > 1 else ""
    said = [f"isbre up: {url} answers ({workers} worker{plural})"]
    if settings.console:
        said.append(f"console {url}/ui/")
    served = [(w.name, str(w.local_root() or w.root)) for w in warehouses(settings)]
    said.append("warehouse " + ", ".join(f"{name} at {root}" for name, root in served))
    store = settings.store_location()
    if settings.shares_store():
        from sqlalchemy.engine import make_url

        store = make_url(store).render_as_string(hide_password=True)
    said.append(f"store {store}")
    return "; ".join(said)


def claim_state(state: Path) -> str | None:
    """Take the server lock in its state directory (beside an LMDB store); None when taken, else
    who holds it.

    Two servers on one LMDB store would each run a lineage worker over one cursor and deliver
    runs twice (servers sharing a database take turns through its lineage lease instead), and
    two servers in one state directory would share its socket and files; an embedded catalog
    beside a server is fine (it runs neither).
    """
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / SERVER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        return holder
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _claimed.append(fd)
    return None


def _check_port_free(host: str, port: int) -> None:
    """A port another program holds is one line that says how to choose another, before anything
    starts (uvicorn would report it after the application had started)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise RefusedError(
                f"port {port} on {host} is in use by another program; serve another with --port N, "
                "ISBRE_PORT=N or port = N in the TOML file (make run PORT=N)"
            ) from None


def _raise_open_files_limit() -> None:
    """One descriptor per connection: take all the system allows, not the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    log.info("open files limit: %s (was %s)", hard, soft)
