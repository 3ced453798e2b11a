"""How each relay is doing, where the relay process writes that down, and the relays' positions in
the store: what the server reports (/health, /metrics) without loading the relays' clients."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from isbre.catalog.processes import HelperStatus

# A relay's position is a consumer cursor of the commit log under this prefix and its name.
CURSOR_PREFIX = "relay:"
# The environment variable carrying the relay process's settings (JSON; see rest/startup.py).
RELAYS_ENV = "ISBRE_RELAY_SETTINGS"
# In the server's state directory: the relay process's status.
STATUS_FILE = "relays-status.json"


@dataclass
class RelayStatus(HelperStatus):
    position: int = 0  # every commit up to here is sent or filtered out
    messages: int = 0
    connected: bool = False
    last_sent_at: float | None = None

    def failed(self, error: BaseException) -> None:
        super().failed(error)
        self.connected = False

    @property
    def failing(self) -> bool:
        """Its last try failed (nothing was sent since)."""
        return self.last_failure_at is not None and self.last_failure_at > (self.last_sent_at or 0)


@dataclass
class RelaysReport:
    """The relay process's last report: its pid, whether it holds the store's relays lease, and
    each relay's status by name."""

    pid: int | None = None
    relaying: bool = False
    relays: dict[str, RelayStatus] = field(default_factory=dict)


def status_path(state: Path) -> Path:
    return state / STATUS_FILE


def read_report(state: Path) -> RelaysReport | None:
    try:
        found = json.loads(status_path(state).read_text())
        relays = {name: RelayStatus(**each) for name, each in found["relays"].items()}
        return RelaysReport(found["pid"], found["relaying"], relays)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_report(state: Path, relays: dict[str, RelayStatus], relaying: bool, unless: str = "") -> str:
    """Write the report, unless it is `unless` (the last one written); returns what it holds."""
    report = {"pid": os.getpid(), "relaying": relaying, "relays": {k: asdict(v) for k, v in relays.items()}}
    text = json.dumps(report)
    if text != unless:
        path = status_path(state)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text)
        os.replace(temporary, path)
    return text
