"""Where a sink learns which offsets a table already holds.

isbre indexes coverage as it commits, so an isbre catalog (embedded or over
REST) answers from that index, which survives snapshot expiry. Any other
catalog gets the coverage derived from the table's snapshot summaries, which
only knows what unexpired snapshots declared.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from isbre.catalog.coverage import Coverage
from isbre.catalog.pyiceberg_internals import rest_extension
from isbre.sinks.contract import SinkError
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import Table

log = logging.getLogger(__name__)

_COVERAGE_ENDPOINT = "namespaces/{namespace}/tables/{table}/coverage"


class CoverageSource:
    """Coverage from snapshot summaries: works with every catalog."""

    indexed = False

    def __init__(self, catalog: Catalog, identifier: str) -> None:
        self.catalog = catalog
        self.identifier = identifier

    def coverage(self, table: Table) -> Coverage:
        summaries = [s.summary.additional_properties if s.summary else None for s in table.metadata.snapshots]
        try:
            return Coverage.from_summaries(summaries)
        except ValueError as e:
            raise SinkError(f"{self.identifier}: a snapshot summary declares malformed spans: {e}") from e

    def commit_seq_of(self, snapshot_id: int) -> int | None:
        return None


@runtime_checkable
class IndexedCatalog(Protocol):
    """A catalog in this process that answers from isbre's coverage index: the embedded one
    (catalog/embedded.py `LmdbCatalog`), recognised by what it offers, so that a sink loads none of
    the server's side unless it is given one."""

    def coverage(self, identifier: str) -> Coverage: ...

    def commit_seq_of(self, identifier: str, snapshot_id: int) -> int | None: ...


class _EmbeddedCoverage(CoverageSource):
    indexed = True
    catalog: IndexedCatalog  # type: ignore[assignment]  # a Catalog too (coverage_source checks both)

    def coverage(self, table: Table) -> Coverage:
        return self.catalog.coverage(self.identifier)

    def commit_seq_of(self, snapshot_id: int) -> int | None:
        return self.catalog.commit_seq_of(self.identifier, snapshot_id)


class _RestCoverage(CoverageSource):
    """isbre's REST extension, reached through the catalog's own authenticated session."""

    indexed = True
    catalog: RestCatalog

    def __init__(self, catalog: RestCatalog, identifier: str) -> None:
        super().__init__(catalog, identifier)
        self._probed: dict[str, Any] | None = None  # the answer that showed the index is there

    def probe(self) -> bool:
        """Whether the catalog answers coverage requests; its answer is the first coverage."""
        self._probed = self.get()
        return self._probed is not None

    def get(self, **params: Any) -> dict[str, Any] | None:
        response = rest_extension(self.catalog, "GET", _COVERAGE_ENDPOINT, self.identifier, params)
        if response.status_code != 200:
            return None
        body = response.json()
        return body if isinstance(body, dict) and "coverage" in body else None

    def coverage(self, table: Table) -> Coverage:
        body, self._probed = self._probed or self.get(), None
        if body is None:
            raise SinkError(f"{self.identifier}: the catalog stopped answering coverage requests")
        return Coverage.from_json(body["coverage"])

    def commit_seq_of(self, snapshot_id: int) -> int | None:
        body = self.get(**{"snapshot-id": snapshot_id})
        return None if body is None else body.get("commit-seq")


def coverage_source(catalog: Catalog, identifier: str) -> CoverageSource:
    if isinstance(catalog, IndexedCatalog):
        return _EmbeddedCoverage(catalog, identifier)
    if isinstance(catalog, RestCatalog):
        rest = _RestCoverage(catalog, identifier)
        if rest.probe():
            return rest
        log.info("%s: the REST catalog keeps no coverage index; using snapshot summaries", identifier)
    return CoverageSource(catalog, identifier)
