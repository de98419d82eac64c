"""The Spark engine: writes a Spark DataFrame into a table as one instant.

Executors do the data work — keys, deduplication, the index, merging and writing base files with
pyarrow through the storage layer — and return write stats; the driver only plans (from row counts),
runs the transaction and commits. Semantics are the local engine's (:mod:`cowrite.writer.local`), plus
``bulk_insert``.

Upsert, delete, insert_overwrite (the *merge* pipeline)::

    input ─ shuffle by key ─ stamp keys/paths, dedupe (latest_per_key) ─┬─ key ranges per partition (job 1)
                                     [validation happens here: nothing began yet]
    begin ─ index: latest base files of the touched partitions, keys only, pruned by footer key ranges
          ─ join by (key, partition) ─ count per (task, partition, file group) (job 2)
          ─ plan on the driver (file names, .inflight)
          ─ route rows to file groups ─ shuffle: one file group per task ─ write_file_group (job 3)
          ─ commit

Insert, bulk_insert (the *append* pipeline)::

    count keys/partitions per task (job 1, validates keys) ─ begin ─ plan ─ each task writes the new
    file groups of its own records, rows for small file groups are shuffled to theirs (job 2) ─ commit

Why inserts write where the rows are: a shuffle of every row costs about as much as the whole parquet
write; only the records that fill existing small file groups must meet their base file. Both pipelines
read their input twice (count, then write): an input that is not cached is persisted for the write, as
Hudi does, and a task that sees other counts than planned fails the write cleanly.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StringType, StructField, StructType

from ...timeline import config as keys
from ...timeline.commit_metadata import CommitMetadata
from ...timeline.errors import ConfigError, CowriteError, WriteConflictError
from ...timeline.fs_view import FileSystemView
from ...timeline.instant import Action, Instant
from ...timeline.table import Table
from ...timeline.transaction import Transaction, WriteOptions
from ..local import LocalWriter, Operation, _latest_schema
from ..planning import FILE_ID, SizingPolicy, estimate_record_bytes
from ..records import PARTITION_PATH, RECORD_KEY
from ..schema import avro_schema
from .errors import translate
from .plan import Count, SparkPlan, plan_append, plan_merge
from .tasks import (
    BUCKET,
    COUNT_SCHEMA,
    INDEX_SCHEMA,
    POSITION,
    STAT,
    AssignBuckets,
    CountRows,
    Deduplicate,
    ReadIndex,
    StorageSpec,
    TableSpec,
    WriteContext,
    WriteGroup,
    WriteInserts,
    stamp,
    stat_from_json,
)

if TYPE_CHECKING:
    from py4j.protocol import Py4JJavaError  # noqa: F401

log = logging.getLogger(__name__)
T = TypeVar("T")

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
    index_files: int = 0  # latest base files the index considered
    index_files_pruned: int = 0  # of those, skipped by their footer key range
    file_groups: int = 0  # base files written
    routed_file_groups: int = 0  # of those, written after a shuffle
    persisted: list[str] = field(default_factory=list)  # what the write persisted (and released)


@dataclass
class _Prepared:
    """The part of a write that does not depend on the instant; reused by a retry after a conflict."""

    data: DataFrame  # append: the input (persisted); merge: deduplicated rows with key and path
    counts: list[Count]  # append: rows per task and partition
    ranges: dict[str | None, tuple[int, str, str]]  # merge: partition -> (rows, min key, max key)
    schema: str  # Avro schema for the commit ("" for deletes: the table's stays)
    data_columns: tuple[str, ...]
    sample: Callable[[], pa.Table]  # a few prepared rows, for sizing when the table has no files yet
    release: list[DataFrame] = field(default_factory=list)


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
        self._pruned: Any = None  # the accumulator of index files pruned, while a write runs

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

        Raises the local engine's :class:`SchemaError` for input that does not fit the table before
        anything is written, the transaction's errors at commit, and :class:`SparkJobError` when a Spark
        job fails for another reason; in every failure case nothing was committed.
        """
        operation = SparkOperation(operation)
        self.metrics = WriteMetrics()
        meta = [c for c in df.columns if c.startswith("_hoodie_")]
        if meta:  # only then: a projection would hide that the input is cached
            df = df.drop(*meta)
        schema, data_columns = self._validate(df, operation)
        prepared = None
        try:
            prepared = self._prepare(df, operation, schema, data_columns)
            retries = self.config.get(keys.RETRIES_ON_CONFLICT)
            for attempt in range(retries + 1):
                try:
                    return self._write_once(prepared, operation)
                except WriteConflictError as exc:
                    if attempt == retries:
                        raise
                    log.warning("retrying after conflict (%d of %d): %s", attempt + 1, retries, exc)
            raise AssertionError("unreachable")
        finally:
            for frame in prepared.release if prepared else []:
                frame.unpersist()

    # -- validation ----------------------------------------------------------------------------------
    def _validate(self, df: DataFrame, operation: SparkOperation) -> tuple[str, tuple[str, ...]]:
        """The local engine's checks on an empty table of the input's schema: the same errors, at once."""
        empty = to_arrow_schema(df.schema).empty_table()
        prepared = LocalWriter(self.table, self.options)._prepare(empty, operation.local, self.source)
        data = prepared.drop_columns([RECORD_KEY, PARTITION_PATH])
        schema = "" if operation is SparkOperation.DELETE else avro_schema(data.schema, self.table.name)
        return schema, tuple(data.column_names)

    # -- before the instant --------------------------------------------------------------------------
    def _prepare(
        self, df: DataFrame, operation: SparkOperation, schema: str, data_columns: tuple[str, ...]
    ) -> _Prepared:
        if operation.appends:
            return self._prepare_append(df, operation, schema, data_columns)
        return self._prepare_merge(df, operation, schema, data_columns)

    def _prepare_append(
        self, df: DataFrame, operation: SparkOperation, schema: str, data_columns: tuple[str, ...]
    ) -> _Prepared:
        table, release = self.table, []
        data, sort = df, False
        global_sort = False
        if operation is SparkOperation.BULK_INSERT:
            mode = self.config.get(keys.BULKINSERT_SORT_MODE).upper()
            if mode not in SORT_MODES:
                raise ConfigError(
                    f"{keys.BULKINSERT_SORT_MODE.key}={mode}: use one of {', '.join(SORT_MODES)}"
                )
            global_sort = mode == "GLOBAL_SORT"
            sort = mode != "NONE" and bool(table.partition_fields)
        if global_sort:
            parallelism = self._parallelism(keys.BULKINSERT_SHUFFLE_PARALLELISM)
            data = data.repartitionByRange(parallelism, *table.partition_fields, *table.record_key_fields)
        if global_sort or not _is_persisted(data):
            # counting and writing must see the same rows in the same tasks
            data = data.persist(StorageLevel.MEMORY_AND_DISK)
            release.append(data)
            self.metrics.persisted.append("input")
        counted = data
        if sort:  # a sort within tasks keeps their rows: the counts stay valid
            data = data.sortWithinPartitions(*table.partition_fields)
        columns = [*dict.fromkeys([*table.record_key_fields, *table.partition_fields])]
        found = self._run(
            lambda: (
                counted.select(*columns)
                .mapInArrow(CountRows(self.spec, stamp_input=True), COUNT_SCHEMA)
                .collect()
            )
        )
        counts = [Count(r.task, r.partition, None, r.rows) for r in found]
        self.metrics.input_rows = sum(c.rows for c in counts)

        def sample() -> pa.Table:
            return stamp(self._run(lambda: counted.limit(1000).toArrow()), self.spec)

        return _Prepared(data, counts, {}, schema, data_columns, sample, release)

    def _prepare_merge(
        self, df: DataFrame, operation: SparkOperation, schema: str, data_columns: tuple[str, ...]
    ) -> _Prepared:
        table = self.table
        with_paths = operation is not SparkOperation.DELETE or all(
            f in df.columns for f in table.partition_fields
        )
        ordering = () if operation is SparkOperation.DELETE else table.ordering_fields
        out = StructType(
            [StructField(f.name, f.dataType, True) for f in df.schema]
            + [StructField(RECORD_KEY, StringType(), True), StructField(PARTITION_PATH, StringType(), True)]
        )
        deduplicated = (
            df.withColumn(POSITION, F.monotonically_increasing_id())
            .repartition(self._parallelism(keys.UPSERT_SHUFFLE_PARALLELISM), *table.record_key_fields)
            .mapInArrow(Deduplicate(self.spec, ordering, with_paths), out)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        self.metrics.persisted.append("deduplicated input")
        found = self._run(
            lambda: (
                deduplicated.groupBy(PARTITION_PATH)
                .agg(
                    F.count(F.lit(1)).alias("rows"),
                    F.min(RECORD_KEY).alias("low"),
                    F.max(RECORD_KEY).alias("high"),
                )
                .collect()
            )
        )
        ranges = {r[PARTITION_PATH]: (r.rows, r.low, r.high) for r in found}
        self.metrics.input_rows = sum(rows for rows, _, _ in ranges.values())

        def sample() -> pa.Table:
            return self._run(lambda: deduplicated.limit(1000).toArrow())

        return _Prepared(deduplicated, [], ranges, schema, data_columns, sample, [deduplicated])

    # -- one instant ---------------------------------------------------------------------------------
    def _write_once(self, prepared: _Prepared, operation: SparkOperation) -> Instant:
        transaction = Transaction.begin(self.table, operation.value, operation.action, self.options)
        release: list[DataFrame] = []
        try:
            if operation.appends:
                metadata = self._append(transaction, prepared, operation)
            else:
                metadata = self._merge(transaction, prepared, operation, release)
            transaction.check_alive()
        except BaseException as exc:
            transaction.abort(exc)
            raise
        finally:
            for frame in release:
                frame.unpersist()
        return transaction.commit(metadata)

    def _sizing(self, view: FileSystemView, prepared: _Prepared, partitions: Sequence[str]) -> SizingPolicy:
        return SizingPolicy(
            max_file_bytes=self.config.get(keys.PARQUET_MAX_FILE_SIZE),
            small_file_bytes=self.config.get(keys.PARQUET_SMALL_FILE_LIMIT),
            record_bytes=estimate_record_bytes(
                view, self.table.storage, cast(pa.Table, _LazySample(prepared.sample)), partitions
            ),
        )

    def _append(
        self, transaction: Transaction, prepared: _Prepared, operation: SparkOperation
    ) -> CommitMetadata:
        partitions = sorted({c.partition for c in prepared.counts})
        fill = operation is SparkOperation.INSERT
        view = (
            FileSystemView.build(self.table, transaction.begin_timeline, partitions=partitions)
            if fill
            else FileSystemView(())
        )
        sizing = self._sizing(view, prepared, partitions)
        plan = plan_append(transaction.instant_time, prepared.counts, view, sizing, fill, self._route_keys)
        transaction.plan(self._metadata(operation, plan.planned_stats(), {}, prepared.schema))
        context = WriteContext(self.spec, transaction.instant_time, plan.buckets, prepared.data_columns)
        data = prepared.data
        out = StructType(
            [StructField(f.name, f.dataType, True) for f in data.schema]
            + [
                StructField(RECORD_KEY, StringType(), True),
                StructField(PARTITION_PATH, StringType(), True),
                StructField(BUCKET, LongType(), True),
                StructField(STAT, StringType(), True),
            ]
        )
        written = data.mapInArrow(WriteInserts(context, plan.segments, plan.local), out)
        if plan.routed:
            written = (
                written.repartition(len(plan.routed), BUCKET)
                .groupBy(BUCKET)
                .applyInArrow(WriteGroup(context).as_function(), f"{STAT} string")
            )
        stats = self._collect_stats(written, plan)
        return self._metadata(operation, stats, {}, prepared.schema)

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
        if operation is SparkOperation.INSERT_OVERWRITE:
            replaced = {p: tuple(g.file_id for g in view.in_partition(p)) for p in partitions}
            replaced = {p: ids for p, ids in replaced.items() if ids}
            view = FileSystemView(())
            tagged = deduplicated.withColumn(FILE_ID, F.lit(None).cast(StringType()))
        else:
            index = self._index(view, {} if lookup_all else prepared.ranges)
            if lookup_all:
                tagged = deduplicated.drop(PARTITION_PATH).join(index, [RECORD_KEY], "inner")
            else:
                tagged = deduplicated.join(index, [RECORD_KEY, PARTITION_PATH], "left")
            if operation is SparkOperation.DELETE:
                tagged = tagged.where(F.col(FILE_ID).isNotNull())
            # the join (and the index read) must run once: counting and routing see the same tasks
            tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
            release.append(tagged)
        found = self._run(
            lambda: (
                tagged.select(PARTITION_PATH, FILE_ID)
                .mapInArrow(CountRows(self.spec, stamp_input=False), COUNT_SCHEMA)
                .collect()
            )
        )
        transaction.check_alive()
        counts = [Count(r.task, r.partition, r.file_id, r.rows) for r in found]
        sizing = self._sizing(view, prepared, partitions)
        merge = True
        plan = plan_merge(transaction.instant_time, counts, view, sizing, merge, self._route_keys)
        schema = (
            prepared.schema if operation is not SparkOperation.DELETE else _latest_schema(table, transaction)
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
            routed_schema = StructType(
                [f for f in tagged.schema if f.name != FILE_ID] + [StructField(BUCKET, LongType(), True)]
            )
            written = (
                tagged.mapInArrow(AssignBuckets(plan.updates, plan.segments), routed_schema)
                .repartition(len(plan.routed), BUCKET)
                .groupBy(BUCKET)
                .applyInArrow(WriteGroup(context).as_function(), f"{STAT} string")
            )
            stats = self._collect_stats(written, plan)
        return self._metadata(operation, stats, replaced, schema)

    # -- helpers -------------------------------------------------------------------------------------
    def _index(self, view: FileSystemView, ranges: dict[str | None, tuple[int, str, str]]) -> DataFrame:
        """(key, partition, file id) of every record in the latest base files of ``view``, on executors."""
        files = tuple(view.latest_base_files())
        self.metrics.index_files = len(files)
        if not files:
            return self.spark.createDataFrame([], INDEX_SCHEMA)
        pruned = self.spark.sparkContext.accumulator(0)
        self._pruned = pruned
        bounds = {p: (low, high) for p, (_, low, high) in ranges.items() if p is not None}
        reader = ReadIndex(StorageSpec.of(self.table.storage), files, bounds, pruned)
        return self.spark.range(0, len(files), 1, numPartitions=min(len(files), 4096)).mapInArrow(
            reader, INDEX_SCHEMA
        )

    def _collect_stats(self, written: DataFrame, plan: SparkPlan) -> list[Any]:
        rows = self._run(lambda: written.select(STAT).where(F.col(STAT).isNotNull()).collect())
        order = {b.write.new_path: b.task for b in plan.buckets.values()}
        stats = sorted((stat_from_json(r[0]) for r in rows), key=lambda s: order.get(s.path, -1))
        self.metrics.file_groups = len(stats)
        self.metrics.routed_file_groups = len(plan.routed)
        pruned = getattr(self, "_pruned", None)
        if pruned is not None:
            self.metrics.index_files_pruned = pruned.value
            self._pruned = None
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

    def _parallelism(self, key: keys.ConfigKey[int]) -> int:
        configured = self.config.get(key)
        if configured > 0:
            return configured
        return int(self.spark.conf.get("spark.sql.shuffle.partitions") or 200)

    def _route_keys(self, count: int) -> list[int]:
        """Longs whose Spark hash partitioning puts the i-th into shuffle partition i of ``count``."""
        candidates = 32 * count
        found: dict[int, int] = {}
        while len(found) < count:
            rows = self._run(
                lambda size=candidates: (  # type: ignore[misc]
                    self.spark.range(0, size)
                    .select(F.col("id"), F.expr(f"pmod(hash(id), {count})").alias("p"))
                    .groupBy("p")
                    .agg(F.min("id").alias("key"))
                    .collect()
                )
            )
            found = {r.p: r.key for r in rows}
            candidates *= 4
        return [found[p] for p in range(count)]

    def _run(self, job: Callable[[], T]) -> T:
        with _translated():
            return job()


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
