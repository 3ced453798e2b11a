"""Which OpenLineage transport isbre delivers to: its own settings, else OpenLineage's standard ones.

Without any configuration, openlineage-python would print every event to the
console; isbre treats that as "lineage is off" instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # openlineage-python loads in a second: only where lineage is delivered
    from openlineage.client import OpenLineageClient


def openlineage_configured() -> bool:
    """True if OpenLineage's own configuration (environment or openlineage.yml) names a transport."""
    if os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG"):
        return True
    if any(key.startswith("OPENLINEAGE__TRANSPORT") for key in os.environ):
        return True
    return any(
        path.is_file()
        for path in (Path.cwd() / "openlineage.yml", Path.home() / ".openlineage/openlineage.yml")
    )


def build_client(
    url: str | None = None, api_key: str | None = None, transport: dict[str, Any] | None = None
) -> OpenLineageClient | None:
    """The client to deliver with, or None when lineage is not configured anywhere."""
    from openlineage.client import OpenLineageClient

    if transport:
        return OpenLineageClient(config={"transport": transport})
    if url:
        http: dict[str, Any] = {"type": "http", "url": url}
        if api_key:
            http["auth"] = {"type": "api_key", "apiKey": api_key}
        return OpenLineageClient(config={"transport": http})
    if openlineage_configured():
        return OpenLineageClient()
    return None
