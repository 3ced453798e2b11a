"""Reads of the location index in PostgreSQL: where an object lives, and what lies at, above or
under a location."""

from __future__ import annotations

from isbre.catalog.postgres.schema import locations
from sqlalchemy import Connection, select


def placed(db: Connection, owner: str) -> str | None:
    found = db.scalar(select(locations.c.location).where(locations.c.owner == owner))
    return None if found is None else str(found)


def overlapping(db: Connection, location: str) -> list[tuple[str, str]]:
    above = [location[:end] for end, ch in enumerate(location) if ch == "/"]
    pairs = select(locations.c.location, locations.c.owner)
    exact = pairs.where(locations.c.location.in_([*above, location]))
    found = sorted(((loc, owner) for loc, owner in db.execute(exact)), key=lambda row: len(row[0]))
    # "/" is 0x2F and "0" 0x30: in the C collation, the locations under `location/` sort between.
    under = (
        pairs.where(locations.c.location > location + "/", locations.c.location < location + "0")
        .order_by(locations.c.location)
        .limit(16)
    )
    return found + [(loc, owner) for loc, owner in db.execute(under)]
