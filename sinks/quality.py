"""Data-quality rules a sink applies to each batch, and what becomes of the rows that fail.

A `Rule` is a name, a version and a check: `check(batch)` answers one boolean per row (True
passes; a null fails). The sink's `enforcement` decides what a failing row does:

- `strict`: the batch raises `SinkError` naming the rules and how many rows failed each; nothing
  of it is taken.
- `quarantine`: failing rows go to the quarantine sink, a table with coverage of its own, with
  `<prefix>reason` (`dq`), `<prefix>rule` and `<prefix>rule_version` (the first rule the row
  failed); so do rows the table cannot hold (`contract`, with `<prefix>error`: a null in a
  required column, or a value that does not take its column's type, sinks/conform.py), which
  any other enforcement refuses with the batch; passing rows go on.
  The quarantine is written on a lane of its own (sinks/quarantine_lane.py) that the sink's
  commit waits for, for a bounded time, so a span the sink's own table covers is in both or its
  quarantined rows are counted as shed; a replay writes nothing twice on either side, as each
  table skips what it covers.
- `annotate`: every row goes on, with `<prefix>dq_passed` and `<prefix>dq_failed` (the names of
  the rules it failed).

An audit sink, where given, gets one row per record per rule: the record's id, the rule, its
version, the verdict and what became of the record. Its coverage is kept per rule (the span's
source id followed by `/rule@version`), so a replay audits nothing twice and a new version of a
rule audits the records it sees from then on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
from isbre.catalog.sink_rows import ACCEPTED, ANNOTATED
from isbre.sinks.conform import conform
from isbre.sinks.contract import OffsetSpan, SinkError, SourceFields, row_offsets
from isbre.sinks.pending import contract_errors
from isbre.sinks.quarantine_lane import QUARANTINE_BUFFER_ROWS, QUARANTINE_DRAIN_S, QuarantineLane
from isbre.sinks.record_id import record_ids

if TYPE_CHECKING:
    from isbre.sinks.table_writer import TableWriter

ENFORCEMENTS = ("strict", "quarantine", "annotate")


@dataclass(frozen=True)
class Rule:
    name: str
    version: str  # a number is taken as what str() makes of it
    check: Callable[[pa.RecordBatch], Any]  # one boolean per row: a PyArrow or NumPy array, a list

    def __post_init__(self) -> None:
        if isinstance(self.version, int | float) and not isinstance(self.version, bool):
            object.__setattr__(self, "version", str(self.version))  # Rule("name", 1, check)
        for what, value in (("name", self.name), ("version", self.version)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"A rule's {what} must be a non-empty string: {value!r}")

    def judge(self, batch: pa.RecordBatch) -> np.ndarray:
        """One verdict per row of `batch` (a null fails), or SinkError naming the rule."""
        try:
            answer = self.check(batch)
            verdicts = answer if isinstance(answer, pa.Array | pa.ChunkedArray) else pa.array(answer)
        except Exception as exc:
            raise SinkError(
                f"Rule {self.name!r} (version {self.version}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not pa.types.is_boolean(verdicts.type) or len(verdicts) != batch.num_rows:
            raise SinkError(
                f"Rule {self.name!r} (version {self.version}) must answer one boolean per row; it gave "
                f"{len(verdicts)} values of type {verdicts.type} for {batch.num_rows} rows"
            )
        return np.asarray(verdicts.fill_null(False), dtype=bool)


def _first_errors(first: np.ndarray | None, then: np.ndarray | None) -> np.ndarray | None:
    """Per row, its error in `first`, else its error in `then` (None: no row has one)."""
    if first is None or then is None:
        return first if then is None else then
    return np.where(first.astype(bool), first, then)


def _column(values: Sequence[str | None] | np.ndarray) -> pa.Array:
    return pa.array(values, pa.string())


class Quality:
    """The rules of one sink, and the writers of its quarantine and audit sinks."""

    def __init__(
        self,
        rules: Sequence[Rule],
        enforcement: str,
        prefix: str,
        quarantine: QuarantineLane | None = None,
        audit: TableWriter | None = None,
    ) -> None:
        if enforcement not in ENFORCEMENTS:
            raise ValueError(f"Unknown enforcement {enforcement!r}: one of {', '.join(ENFORCEMENTS)}")
        if (enforcement == "quarantine") != (quarantine is not None):
            raise ValueError(
                "enforcement='quarantine' takes a quarantine sink, and no other enforcement does"
            )
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise ValueError(f"Rule names must differ: {names}")
        self.rules = list(rules)
        self.enforcement = enforcement
        self.prefix = prefix
        self.quarantine = quarantine
        self.audit = audit
        if quarantine is not None:
            quarantine.writer.quality_columns = tuple(
                prefix + name for name in ("reason", "rule", "rule_version", "error")
            )
        if audit is not None:
            audit.quality_columns = (prefix + "record_id",)
            # The audited record's id is the audit row's: its table has no metadata columns of its
            # own unless its sink asks for them (and then that id would clash).
            audit.metadata_policy = audit.metadata_policy or "none"

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the rules add to the sink's own rows."""
        return (
            (self.prefix + "dq_passed", self.prefix + "dq_failed") if self.enforcement == "annotate" else ()
        )

    def take(
        self,
        writer: TableWriter,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        source: SourceFields | None,
        offsets: np.ndarray | None,
    ) -> int:
        """Judge `batch` and hand its rows on; returns how many rows `writer` took."""
        offsets = row_offsets(batch.num_rows, span, offsets)
        errors = None
        if self.enforcement == "quarantine" and (table := writer.existing()) is not None:
            # Values the table's columns cannot take are judged row by row, before the rules
            # (which see them as nulls).
            batch, errors = conform(batch, table.schema(), writer.widen)
        verdicts = np.array([rule.judge(batch) for rule in self.rules], dtype=bool).reshape(
            len(self.rules), batch.num_rows
        )
        passed: np.ndarray = np.asarray(verdicts.all(axis=0), dtype=bool)
        # Rows the table cannot hold are quarantined too, instead of refusing the batch.
        if self.enforcement == "quarantine":
            writer.fit(batch.schema)
            errors = _first_errors(errors, contract_errors(writer.table.schema(), batch))
        if errors is not None:
            passed &= ~errors.astype(bool)
        if self.enforcement == "strict" and not passed.all():
            failing = [
                f"{rule.name!r} ({int((~verdict).sum())} rows)"
                for rule, verdict in zip(self.rules, verdicts, strict=True)
                if not verdict.all()
            ]
            raise SinkError(
                f"{span}: rows fail the data-quality rules {', '.join(failing)}; none of the batch is taken"
            )
        if self.audit is not None:
            self._audit(batch, span, offsets, verdicts, passed)
        if self.enforcement == "annotate":
            batch = batch.append_column(self.prefix + "dq_passed", pa.array(passed))
            batch = batch.append_column(self.prefix + "dq_failed", self._failed_names(verdicts))
            fresh = writer.fresh(span, offsets)  # counted once: a replay's rows were counted before
            taken = writer.add(batch, span, source, offsets, disposition=None)
            writer.rows[ACCEPTED] += int((fresh & passed).sum())
            writer.rows[ANNOTATED] += int((fresh & ~passed).sum())
            return taken
        if self.quarantine is not None:
            self._divert(self.quarantine, writer, batch, span, source, offsets, verdicts, passed, errors)
        return writer.add(batch, span, source, offsets, keep=passed)

    def _failed_names(self, verdicts: np.ndarray) -> pa.ListArray:
        """Per row, the names of the rules it failed, in the rules' order (without a loop per row:
        a batch holds many)."""
        rows, rules = np.nonzero(~verdicts.T)
        ends = np.cumsum(np.bincount(rows, minlength=verdicts.shape[1]))
        offsets = pa.array(np.concatenate([[0], ends]), pa.int32())
        names = pa.array([rule.name for rule in self.rules], pa.string()).take(pa.array(rules, pa.int64()))
        return pa.ListArray.from_arrays(offsets, names)

    def _divert(
        self,
        quarantine: QuarantineLane,
        writer: TableWriter,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        source: SourceFields | None,
        offsets: np.ndarray,
        verdicts: np.ndarray,
        passed: np.ndarray,
        errors: np.ndarray | None,
    ) -> None:
        """The failing rows into the quarantine's lane: a row the table cannot hold with reason
        `contract` and why, any other with the first rule it failed (every row of the span is
        offered, so that the quarantine covers the span even when none fails). `writer`, the
        sink's own, counts the rows it had not held."""
        failing = ~passed
        broken = errors[failing] if errors is not None else np.full(int(failing.sum()), None, dtype=object)
        contract = broken.astype(bool)  # a row the table cannot hold is diverted for that first
        # Per failing row, 1 + the index of the first rule it failed; 0 where the contract failed it.
        first = np.zeros(len(broken), dtype=np.int64)
        if self.rules:
            first = np.where(contract, 0, verdicts[:, failing].argmin(axis=0) + 1)
        rules = np.array([None, *(rule.name for rule in self.rules)], dtype=object)[first]
        versions = np.array([None, *(rule.version for rule in self.rules)], dtype=object)[first]
        reasons = np.where(contract, "contract", "dq").astype(object)
        diverted = batch.filter(pa.array(failing))
        for name, values in (
            ("reason", reasons),
            ("rule", rules),
            ("rule_version", versions),
            ("error", broken),
        ):
            diverted = diverted.append_column(self.prefix + name, _column(values))
        new = writer.fresh(span, offsets[failing])  # counted once: a replay's rows were counted before
        # A reason without a row is not counted (unary + drops it).
        counted = +Counter({"dq": int((new & ~contract).sum()), "contract": int((new & contract).sum())})
        for reason, rows in counted.items():
            writer.rows[f"quarantined.{reason}"] += rows
        quarantine.offer(
            diverted, span, source.filter(pa.array(failing)) if source else None, offsets[failing], counted
        )

    def _audit(
        self,
        batch: pa.RecordBatch,
        span: OffsetSpan,
        offsets: np.ndarray,
        verdicts: np.ndarray,
        passed: np.ndarray,
    ) -> None:
        assert self.audit is not None
        ids = record_ids(span.source_id, span.topic, span.partition, offsets, batch.columns)
        if self.enforcement == "annotate":
            disposition = np.full(len(passed), "annotated", dtype=object)
        else:
            disposition = np.where(passed, "accepted", "quarantined").astype(object)
        for rule, verdict in zip(self.rules, verdicts, strict=True):
            rows = pa.RecordBatch.from_arrays(
                [
                    ids,
                    _column([rule.name] * len(ids)),
                    _column([rule.version] * len(ids)),
                    _column(np.where(verdict, "pass", "fail")),
                    _column(disposition),
                ],
                names=[self.prefix + "record_id", "rule", "rule_version", "verdict", "disposition"],
            )
            stream = f"{span.source_id}/{rule.name}@{rule.version}"
            self.audit.add(
                rows, OffsetSpan(stream, span.topic, span.partition, span.start, span.end), None, offsets
            )

    def commit(self, writer: TableWriter) -> None:
        """Before the commit of `writer` (the sink's own): the audit rows commit, and the quarantine
        lands what it was handed (for at most its drain time, while the sink's files are written),
        so that a span the sink's table covers is in theirs too, or counted as shed."""
        writer.start_write()
        if self.audit is not None:
            self.audit.commit(commit_seq=False)
        if self.quarantine is not None:
            self.quarantine.drain()
            for reason, rows in self.quarantine.take_shed().items():
                writer.rows[f"shed.{reason}"] += rows

    def close(self) -> None:
        if self.quarantine is not None:
            self.quarantine.close()
        if self.audit is not None:
            self.audit.close()


class WritingSink(Protocol):
    """A sink over a table writer (an IcebergSink, say): what a quarantine or audit sink is."""

    writer: TableWriter


def judged(
    writer: TableWriter,
    rules: Sequence[Rule],
    enforcement: str,
    quarantine: WritingSink | None,
    audit: WritingSink | None,
    quarantine_buffer_rows: int = QUARANTINE_BUFFER_ROWS,
    quarantine_drain_s: float = QUARANTINE_DRAIN_S,
) -> Quality | None:
    """The rules of a sink writing through `writer`, with a lane to the writer of its quarantine
    sink and the writer of its audit sink; None without rules, quarantine or audit."""
    if not rules and quarantine is None and audit is None:
        return None
    quality = Quality(
        rules,
        enforcement,
        writer.columns.prefix,
        QuarantineLane(quarantine.writer, quarantine_buffer_rows, quarantine_drain_s)
        if quarantine is not None
        else None,
        audit.writer if audit is not None else None,
    )
    writer.quality_columns = quality.columns
    return quality
