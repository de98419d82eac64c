"""The Spark engine: writes a Spark DataFrame into a table as one instant.

Executors do the data work — keys, deduplication, the index, merging and writing base files with
pyarrow through the storage layer — and return write stats; the driver plans (from row counts) the
writes that need a plan, runs the transaction and commits. Semantics are the local engine's
(:mod:`cowrite.local.writer`), plus ``bulk_insert``. The Spark jobs of a write:

Upsert, delete, insert_overwrite (the *merge* pipeline: :mod:`.merging`, its index lookup :mod:`.indexing`)::

    1 narrow rows (position, key, partition, ordering columns) ─ shuffle by key ─ stamp key and path,
      deduplicate (latest_per_key) ─ persist; each task reports its rows, smallest and largest key per
      partition (STAT rows) -> driver. (An input Spark knows to hold as few rows as it would
      broadcast: its narrow rows come to the driver, in a job of the JVM alone, and the driver
      deduplicates them: no shuffle, nothing persisted.)
      [null keys and bad partition values fail here: nothing has begun]
    begin the transaction
    2 tag: each task reads the keys of the latest base files of its partitions (footers outside its key
      range skipped) and looks its rows up (tag_locations) — where deduplication left them when the
      index is small, after a range shuffle by (partition, key) otherwise, or in ranges of (partition,
      key) the driver hands out when it holds the rows (Python tasks alone); each task reports its rows
      per (partition, file group) -> driver. Rows as few as Spark would broadcast come to the driver
      with them; more are persisted
    plan on the driver: every file group and file name (assign_inserts for new records), .inflight
    3 route the narrow rows (file group of the key, or by rank into the planned new ones): on the
      driver, the routes then travel with the function that reads the whole rows and keeps the routed
      ones (AttachRoutes); or in the tagging tasks, joined with the whole rows by position ─ shuffle: a
      few file groups per write task ─ write_file_group -> stats
    commit

Insert, bulk_insert (the *append* pipeline: :mod:`.inserts` over :mod:`.append`)::

    begin, .inflight (no file named: the markers name them); list the files of every partition (an
    insert: which partitions hold small file groups, and how many records those have room for)
    1 each task stamps keys and paths and writes its records as new file groups of the target size,
      a marker before each base file -> stats  [null keys and bad partition values fail here: the
      write aborts and deletes every marked file]
      An insert into partitions with small file groups: each task sets aside, per such partition, as
      many records as its small file groups have room for ─ shuffle by partition, sorted ─ one task
      per partition fills them (merged with their base files) and writes the rest as new file groups
      -> stats
    delete the marked files no task reported (failed attempts), commit, delete the markers

Why the design looks like this (measured on Spark 4.3: ``bench/spark_write.py``, figures in
``bench/README.md``): moving a row from the JVM to a Python worker costs a large share of Spark's own
parquet write of it (once Spark's row-by-row check of the Arrow batch size is lifted, see
:mod:`.batching`), and every Spark job and every Python task has a fixed cost. So whole rows go to
Python once, to be written; the steps that only decide (deduplicate, tag, route) see narrow rows;
inserts are written where they are; the index is read inside the tagging tasks instead of being
shuffled; tasks report their counts in their own output instead of an aggregation job over it; tasks are
few, and so are jobs: an insert runs 1, or 2 when it fills small file groups (plus a 1000-row sample
when neither the table's files nor Spark's statistics of a cached input tell the size of a row; plus the
range shuffle of bulk_insert's GLOBAL_SORT); an upsert 5, or 4 when its input is few rows Spark holds.
The merge pipeline reads its input twice (deduplicate, then write): an input that is not cached is
persisted for the write, as Hudi does, and a task that sees other counts than planned fails the write
cleanly (:class:`~.errors.NondeterministicInputError`). An insert reads its input once: nothing is
persisted.

An insert does not know which partitions its input touches before it has read it, so it lists the
files of every partition of the table to find the small file groups: one listing, against the count
job and the persist of the input that planning from counted rows cost (4 jobs). The price of not
counting: every task sets aside the small file groups' whole room, so up to (tasks - 1) times that room
is shuffled for nothing, and the task that fills them writes it as new file groups — at most one more
partly filled file group per partition than a counted plan opens (which the next insert fills).
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema

from cowrite.engine.commit import retry_on_conflict
from cowrite.engine.contract import current_schema, fit
from cowrite.engine.operations import prepare
from cowrite.errors import TxnAlreadyCommittedError
from cowrite.format.instant import Instant
from cowrite.protocol.txn import committing_instant
from cowrite.spark.batching import ArrowBatches
from cowrite.spark.inserts import AppendPipeline
from cowrite.spark.merging import MergePipeline
from cowrite.spark.operations import SparkOperation, WriteMetrics

__all__ = ["SparkOperation", "SparkWriter", "WriteMetrics"]

log = logging.getLogger(__name__)


class SparkWriter(AppendPipeline, MergePipeline):
    """Writes Spark DataFrames into one table: executors write base files, the driver commits.

    The table's storage options (S3 endpoint, credentials) travel to the executors with the tasks;
    a ``memory://`` table cannot be written (executors are other processes).

    With ``options.txn`` (an application id and version) every write is idempotent, as the local
    engine's (:class:`~cowrite.local.writer.LocalWriter`): a version already committed, or older than
    one committed, commits nothing; the write returns the instant that committed the application's last
    version (None if it is no longer on the timeline nor in the archive) and :attr:`refused` says why.
    """

    def insert(self, df: DataFrame) -> Instant | None:
        return self.write(df, SparkOperation.INSERT)

    def bulk_insert(self, df: DataFrame) -> Instant | None:
        return self.write(df, SparkOperation.BULK_INSERT)

    def upsert(self, df: DataFrame) -> Instant | None:
        return self.write(df, SparkOperation.UPSERT)

    def delete(self, df: DataFrame) -> Instant | None:
        return self.write(df, SparkOperation.DELETE)

    def insert_overwrite(self, df: DataFrame) -> Instant | None:
        return self.write(df, SparkOperation.INSERT_OVERWRITE)

    def write(self, df: DataFrame, operation: SparkOperation | str) -> Instant | None:
        """Write ``df`` as one instant and return it; on a conflict retry as configured, each time a new
        instant. A write whose txn is already committed returns the instant that committed it (see the
        class), having committed nothing.

        Raises the local engine's :class:`SchemaError` for input that does not fit the table — before
        anything is written, except for the null keys and bad partition values of an insert or
        bulk_insert, which its tasks find (the write then aborts and deletes what it wrote) —,
        the transaction's errors at commit, and :class:`SparkJobError` when a Spark job fails for
        another reason; in every failure case nothing was committed.
        """
        operation = SparkOperation(operation)
        self.metrics = WriteMetrics()
        self.refused = None
        try:
            return self._write(df, operation)
        except TxnAlreadyCommittedError as exc:
            log.info("nothing written: %s", exc)
            self.refused = exc
            return committing_instant(self.table, exc)

    def _write(self, df: DataFrame, operation: SparkOperation) -> Instant:
        meta = [c for c in df.columns if c.startswith("_hoodie_")]
        if meta:  # only then: a projection would hide that the input is cached
            df = df.drop(*meta)
        df, schema, data_columns = self._validate(df, operation)
        prepared = None
        with ArrowBatches(self.spark) as self._batches:
            if operation.appends:
                return retry_on_conflict(
                    self.config, lambda: self._append(df, operation, schema, data_columns)
                )
            try:
                ready = prepared = self._prepare_merge(df, operation, schema, data_columns)
                return retry_on_conflict(self.config, lambda: self._write_once(ready, operation))
            finally:
                for frame in prepared.release if prepared else []:
                    frame.unpersist()

    def _validate(self, df: DataFrame, operation: SparkOperation) -> tuple[DataFrame, str, tuple[str, ...]]:
        """``df`` fitted to the table's schema by the local engine's rules (:mod:`..contract`), cast with
        Spark; the same errors as the local engine's, raised before anything is written."""
        zone = self.spark.conf.get("spark.sql.session.timeZone") or "UTC"
        current = current_schema(self.table)
        delete = operation is SparkOperation.DELETE
        fitted = fit(to_arrow_schema(df.schema, timezone=zone), current, self.table, delete, self.source)
        prepare(self.table, fitted.target.empty_table(), operation.local, self.source, current)  # key checks
        columns = [
            (F.col(f.name) if f.name in df.columns else F.lit(None))
            .cast(from_arrow_type(f.type))
            .alias(f.name)
            for f in fitted.target
        ]
        return df.select(*columns), fitted.table_schema, tuple(fitted.target.names)
