"""The Spark engine: writes a Spark DataFrame into a table as one instant.

Executors do the data work — keys, deduplication, the index, merging and writing base files with
pyarrow through the storage layer — and return write stats; the driver plans (from row counts) the
writes that need a plan, runs the transaction and commits. Semantics are the local engine's
(:mod:`cowrite.local.writer`), plus ``bulk_insert``. The Spark jobs of a write:

Upsert, delete, insert_overwrite (the *merge* pipeline)::

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

Insert, bulk_insert (the *append* pipeline; see :mod:`.append`)::

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

Why the design looks like this (measured on Spark 4.3, see ``bench/spark_write.py``): moving a row from
the JVM to a Python worker costs about 40 % of Spark's own parquet write of it (once Spark's row-by-row
check of the Arrow batch size is lifted, see :mod:`.batching`), and every Spark job and every Python
task has a fixed cost (0.05-0.15 s a job on two cores). So whole rows go to Python once, to be written;
the steps that only decide (deduplicate, tag, route) see narrow rows; inserts are written where they are;
the index is read inside the tagging tasks instead of being shuffled; tasks report their counts in their
own output instead of an aggregation job over it; tasks are few, and so are jobs: an insert runs 1, or 2
when it fills small file groups (plus a 1000-row sample when neither the table's files nor Spark's
statistics of a cached input tell the size of a row; plus the range shuffle of bulk_insert's
GLOBAL_SORT); an upsert 5, or 4 when its input is few rows Spark holds. The merge pipeline reads its
input twice (deduplicate, then write): an input that is not cached is persisted for the write, as Hudi
does, and a task that sees other counts than planned fails the write cleanly
(:class:`~.errors.NondeterministicInputError`). An insert reads its input once: nothing is persisted.

An insert does not know which partitions its input touches before it has read it, so it lists the
files of every partition of the table to find the small file groups: one listing, against the count
job and the persist of the input that planning from counted rows cost (4 jobs). The price of not
counting: every task sets aside the small file groups' whole room, so up to (tasks - 1) times that room
is shuffled for nothing, and the task that fills them writes it as new file groups — at most one more
partly filled file group per partition than a counted plan opens (which the next insert fills).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import LongType, StringType, StructField, StructType

from cowrite.engine.commit import complete, write_instant
from cowrite.engine.contract import current_schema, fit, latest_schema
from cowrite.engine.operations import Operation, prepare
from cowrite.engine.planning import FILE_ID, SizingPolicy, estimate_record_bytes
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.errors import CommitStateUnknownError, ConfigError, CowriteError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Action, Instant
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.conflict import with_inserted_keys
from cowrite.protocol.transaction import Transaction, WriteOptions, retry_on_conflict
from cowrite.spark.append import (
    FillSmallGroups,
    NewFileGroups,
    SetAside,
    SmallGroups,
    delete_markers,
    delete_unreported,
    discard,
    record_bytes_of,
    small_file_groups,
)
from cowrite.spark.batching import ARROW_BYTES_PER_PARQUET_BYTE, ArrowBatches, size_in_bytes
from cowrite.spark.errors import translate
from cowrite.spark.plan import SparkPlan, plan_merge
from cowrite.spark.tasks import (
    BUCKET,
    POSITION,
    STAT,
    TASK,
    AssignBuckets,
    AttachRoutes,
    Count,
    Deduplicate,
    KeyRange,
    StorageSpec,
    TableSpec,
    TagRows,
    WriteContext,
    WriteGroup,
    deduplicate,
    from_ipc,
    key_ranges,
    stamp,
    stat_from_json,
    to_ipc,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Reading the keys of this many bytes of base files once more costs about what a range shuffle of the
# deduplicated rows costs in its extra job and pass (measured on the benchmark: 56 MB of files, 0.05 s
# more of index reads against 0.1-0.15 s for the shuffle)
IN_PLACE_INDEX_BYTES = 128 << 20

SORT_MODES = ("GLOBAL_SORT", "PARTITION_SORT", "NONE")


class SparkOperation(enum.StrEnum):
    INSERT = "insert"
    BULK_INSERT = "bulk_insert"
    UPSERT = "upsert"
    DELETE = "delete"
    INSERT_OVERWRITE = "insert_overwrite"

    @property
    def action(self) -> Action:
        return Action.REPLACE_COMMIT if self is SparkOperation.INSERT_OVERWRITE else Action.COMMIT

    @property
    def local(self) -> Operation:
        """The local engine's operation with the same input rules (bulk_insert validates as insert)."""
        return Operation.INSERT if self is SparkOperation.BULK_INSERT else Operation(self.value)

    @property
    def appends(self) -> bool:
        return self in (SparkOperation.INSERT, SparkOperation.BULK_INSERT)


@dataclass
class WriteMetrics:
    """What the last write did, for tests and logs."""

    input_rows: int = 0  # after deduplication, where the operation deduplicates
    index_files: int = 0  # latest base files of the touched partitions
    index_files_read: int = 0  # files whose keys a tagging task read (a file may be read by several)
    index_files_pruned: int = 0  # files a tagging task skipped by their footer key range
    file_groups: int = 0  # base files written
    routed_file_groups: int = 0  # of those, written after a shuffle
    tagged_in_place: bool = False  # tagged without a range shuffle (see SparkWriter._tag)
    routed_on_driver: bool = False  # merge rows routed on the driver, as few as Spark would broadcast
    deduplicated_on_driver: bool = False  # and deduplicated rows handed to tagging by the driver
    persisted: list[str] = field(default_factory=list)  # what the write persisted (and released)


@dataclass
class _Prepared:
    """The part of a merge that does not depend on the instant; reused by a retry after a conflict."""

    data: DataFrame  # deduplicated position, key and path
    counts: list[Count]  # deduplicated rows per task and partition (file groups unknown)
    ranges: dict[str | None, tuple[int, str, str]]  # partition -> (rows, min key, max key)
    schema: str  # Avro schema for the commit ("" for deletes: the table's stays)
    data_columns: tuple[str, ...]
    sample: Callable[[], pa.Table]  # a few prepared rows, for sizing when the table has no files yet
    release: list[DataFrame] = field(default_factory=list)
    rows: DataFrame | None = None  # the input's whole rows with their position
    tasks: int = 0  # the tasks that hold the deduplicated rows
    local: pa.Table | None = None  # the deduplicated rows (with TASK), when few: on the driver


class SparkWriter:
    """Writes Spark DataFrames into one table: executors write base files, the driver commits.

    The table's storage options (S3 endpoint, credentials) travel to the executors with the tasks;
    a ``memory://`` table cannot be written (executors are other processes).
    """

    def __init__(
        self, table: Table, spark: SparkSession, options: WriteOptions | None = None, source: str = "input"
    ) -> None:
        if table.uri.startswith("memory://"):
            raise ConfigError(
                f"{table.uri}: Spark executors are separate processes and cannot reach an in-memory table; "
                "use a local path or s3://"
            )
        self.table = table
        self.spark = spark
        self.options = options or WriteOptions(config=table.config)
        self.config = self.options.config
        self.source = source
        self.spec = TableSpec.of(table, self.config, source)
        self.metrics = WriteMetrics()
        self._read: Any = None  # accumulators of index files read and pruned, while a write runs
        self._pruned: Any = None
        self._batches = ArrowBatches(spark)  # the Arrow batch settings of the running write

    # -- operations --------------------------------------------------------------------------------------
    def insert(self, df: DataFrame) -> Instant:
        return self.write(df, SparkOperation.INSERT)

    def bulk_insert(self, df: DataFrame) -> Instant:
        return self.write(df, SparkOperation.BULK_INSERT)

    def upsert(self, df: DataFrame) -> Instant:
        return self.write(df, SparkOperation.UPSERT)

    def delete(self, df: DataFrame) -> Instant:
        return self.write(df, SparkOperation.DELETE)

    def insert_overwrite(self, df: DataFrame) -> Instant:
        return self.write(df, SparkOperation.INSERT_OVERWRITE)

    def write(self, df: DataFrame, operation: SparkOperation | str) -> Instant:
        """Write ``df`` as one instant; on a conflict retry as configured, each time a new instant.

        Raises the local engine's :class:`SchemaError` for input that does not fit the table — before
        anything is written, except for the null keys and bad partition values of an insert or
        bulk_insert, which its tasks find (the write then aborts and deletes what it wrote) —,
        the transaction's errors at commit, and :class:`SparkJobError` when a Spark job fails for
        another reason; in every failure case nothing was committed.
        """
        operation = SparkOperation(operation)
        self.metrics = WriteMetrics()
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

    # -- validation ----------------------------------------------------------------------------------
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

    # -- appends: written where the records are --------------------------------------------------------
    def _append(
        self, df: DataFrame, operation: SparkOperation, schema: str, data_columns: tuple[str, ...]
    ) -> Instant:
        """One instant: each task stamps its records and writes them as new file groups
        (:class:`~.append.NewFileGroups`) — one Spark job. An insert into partitions with small file
        groups sets their share of the records aside in that job, and a second stage fills them
        (:class:`~.append.SetAside`, :class:`~.append.FillSmallGroups`). The driver deletes the files
        of failed task attempts and commits. Input errors (null keys, bad partition values) fail the
        job: the write aborts and its marked files are deleted.
        """
        table = self.table
        data, sort = self._sorted_for_bulk_insert(df, operation)
        transaction = Transaction.begin(table, operation.value, operation.action, self.options)
        instant = transaction.instant_time
        stats: list[Any] = []
        try:
            # no file is known before the tasks write: the plan names none, the markers name them all
            transaction.plan(self._metadata(operation, (), {}, schema))
            small, record_bytes = self._small_file_groups(operation, transaction.begin_timeline)
            self._fit_batches(df, record_bytes)
            files = NewFileGroups(
                self.spec,
                instant,
                transaction.holder.owner,
                data_columns,
                self.config.get(keys.PARQUET_MAX_FILE_SIZE),
                record_bytes,
                sorted_by_partition=sort,
            )
            if small:
                written = self._set_aside_and_fill(data, files, small)
            else:
                written = data.mapInArrow(files, f"{STAT} string")
            stats = [stat_from_json(r[0]) for r in self._run("write", written.collect)]
            delete_unreported(table.storage, instant, stats)
            transaction.check_alive()
        except BaseException as exc:
            transaction.abort(exc)
            _discard(table, instant, stats)
            raise
        self.metrics.input_rows = sum(s.num_inserts for s in stats)
        self.metrics.file_groups = len(stats)
        self.metrics.routed_file_groups = sum(1 for s in stats if s.prev_commit != "null")
        try:
            done = complete(transaction, self._metadata(operation, stats, {}, schema))
        except CommitStateUnknownError:
            raise  # the files may be committed: only a look at the timeline can tell
        except BaseException:
            _discard(table, instant, stats)
            raise
        delete_markers(table.storage, instant)
        return done

    def _small_file_groups(
        self, operation: SparkOperation, timeline: Timeline
    ) -> tuple[SmallGroups, float | None]:
        """The small file groups an append fills (partition -> (base file, room)), and the bytes per
        record of the table's files (None for a table without any).

        A bulk_insert fills none. An insert looks at every partition of the table — which ones its
        input touches is unknown without a pass over it — so it lists the files of every partition:
        one listing, against the count job and the persist of the input a plan from counts would cost.
        """
        table = self.table
        small_file_bytes = self.config.get(keys.PARQUET_SMALL_FILE_LIMIT)
        if operation is SparkOperation.BULK_INSERT or small_file_bytes <= 0:
            return {}, record_bytes_of(table, timeline)
        view = FileSystemView.build(table, timeline)
        if not view.groups:
            return {}, None
        record_bytes = estimate_record_bytes(view, table.storage, pa.table({}), sorted(view.partitions))
        sizing = SizingPolicy(self.config.get(keys.PARQUET_MAX_FILE_SIZE), small_file_bytes, record_bytes)
        return small_file_groups(view, sizing), record_bytes

    def _set_aside_and_fill(self, data: DataFrame, files: NewFileGroups, small: SmallGroups) -> DataFrame:
        """Stage 1 writes the records of other partitions where they are and sets aside, per task, as
        many records of each partition with small file groups as those take; a shuffle by partition
        brings a partition's set-aside rows to one task, sorted, which fills the small file groups and
        writes the rest as new ones."""
        room = {partition: sum(r for _, r in groups) for partition, groups in small.items()}
        out = StructType(
            [StructField(f.name, f.dataType, True) for f in data.schema]
            + [StructField(c, StringType(), True) for c in (RECORD_KEY, PARTITION_PATH, STAT)]
        )
        aside = data.mapInArrow(SetAside(files, room), out)
        return (
            aside.repartition(self._write_tasks(), PARTITION_PATH)
            .sortWithinPartitions(PARTITION_PATH)
            .mapInArrow(FillSmallGroups(files, small), f"{STAT} string")
        )

    def _sorted_for_bulk_insert(self, df: DataFrame, operation: SparkOperation) -> tuple[DataFrame, bool]:
        """``df`` as the bulk_insert sort mode wants it, and whether each task's rows come by partition.

        GLOBAL_SORT: range partitioned by (partition, key) into the configured tasks, PARTITION_SORT:
        as the tasks hold them; either way sorted within each task by (partition, key), as Hudi's sort
        modes do, so a task finishes one partition's files before the next partition's rows come and
        each file holds a run of keys.
        """
        table = self.table
        if operation is not SparkOperation.BULK_INSERT:
            return df, False
        mode = self.config.get(keys.BULKINSERT_SORT_MODE).upper()
        if mode not in SORT_MODES:
            raise ConfigError(f"{keys.BULKINSERT_SORT_MODE.key}={mode}: use one of {', '.join(SORT_MODES)}")
        data = df
        if mode == "GLOBAL_SORT":
            parallelism = self._parallelism(keys.BULKINSERT_SHUFFLE_PARALLELISM)
            data = data.repartitionByRange(parallelism, *table.partition_fields, *table.record_key_fields)
        if mode == "NONE":
            return data, False
        return data.sortWithinPartitions(*table.partition_fields, *table.record_key_fields), True

    def _fit_batches(self, df: DataFrame, record_bytes: float | None) -> None:
        """Arrow batches fitted to the rows' size: from the table's files, else from what Spark knows of
        a cached input, else from a sample of the input (a small job; only a table without files and an
        input Spark does not hold can need it)."""
        if record_bytes is not None:
            self._batches.fit(record_bytes * ARROW_BYTES_PER_PARQUET_BYTE)
            return
        in_memory = _bytes_per_row(df)
        if in_memory is None:
            sample = stamp(self._run("sample", lambda: df.limit(1000).toArrow()), self.spec)
            in_memory = sample.nbytes / max(sample.num_rows, 1)
        self._batches.fit(in_memory)

    # -- before the instant ---------------------------------------------------------------------------
    def _prepare_merge(
        self, df: DataFrame, operation: SparkOperation, schema: str, data_columns: tuple[str, ...]
    ) -> _Prepared:
        """Deduplicate the *narrow* rows: position, key, partition and ordering columns only.

        Moving a row between the JVM and Python costs a good share of writing it, so the steps that
        only decide (deduplicate, tag, route) see narrow rows; the whole rows of the winners meet their
        routes by position and go to Python once, to be written.
        """
        table, release = self.table, []
        with_paths = operation is not SparkOperation.DELETE or all(
            f in df.columns for f in table.partition_fields
        )
        ordering = () if operation is SparkOperation.DELETE else table.ordering_fields
        keyed = df.withColumn(POSITION, F.monotonically_increasing_id())
        if not _is_persisted(df):  # the position must name the same row in both evaluations
            keyed = keyed.persist(StorageLevel.MEMORY_AND_DISK)
            release.append(keyed)
            self.metrics.persisted.append("input")
        paths = table.partition_fields if with_paths else ()
        narrow_columns = [*dict.fromkeys([*table.record_key_fields, *paths, *ordering]), POSITION]
        narrow = keyed.select(*narrow_columns)
        tasks = self._key_tasks(df)
        out = StructType(
            [StructField(f.name, f.dataType, True) for f in narrow.schema]
            + [StructField(c, StringType(), True) for c in (RECORD_KEY, PARTITION_PATH, STAT)]
        )
        deduplicated = (
            self._by_key(narrow, tasks)
            .mapInArrow(Deduplicate(self.spec, ordering, with_paths), out)
            .select(POSITION, RECORD_KEY, PARTITION_PATH, STAT)
        )
        local: pa.Table | None = None
        known = _row_count(df)
        if known is not None and self._broadcastable(known):
            # as few rows as Spark would broadcast: the narrow rows come to the driver — one job of the
            # JVM alone, no shuffle, no Python task — which deduplicates them and hands them to the
            # tagging tasks itself (see _tag_here) instead of persisting them
            collected = self._run("collect keys", narrow.toArrow)
            # nullable, as the rows of Python tasks are: routed rows of both kinds are concatenated
            collected = collected.cast(pa.schema([f.with_nullable(True) for f in collected.schema]))
            winners = deduplicate(collected, self.spec, ordering, with_paths)
            local = winners.select([POSITION, RECORD_KEY, PARTITION_PATH]).append_column(
                TASK, pa.repeat(pa.scalar(0, pa.int32()), winners.num_rows)
            )
            found = key_ranges(winners, 0)
            self.metrics.deduplicated_on_driver = True
        else:
            deduplicated = deduplicated.persist(StorageLevel.MEMORY_AND_DISK)
            release.append(deduplicated)
            self.metrics.persisted.append("deduplicated keys")
            found = [KeyRange.from_json(t) for t in self._run("deduplicate", lambda: _carried(deduplicated))]
        ranges: dict[str | None, tuple[int, str, str]] = {}
        for r in found:
            rows, low, high = ranges.get(r.partition, (0, r.low, r.high))
            ranges[r.partition] = (rows + r.rows, min(low, r.low), max(high, r.high))
        counts = [Count(r.task, r.partition, None, r.rows) for r in found if r.partition is not None]
        self.metrics.input_rows = sum(rows for rows, _, _ in ranges.values())

        def sample() -> pa.Table:
            return stamp(self._run("sample", lambda: df.limit(1000).toArrow()), self.spec, with_paths)

        data = deduplicated.where(F.col(STAT).isNull()).drop(STAT)
        return _Prepared(data, counts, ranges, schema, data_columns, sample, release, keyed, tasks, local)

    # -- one instant ---------------------------------------------------------------------------------
    def _write_once(self, prepared: _Prepared, operation: SparkOperation) -> Instant:
        def write(transaction: Transaction) -> CommitMetadata:
            release: list[DataFrame] = []
            try:
                metadata = self._merge(transaction, prepared, operation, release)
            finally:
                for frame in release:
                    frame.unpersist()
            if self.config.get(keys.CONFLICT_ON_RECORD_KEYS):  # rivals compare their new keys with these
                metadata = with_inserted_keys(self.table, metadata, transaction.instant_time)
            transaction.check_alive()
            return metadata

        return write_instant(self.table, operation.value, operation.action, self.options, write)

    def _sizing(self, view: FileSystemView, prepared: _Prepared, partitions: Sequence[str]) -> SizingPolicy:
        """File sizes of the plan; the whole rows that follow go to Python in batches fitted to them."""
        sizing = SizingPolicy(
            max_file_bytes=self.config.get(keys.PARQUET_MAX_FILE_SIZE),
            small_file_bytes=self.config.get(keys.PARQUET_SMALL_FILE_LIMIT),
            record_bytes=estimate_record_bytes(
                view, self.table.storage, cast(pa.Table, _LazySample(prepared.sample)), partitions
            ),
        )
        self._batches.fit(sizing.record_bytes * ARROW_BYTES_PER_PARQUET_BYTE)
        return sizing

    def _merge(
        self,
        transaction: Transaction,
        prepared: _Prepared,
        operation: SparkOperation,
        release: list[DataFrame],
    ) -> CommitMetadata:
        table = self.table
        partitions = sorted(p for p in prepared.ranges if p is not None)
        lookup_all = None in prepared.ranges  # deletes without partition columns: every partition
        view = FileSystemView.build(
            table, transaction.begin_timeline, partitions=None if lookup_all else partitions
        )
        replaced: dict[str, tuple[str, ...]] = {}
        deduplicated = prepared.data
        # rows Spark would broadcast to join them with the whole rows are routed on the driver: they
        # pass through it anyway, and routing them there spares a pass of Python tasks and a job
        on_driver: pa.Table | None = None
        local = self.metrics.routed_on_driver = self._broadcastable(self.metrics.input_rows)
        if operation is SparkOperation.INSERT_OVERWRITE:
            replaced = {p: tuple(g.file_id for g in view.in_partition(p)) for p in partitions}
            replaced = {p: ids for p, ids in replaced.items() if ids}
            view = FileSystemView(())
            tagged = deduplicated.withColumn(FILE_ID, F.lit(None).cast(StringType()))
            counts = prepared.counts  # every row is new, in the tasks that deduplicated it
            if prepared.local is not None:
                on_driver = prepared.local.append_column(
                    FILE_ID, pa.nulls(prepared.local.num_rows, pa.string())
                )
            elif local:
                on_driver = self._run("collect keys", lambda: _with_task(tagged).toArrow())
        elif prepared.local is not None:
            keep_new = operation is not SparkOperation.DELETE
            counts, on_driver = self._tag_here(prepared.local, view, len(partitions), lookup_all, keep_new)
        else:
            keep_new = operation is not SparkOperation.DELETE
            tagged = self._tag(deduplicated, prepared.tasks, view, len(partitions), lookup_all, keep_new)
            if local:
                found = self._run("tag", lambda: _with_task(tagged).toArrow())
                carried = pc.is_valid(found.column(STAT))
                counts = [Count.from_json(text) for text in found.column(STAT).filter(carried).to_pylist()]
                on_driver = found.filter(pc.invert(carried)).drop_columns([STAT])
            else:
                # tagging (and its index reads) runs once: counting and routing see the same tasks
                tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
                release.append(tagged)
                counts = [
                    Count.from_json(text) for text in self._run("tag and count", lambda: _carried(tagged))
                ]
                tagged = tagged.where(F.col(STAT).isNull()).drop(STAT)
        self._index_metrics()
        transaction.check_alive()
        sizing = self._sizing(view, prepared, partitions)
        merge = True
        plan = plan_merge(transaction.instant_time, counts, view, sizing, merge, self._write_tasks())
        schema = (
            prepared.schema
            if operation is not SparkOperation.DELETE
            else latest_schema(table, transaction.begin_timeline)
        )
        transaction.plan(self._metadata(operation, plan.planned_stats(), replaced, schema))
        context = WriteContext(
            self.spec,
            transaction.instant_time,
            plan.buckets,
            prepared.data_columns,
            delete=operation is SparkOperation.DELETE,
        )
        stats = []
        if plan.routed:
            assign = AssignBuckets(plan.updates, plan.segments)
            assert prepared.rows is not None
            whole = prepared.rows.drop(
                *[c for c in (RECORD_KEY, PARTITION_PATH) if c in prepared.rows.columns]
            )
            if on_driver is not None:
                # the routes travel with the function that reads the whole rows: no job builds a
                # broadcast of them, no join
                out = StructType(
                    [
                        *whole.schema,
                        StructField(RECORD_KEY, StringType(), True),
                        StructField(PARTITION_PATH, StringType(), True),
                        StructField(BUCKET, LongType(), True),
                    ]
                )
                routes = AttachRoutes.of(assign.route_tasks(on_driver), tuple(out.fieldNames()))
                routed = whole.mapInArrow(routes, out)
            else:
                routed_schema = StructType(
                    [f for f in tagged.schema if f.name not in (FILE_ID, STAT)]
                    + [StructField(BUCKET, LongType(), True)]
                )
                routed = tagged.mapInArrow(assign, routed_schema)
                if operation is not SparkOperation.DELETE:  # a delete needs the keys only
                    routed = whole.join(routed, POSITION)
            written = (
                routed.repartition(plan.write_tasks, BUCKET)
                .groupBy(BUCKET)
                .applyInArrow(WriteGroup(context).as_function(), f"{STAT} string")
            )
            stats = self._collect_stats(written, plan)
        return self._metadata(operation, stats, replaced, schema)

    # -- helpers -------------------------------------------------------------------------------------
    def _tag(
        self,
        deduplicated: DataFrame,
        held: int,
        view: FileSystemView,
        partitions: int,
        by_key_only: bool,
        keep_new: bool,
    ) -> DataFrame:
        """``deduplicated`` with ``FILE_ID`` and count rows, tagged on executors (:class:`~.tasks.TagRows`).

        Each task reads the keys of the files of the partitions its rows touch, skipping files whose
        footer key range misses its keys; no index row is shuffled. Where the deduplicating tasks are
        few and the touched files small, rows are tagged where they are: each task then reads the
        touched files of all partitions it holds (a file is read by up to every task), which costs less
        than the range shuffle's job and pass over the rows below :data:`IN_PLACE_INDEX_BYTES` of
        extra reads. Otherwise rows are range partitioned by (partition path, key) into at most one task
        per touched partition first: a task reads the files of the few partitions it holds, and a large
        partition spans at most a few tasks.
        """
        tagger = self._tagger(view, (*deduplicated.columns, FILE_ID, STAT), by_key_only, keep_new)
        files = tagger.files
        out = StructType(
            [
                *deduplicated.schema,
                StructField(FILE_ID, StringType(), True),
                StructField(STAT, StringType(), True),
            ]
        )
        extra_reads = (held - 1) * sum(b.size for found in files.values() for b in found)
        if extra_reads <= IN_PLACE_INDEX_BYTES:
            self.metrics.tagged_in_place = True
            return deduplicated.mapInArrow(tagger, out)
        tasks = max(1, min(held, partitions or 1))
        ranged = [RECORD_KEY] if by_key_only else [PARTITION_PATH, RECORD_KEY]
        return deduplicated.repartitionByRange(tasks, *ranged).mapInArrow(tagger, out)

    def _tagger(
        self, view: FileSystemView, columns: tuple[str, ...], by_key_only: bool, keep_new: bool
    ) -> TagRows:
        files: dict[str, list[Any]] = {}
        for base in view.latest_base_files():
            files.setdefault(base.partition, []).append(base)
        self.metrics.index_files = sum(len(f) for f in files.values())
        context = self.spark.sparkContext
        self._read, self._pruned = context.accumulator(0), context.accumulator(0)
        return TagRows(
            StorageSpec.of(self.table.storage),
            {p: tuple(f) for p, f in files.items()},
            columns,
            by_key_only,
            keep_new,
            self._read,
            self._pruned,
        )

    def _tag_here(
        self, rows: pa.Table, view: FileSystemView, partitions: int, by_key_only: bool, keep_new: bool
    ) -> tuple[list[Count], pa.Table]:
        """Counts and tagged rows (with ``TASK``) of deduplicated rows the driver holds.

        The driver sorts the rows by (partition path, key) and hands each tagging task a contiguous
        range — at most one task per core and per touched partition, no shuffle, no sampling — in a job
        of Python tasks alone (no rows cross the JVM).
        """
        columns = tuple(c for c in rows.column_names if c != TASK)
        tagger = self._tagger(view, (*columns, FILE_ID, STAT), by_key_only, keep_new)
        order = (
            [(RECORD_KEY, "ascending")]
            if by_key_only
            else [(PARTITION_PATH, "ascending"), (RECORD_KEY, "ascending")]
        )
        ordered = rows.select(list(columns)).sort_by(order)
        tasks = max(1, min(self.spark.sparkContext.defaultParallelism, partitions or 1, ordered.num_rows))
        size = max(1, -(-ordered.num_rows // tasks))
        ranges = [to_ipc(ordered.slice(start, size)) for start in range(0, max(ordered.num_rows, 1), size)]
        found = self._run(
            "tag",
            lambda: self.spark.sparkContext.parallelize(ranges, len(ranges)).map(tagger.stream).collect(),
        )
        counts: list[Count] = []
        tagged: list[pa.Table] = []
        for task, table in enumerate(map(from_ipc, found)):
            carried = pc.is_valid(table.column(STAT))
            counts.extend(Count.from_json(text) for text in table.column(STAT).filter(carried).to_pylist())
            rows_of_task = table.filter(pc.invert(carried)).drop_columns([STAT])
            tagged.append(
                rows_of_task.append_column(
                    TASK, pa.repeat(pa.scalar(task, pa.int32()), rows_of_task.num_rows)
                )
            )
        return counts, pa.concat_tables(tagged)

    def _index_metrics(self) -> None:
        if self._read is not None and self._pruned is not None:
            self.metrics.index_files_read = self._read.value
            self.metrics.index_files_pruned = self._pruned.value
        self._read = self._pruned = None

    def _collect_stats(self, written: DataFrame, plan: SparkPlan) -> list[Any]:
        rows = self._run("write", lambda: written.select(STAT).where(F.col(STAT).isNotNull()).collect())
        order = {b.write.new_path: b.task for b in plan.buckets.values()}
        stats = sorted((stat_from_json(r[0]) for r in rows), key=lambda s: order.get(s.path, -1))
        self.metrics.file_groups = len(stats)
        self.metrics.routed_file_groups = len(plan.routed)
        planned = {b.write.new_path for b in plan.buckets.values()}
        unplanned = [s.path for s in stats if s.path not in planned]
        if unplanned or len(stats) != len(planned):
            raise CowriteError(
                f"the write of {self.table.name} produced {len(stats)} base files where {len(planned)} were "
                f"planned ({', '.join(unplanned[:3]) or 'some missing'}); nothing was committed"
            )
        return stats

    def _metadata(
        self,
        operation: SparkOperation,
        stats: Sequence[Any],
        replaced: dict[str, tuple[str, ...]],
        schema: str,
    ) -> CommitMetadata:
        return CommitMetadata(operation.value, tuple(stats), replaced, schema)

    def _by_key(self, frame: DataFrame, tasks: int) -> DataFrame:
        """Rows of one record key in one of ``tasks`` tasks (see :meth:`_key_tasks`)."""
        return frame.repartition(tasks, *self.table.record_key_fields)

    def _key_tasks(self, df: DataFrame) -> int:
        """Tasks that deduplicate: as many as configured, else as the input has.

        (Adaptive execution cannot merge small shuffle partitions of a persisted plan, and every Python
        task has a fixed cost: the input's own partitioning is the best guess of its size.)
        """
        configured = self.config.get(keys.UPSERT_SHUFFLE_PARALLELISM)
        return configured if configured > 0 else max(1, df.rdd.getNumPartitions())  # an empty input has none

    def _broadcastable(self, rows: int) -> bool:
        """Whether Spark would broadcast ``rows`` narrow rows (position, key, path, route) in a join.

        Such rows pass through the driver anyway, so they are routed there. (Spark cannot know the
        size of a Python function's output: it is told, as narrow rows are a few dozen bytes.)
        """
        threshold = self.spark.conf.get("spark.sql.autoBroadcastJoinThreshold") or "10m"
        limit = size_in_bytes(threshold, 10 << 20)
        return 0 <= rows * 64 <= limit

    def _write_tasks(self) -> int:
        """At most this many tasks write routed file groups: one per core of the cluster.

        Route keys spread file groups evenly over the tasks; a second task per core balanced nothing
        more on the benchmark and cost its fixed share (upsert 2.03 -> 1.88 s with one per core).
        """
        return max(1, self.spark.sparkContext.defaultParallelism)

    def _parallelism(self, key: keys.ConfigKey[int]) -> int:
        configured = self.config.get(key)
        if configured > 0:
            return configured
        return int(self.spark.conf.get("spark.sql.shuffle.partitions") or 200)

    def _run(self, name: str, job: Callable[[], T]) -> T:
        """Run one Spark job, its failure translated (see :func:`.errors.translate`)."""
        started = time.monotonic()
        with _translated():
            result = job()
        log.debug("%s on %s: %.2f s", name, self.table.name, time.monotonic() - started)
        return result


def _discard(table: Table, instant: str, stats: Sequence[Any]) -> None:
    """The marked files of a failed write, deleted; what cannot be deleted now the rollback finds."""
    try:
        discard(table.storage, instant, stats)
    except CowriteError as exc:
        log.warning("could not delete the files of failed instant %s of %s: %s", instant, table.name, exc)


def _bytes_per_row(df: DataFrame) -> float | None:
    """Bytes per row of ``df`` in memory if Spark knows them without a job (a cached input), else None."""
    try:
        stats = df._jdf.queryExecution().optimizedPlan().stats()
        count = stats.rowCount()
        if not count.isDefined():
            return None
        rows = int(str(count.get()))
        return int(str(stats.sizeInBytes())) / rows if rows > 0 else None
    except Exception:  # statistics are a hint: a plan that cannot give them gives none
        return None


class _LazySample:
    """Stands in for the prepared input in ``estimate_record_bytes``: sampled only if it is consulted."""

    def __init__(self, load: Callable[[], pa.Table]) -> None:
        self._load = load
        self._table: pa.Table | None = None

    def _get(self) -> pa.Table:
        if self._table is None:
            self._table = self._load()
        return self._table

    @property
    def nbytes(self) -> int:
        return int(self._get().nbytes)

    @property
    def num_rows(self) -> int:
        return int(self._get().num_rows)


def _row_count(df: DataFrame) -> int | None:
    """The rows of ``df`` if Spark knows them without a job (a cached input's statistics), else None."""
    try:
        count = df._jdf.queryExecution().optimizedPlan().stats().rowCount()
        return int(str(count.get())) if count.isDefined() else None
    except Exception:  # statistics are a hint: a plan that cannot give them gives none
        return None


def _with_task(frame: DataFrame) -> DataFrame:
    """``frame`` with the Spark task that holds each row in ``TASK``."""
    return frame.withColumn(TASK, F.spark_partition_id())


def _carried(frame: DataFrame) -> list[str]:
    """The ``STAT`` texts the tasks behind ``frame`` reported (see :func:`.tasks.carrying`)."""
    return [r[0] for r in frame.where(F.col(STAT).isNotNull()).select(STAT).collect()]


def _is_persisted(df: DataFrame) -> bool:
    level = df.storageLevel
    return bool(level.useMemory or level.useDisk)


@contextmanager
def _translated() -> Iterator[None]:
    """Spark job failures as cowrite errors (see :func:`.errors.translate`)."""
    try:
        yield
    except CowriteError:
        raise
    except PySparkException as exc:
        raise translate(exc) from exc
    except Exception as exc:  # py4j errors of a broken gateway and the like
        if type(exc).__module__.startswith(("py4j", "pyspark")):
            raise translate(exc) from exc
        raise
