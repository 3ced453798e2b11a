"""How the lineage outbox is doing, where its process writes that down, and its cursor in the commit
log: what the server reports without loading openlineage-python."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from isbre.catalog.commit_log import CommitLog
from isbre.catalog.processes import HelperStatus

# The outbox's consumer cursor in the commit log.
CURSOR = "lineage"
# In the server's state directory: the lineage worker's status.
STATUS_FILE = "lineage-status.json"


def start_from_now(commit_log: CommitLog) -> None:
    """Give a new outbox its cursor: lineage starts with the next commit (`isbre lineage replay`
    sends history). A no-op once the cursor exists."""
    if commit_log.consumer_cursor(CURSOR) is None:
        commit_log.set_consumer_cursor(CURSOR, commit_log.commit_seq())


@dataclass
class OutboxStatus(HelperStatus):
    delivered_seq: int = 0
    events_sent: int = 0
    last_delivery_at: float | None = None  # when a chunk of runs was last delivered
    mapping_errors: int = 0


def status_path(state: Path) -> Path:
    """In the server's state directory: the status of its lineage worker."""
    return state / STATUS_FILE


def read_status(state: Path) -> tuple[OutboxStatus, int | None, bool] | None:
    """The worker's last status, its process id, and whether it holds the lineage lease."""
    try:
        found = json.loads(status_path(state).read_text())
        pid = found.pop("pid", None)
        delivering = found.pop("delivering", True)
        return OutboxStatus(**found), pid, delivering
    except (OSError, ValueError, TypeError):
        return None


def write_status(state: Path, status: OutboxStatus, delivering: bool) -> None:
    path = status_path(state)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"pid": os.getpid(), "delivering": delivering, **asdict(status)}))
    os.replace(temporary, path)
