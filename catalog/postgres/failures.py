"""How a failing database shows: StoreUnavailableError, named by the first line of its error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from isbre.catalog.store import (
    StoreUnavailableError,
)
from sqlalchemy import (
    exc,
)


@contextmanager
def reachable() -> Iterator[None]:
    """Connection failures as StoreUnavailableError; anything else as it is."""
    try:
        yield
    except (exc.OperationalError, exc.InterfaceError, exc.TimeoutError) as error:
        raise StoreUnavailableError(f"the catalog database is unavailable: {first_line(error)}") from error
    except exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
        raise StoreUnavailableError(f"lost the catalog database: {first_line(error)}") from error


def first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__
