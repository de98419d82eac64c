"""The merge pipeline of the driver (upsert, delete, insert_overwrite): deduplicate narrow rows, tag them
with their file groups, plan, route and write the whole rows once; see :mod:`.engine` for its jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from cowrite.engine.commit import write_instant
from cowrite.engine.contract import latest_schema
from cowrite.engine.planning import FILE_ID, SizingPolicy, estimate_record_bytes
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.errors import CowriteError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Instant
from cowrite.protocol.conflict import with_inserted_keys
from cowrite.protocol.transaction import Transaction
from cowrite.spark import options as spark_keys
from cowrite.spark.batching import ARROW_BYTES_PER_PARQUET_BYTE, size_in_bytes
from cowrite.spark.dedup import Count, Deduplicate, KeyRange, deduplicate, key_ranges
from cowrite.spark.driver import Driver
from cowrite.spark.executor import (
    BUCKET,
    POSITION,
    STAT,
    TASK,
    StorageSpec,
    from_ipc,
    stamp,
    stat_from_json,
    to_ipc,
)
from cowrite.spark.frames import LazySample, carried, is_persisted, row_count, with_task
from cowrite.spark.operations import SparkOperation
from cowrite.spark.plan import SparkPlan, plan_merge
from cowrite.spark.routing import AssignBuckets, AttachRoutes
from cowrite.spark.tagging import TagRows
from cowrite.spark.writing import WriteContext, WriteGroup

# Reading the keys of this many bytes of base files once more costs about what a range shuffle of the
# deduplicated rows costs in its extra job and pass (measured with bench/spark_write.py)
IN_PLACE_INDEX_BYTES = 128 << 20


@dataclass
class Prepared:
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


class MergePipeline(Driver):
    """Upserts, deletes and insert_overwrites of a :class:`~.engine.SparkWriter`."""

    def _prepare_merge(
        self, df: DataFrame, operation: SparkOperation, schema: str, data_columns: tuple[str, ...]
    ) -> Prepared:
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
        if not is_persisted(df):  # the position must name the same row in both evaluations
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
        known = row_count(df)
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
            found = [KeyRange.from_json(t) for t in self._run("deduplicate", lambda: carried(deduplicated))]
        ranges: dict[str | None, tuple[int, str, str]] = {}
        for r in found:
            rows, low, high = ranges.get(r.partition, (0, r.low, r.high))
            ranges[r.partition] = (rows + r.rows, min(low, r.low), max(high, r.high))
        counts = [Count(r.task, r.partition, None, r.rows) for r in found if r.partition is not None]
        self.metrics.input_rows = sum(rows for rows, _, _ in ranges.values())

        def sample() -> pa.Table:
            return stamp(self._run("sample", lambda: df.limit(1000).toArrow()), self.spec, with_paths)

        data = deduplicated.where(F.col(STAT).isNull()).drop(STAT)
        return Prepared(data, counts, ranges, schema, data_columns, sample, release, keyed, tasks, local)

    def _write_once(self, prepared: Prepared, operation: SparkOperation) -> Instant:
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

    def _sizing(self, view: FileSystemView, prepared: Prepared, partitions: Sequence[str]) -> SizingPolicy:
        """File sizes of the plan; the whole rows that follow go to Python in batches fitted to them."""
        sizing = SizingPolicy(
            max_file_bytes=self.config.get(keys.PARQUET_MAX_FILE_SIZE),
            small_file_bytes=self.config.get(keys.PARQUET_SMALL_FILE_LIMIT),
            record_bytes=estimate_record_bytes(
                view, self.table.storage, cast(pa.Table, LazySample(prepared.sample)), partitions
            ),
        )
        self._batches.fit(sizing.record_bytes * ARROW_BYTES_PER_PARQUET_BYTE)
        return sizing

    def _merge(
        self,
        transaction: Transaction,
        prepared: Prepared,
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
                on_driver = self._run("collect keys", lambda: with_task(tagged).toArrow())
        elif prepared.local is not None:
            keep_new = operation is not SparkOperation.DELETE
            counts, on_driver = self._tag_here(prepared.local, view, len(partitions), lookup_all, keep_new)
        else:
            keep_new = operation is not SparkOperation.DELETE
            tagged = self._tag(deduplicated, prepared.tasks, view, len(partitions), lookup_all, keep_new)
            if local:
                found = self._run("tag", lambda: with_task(tagged).toArrow())
                reported = pc.is_valid(found.column(STAT))
                counts = [Count.from_json(text) for text in found.column(STAT).filter(reported).to_pylist()]
                on_driver = found.filter(pc.invert(reported)).drop_columns([STAT])
            else:
                # tagging (and its index reads) runs once: counting and routing see the same tasks
                tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
                release.append(tagged)
                counts = [
                    Count.from_json(text) for text in self._run("tag and count", lambda: carried(tagged))
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
            reported = pc.is_valid(table.column(STAT))
            counts.extend(Count.from_json(text) for text in table.column(STAT).filter(reported).to_pylist())
            rows_of_task = table.filter(pc.invert(reported)).drop_columns([STAT])
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

    def _by_key(self, frame: DataFrame, tasks: int) -> DataFrame:
        """Rows of one record key in one of ``tasks`` tasks (see :meth:`_key_tasks`)."""
        return frame.repartition(tasks, *self.table.record_key_fields)

    def _key_tasks(self, df: DataFrame) -> int:
        """Tasks that deduplicate: as many as configured, else as the input has.

        (Adaptive execution cannot merge small shuffle partitions of a persisted plan, and every Python
        task has a fixed cost: the input's own partitioning is the best guess of its size.)
        """
        configured = self.config.get(spark_keys.UPSERT_SHUFFLE_PARALLELISM)
        return configured if configured > 0 else max(1, df.rdd.getNumPartitions())  # an empty input has none

    def _broadcastable(self, rows: int) -> bool:
        """Whether Spark would broadcast ``rows`` narrow rows (position, key, path, route) in a join.

        Such rows pass through the driver anyway, so they are routed there. (Spark cannot know the
        size of a Python function's output: it is told, as narrow rows are a few dozen bytes.)
        """
        threshold = self.spark.conf.get("spark.sql.autoBroadcastJoinThreshold") or "10m"
        limit = size_in_bytes(threshold, 10 << 20)
        return 0 <= rows * 64 <= limit
