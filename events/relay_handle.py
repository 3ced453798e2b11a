"""The server's side of the relay process (events/relay_worker.py): placing new relays' positions,
starting the process and restarting it, and reading how the relays do."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.processes import SupervisedProcess
from isbre.catalog.stores import helper_environment
from isbre.catalog.writer import Batch
from isbre.events.relay_settings import NatsRelay, WebhookRelay
from isbre.events.relay_status import CURSOR_PREFIX, RELAYS_ENV, RelaysReport, read_report

log = logging.getLogger(__name__)


def place_positions(commit_log: CommitLog, relays: list[NatsRelay | WebhookRelay]) -> None:
    """Give each relay without a position its start (before any request: the process takes a
    moment to start), and drop the positions of relays no longer configured, which would otherwise
    hold the log's records back from trimming for ever."""
    wanted = {relay.key(): relay.start for relay in relays}

    def mutation(batch: Batch) -> list[str]:
        view = batch.view
        held = {name: seq for name, seq in view.cursors().items() if name.startswith(CURSOR_PREFIX)}
        for name, start in wanted.items():
            if CURSOR_PREFIX + name not in held:
                view.put_cursor(
                    CURSOR_PREFIX + name, view.commit_seq() if start == "now" else view.log_floor() - 1
                )
        gone = [name for name in held if name.removeprefix(CURSOR_PREFIX) not in wanted]
        for name in gone:
            view.delete_cursor(name)
        return gone

    for name in commit_log.writer.execute(mutation):
        log.warning(
            "relay %s is no longer configured: its position is dropped", name.removeprefix(CURSOR_PREFIX)
        )


class RelayObserver:
    """The relays as the server's processes see them: their positions in the store and the relay
    process's status file."""

    def __init__(self, commit_log: CommitLog, state: Path, relays: list[NatsRelay | WebhookRelay]) -> None:
        self._log = commit_log
        self._state = state
        self._relays = relays

    def report(self) -> dict[str, Any]:
        """Each relay's kind, target, position, lag and counts; the process and whether it relays."""
        found = read_report(self._state) or RelaysReport()
        cursors = self._log.cursors()
        high = self._log.commit_seq()
        pid = found.pid if found.pid is not None and _alive(found.pid) else None
        relays = {}
        for relay in self._relays:
            name = relay.key()
            status = found.relays.get(name)
            position = max(cursors.get(CURSOR_PREFIX + name, 0), status.position if status else 0)
            relays[name] = {
                "kind": relay.kind,
                "target": relay.target(),
                "position": position,
                "lag": high - position,
                "messages": status.messages if status else 0,
                "failures": status.failures if status else 0,
                "connected": status.connected if status else False,
                "failing": status.failing if status else False,
                "last_error": status.last_error if status else None,
                "last_sent_at": status.last_sent_at if status else None,
            }
        return {"process": pid, "relaying": found.relaying, "relays": relays}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


class RelayProcess(SupervisedProcess, RelayObserver):
    """The server's handle on the relay process: start, restart when it dies, stop, report."""

    def __init__(
        self,
        commit_log: CommitLog,
        store: str,
        state: Path,
        relays: list[NatsRelay | WebhookRelay],
        config: dict[str, Any],
    ) -> None:
        RelayObserver.__init__(self, commit_log, state, relays)
        SupervisedProcess.__init__(
            self,
            "relay process",
            [sys.executable, "-m", "isbre.events.relay_worker", "--state", str(state)],
            helper_environment(store, **{RELAYS_ENV: json.dumps(config)}),
        )

    def start(self) -> None:
        place_positions(self._log, self._relays)
        super().start()
