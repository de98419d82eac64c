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

import cowrite.spark.options as spark_keys
from cowrite.engine.commit import write_instant
from cowrite.engine.planning import FILE_ID, SizingPolicy, estimate_record_bytes
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.errors import CowriteError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Instant
from cowrite.protocol.conflict import with_inserted_keys
from cowrite.protocol.table_schema import latest_schema
from cowrite.protocol.transaction import Transaction
from cowrite.spark.batching import ARROW_BYTES_PER_PARQUET_BYTE, size_in_bytes
from cowrite.spark.dedup import Count, Deduplicate, KeyRange, deduplicate, key_ranges
from cowrite.spark.executor import BUCKET, POSITION, STAT, TASK, stamp, stat_from_json
from cowrite.spark.frames import LazySample, carried, is_persisted, row_count, with_task
from cowrite.spark.indexing import IndexLookup
from cowrite.spark.operations import SparkOperation
from cowrite.spark.plan import SparkPlan, plan_merge
from cowrite.spark.routing import AssignBuckets, AttachRoutes
from cowrite.spark.writing import WriteContext, WriteGroup


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


@dataclass
class Tagged:
    """Deduplicated rows with the file group of their key (``FILE_ID``, null for a new key): what the
    plan and the routing of one attempt need. The rows are on the driver (``rows``, with ``TASK``) when
    they are routed there, else on the executors (``frame``)."""

    counts: list[Count]  # rows per task, partition and file group
    view: FileSystemView  # the file groups the plan may write into (none for insert_overwrite)
    replaced: dict[str, tuple[str, ...]] = field(default_factory=dict)  # insert_overwrite: partition -> ids
    frame: DataFrame | None = None
    rows: pa.Table | None = None


class MergePipeline(IndexLookup):
    """Upserts, deletes and insert_overwrites of a :class:`~.engine.SparkWriter`."""

    def _prepare_merge(
        self, df: DataFrame, operation: SparkOperation, schema: str, data_columns: tuple[str, ...]
    ) -> Prepared:
        """Deduplicate the *narrow* rows: position, key, partition and ordering columns only.

        Moving a row between the JVM and Python costs a good share of writing it, so the steps that
        only decide (deduplicate, tag, route) see narrow rows; the whole rows of the winners meet their
        routes by position and go to Python once, to be written. Raises the input's errors (null keys,
        bad partition values, from the deduplicating tasks) before any transaction begins.
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
            local, found = self._deduplicate_here(narrow, ordering, with_paths)
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

    def _deduplicate_here(
        self, narrow: DataFrame, ordering: tuple[str, ...], with_paths: bool
    ) -> tuple[pa.Table, list[KeyRange]]:
        """The deduplicated rows (with ``TASK``) and key ranges of an input Spark would broadcast.

        Its narrow rows come to the driver — one job of the JVM alone, no shuffle, no Python task —
        which deduplicates them and hands them to the tagging tasks itself (see :meth:`_tag_here`)
        instead of persisting them.
        """
        collected = self._run("collect keys", narrow.toArrow)
        # nullable, as the rows of Python tasks are: routed rows of both kinds are concatenated
        collected = collected.cast(pa.schema([f.with_nullable(True) for f in collected.schema]))
        winners = deduplicate(collected, self.spec, ordering, with_paths)
        local = winners.select([POSITION, RECORD_KEY, PARTITION_PATH]).append_column(
            TASK, pa.repeat(pa.scalar(0, pa.int32()), winners.num_rows)
        )
        self.metrics.deduplicated_on_driver = True
        return local, key_ranges(winners, 0)

    def _write_once(self, prepared: Prepared, operation: SparkOperation) -> Instant:
        def write(transaction: Transaction) -> CommitMetadata:
            transaction.share_lease()  # the tasks check it
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
        """One attempt of a merge inside ``transaction``: tag, plan (``.inflight``), route and write.

        Returns the metadata to commit; commits nothing. Frames it persists are added to ``release``
        for the caller to unpersist. Raises :class:`~.errors.NondeterministicInputError` when a task sees
        other counts than planned, :class:`CowriteError` when the base files written are not the planned
        ones, and the lease's errors when the write is no longer alive.
        """
        partitions = sorted(p for p in prepared.ranges if p is not None)
        lookup_all = None in prepared.ranges  # deletes without partition columns: every partition
        view = FileSystemView.build(
            self.table,
            transaction.begin_timeline,
            partitions=None if lookup_all else partitions,
            for_write=True,
        )
        tagged = self._tag_rows(prepared, operation, view, partitions, lookup_all, release)
        self._index_metrics()
        transaction.check_alive()
        sizing = self._sizing(tagged.view, prepared, partitions)
        plan = plan_merge(
            transaction.instant_time,
            tagged.counts,
            tagged.view,
            sizing,
            merge=True,
            max_tasks=self._write_tasks(),
        )
        schema = (
            prepared.schema
            if operation is not SparkOperation.DELETE
            else latest_schema(self.table, transaction.begin_timeline)
        )
        transaction.plan(self._metadata(operation, plan.planned_stats(), tagged.replaced, schema))
        stats = self._write_routed(transaction, prepared, operation, plan, tagged) if plan.routed else []
        return self._metadata(operation, stats, tagged.replaced, schema)

    def _tag_rows(
        self,
        prepared: Prepared,
        operation: SparkOperation,
        view: FileSystemView,
        partitions: list[str],
        lookup_all: bool,
        release: list[DataFrame],
    ) -> Tagged:
        """The deduplicated rows with the file group of their key, and the counts the plan needs.

        Rows as few as Spark would broadcast to join them with the whole rows are routed on the
        driver: they pass through it anyway, and routing them there spares a pass of Python tasks and a
        job. More stay on the executors.
        """
        on_driver = self.metrics.routed_on_driver = self._broadcastable(self.metrics.input_rows)
        if operation is SparkOperation.INSERT_OVERWRITE:
            return self._overwrite_rows(prepared, view, partitions, on_driver)
        keep_new = operation is not SparkOperation.DELETE
        if prepared.local is not None:
            counts, rows = self._tag_here(prepared.local, view, len(partitions), lookup_all, keep_new)
            return Tagged(counts, view, rows=rows)
        tagged = self._tag(prepared.data, prepared.tasks, view, len(partitions), lookup_all, keep_new)
        if on_driver:
            found = self._run("tag", lambda: with_task(tagged).toArrow())
            reported = pc.is_valid(found.column(STAT))
            counts = [Count.from_json(text) for text in found.column(STAT).filter(reported).to_pylist()]
            return Tagged(counts, view, rows=found.filter(pc.invert(reported)).drop_columns([STAT]))
        # tagging (and its index reads) runs once: counting and routing see the same tasks
        tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
        release.append(tagged)
        counts = [Count.from_json(text) for text in self._run("tag and count", lambda: carried(tagged))]
        return Tagged(counts, view, frame=tagged.where(F.col(STAT).isNull()).drop(STAT))

    def _overwrite_rows(
        self, prepared: Prepared, view: FileSystemView, partitions: list[str], on_driver: bool
    ) -> Tagged:
        """insert_overwrite: no index is read — every row is new, counted by the tasks that deduplicated
        it — and the file groups of the partitions it writes are replaced."""
        replaced = {p: tuple(g.file_id for g in view.in_partition(p)) for p in partitions}
        replaced = {p: ids for p, ids in replaced.items() if ids}
        frame = prepared.data.withColumn(FILE_ID, F.lit(None).cast(StringType()))
        rows: pa.Table | None = None
        if prepared.local is not None:
            rows = prepared.local.append_column(FILE_ID, pa.nulls(prepared.local.num_rows, pa.string()))
        elif on_driver:
            rows = self._run("collect keys", lambda: with_task(frame).toArrow())
        return Tagged(prepared.counts, FileSystemView(()), replaced, frame, rows)

    def _write_routed(
        self,
        transaction: Transaction,
        prepared: Prepared,
        operation: SparkOperation,
        plan: SparkPlan,
        tagged: Tagged,
    ) -> list[Any]:
        """The whole rows routed to the planned file groups, a few file groups per write task; the
        write stats of the base files written (see :meth:`_collect_stats`)."""
        context = WriteContext(
            self.spec,
            transaction.instant_time,
            plan.buckets,
            prepared.data_columns,
            delete=operation is SparkOperation.DELETE,
        )
        written = (
            self._route(prepared, operation, plan, tagged)
            .repartition(plan.write_tasks, BUCKET)
            .groupBy(BUCKET)
            .applyInArrow(WriteGroup(context).as_function(), f"{STAT} string")
        )
        return self._collect_stats(written, plan)

    def _route(
        self, prepared: Prepared, operation: SparkOperation, plan: SparkPlan, tagged: Tagged
    ) -> DataFrame:
        """The rows to write, each with the ``BUCKET`` of its planned file group: the whole rows (a delete
        routed on the executors keeps the keys alone, without the join)."""
        assign = AssignBuckets(plan.updates, plan.segments)
        assert prepared.rows is not None
        whole = prepared.rows.drop(*[c for c in (RECORD_KEY, PARTITION_PATH) if c in prepared.rows.columns])
        if tagged.rows is not None:
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
            routes = AttachRoutes.of(assign.route_tasks(tagged.rows), tuple(out.fieldNames()))
            return whole.mapInArrow(routes, out)
        assert tagged.frame is not None
        routed_schema = StructType(
            [f for f in tagged.frame.schema if f.name not in (FILE_ID, STAT)]
            + [StructField(BUCKET, LongType(), True)]
        )
        routed = tagged.frame.mapInArrow(assign, routed_schema)
        if operation is SparkOperation.DELETE:  # a delete needs the keys only
            return routed
        return whole.join(routed, POSITION)

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
