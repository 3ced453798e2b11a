"""A disk that fills up in a moment, for the tests of what a full disk does."""

from __future__ import annotations

import contextlib
from pathlib import Path


def fill(path: Path) -> None:
    # Unbuffered: closing the file must not try to flush what no longer fits.
    with path.open("wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * (1 << 16))
