"""The append pipeline of the driver (insert, bulk_insert): tasks write their records where they are as new
file groups (:mod:`.append`), an insert fills small file groups first; the driver commits.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StringType, StructField, StructType

import cowrite.spark.options as spark_keys
from cowrite.engine.commit import complete
from cowrite.engine.planning import SizingPolicy, estimate_record_bytes
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY, partition_paths
from cowrite.errors import CommitStateUnknownError, ConfigError
from cowrite.format import config as keys
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Instant
from cowrite.format.timeline import Timeline
from cowrite.protocol.transaction import Transaction
from cowrite.spark.append import (
    FillSmallGroups,
    NewFileGroups,
    SetAside,
    SmallGroups,
    delete_markers,
    delete_unreported,
    distinct_rows,
    record_bytes_of,
    small_file_groups,
)
from cowrite.spark.driver import Driver
from cowrite.spark.executor import STAT, stat_from_json
from cowrite.spark.frames import discard_marked
from cowrite.spark.operations import SparkOperation

SORT_MODES = ("GLOBAL_SORT", "PARTITION_SORT", "NONE")


class AppendPipeline(Driver):
    """Inserts and bulk_inserts of a :class:`~.engine.SparkWriter`."""

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
            transaction.share_lease()  # the tasks check it
            # no file is known before the tasks write: the plan names none, the markers name them all
            transaction.plan(self._metadata(operation, (), {}, schema))
            small, record_bytes = self._small_file_groups(data, operation, transaction.begin_timeline)
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
            discard_marked(table, instant, stats)
            raise
        self.metrics.input_rows = sum(s.num_inserts for s in stats)
        self.metrics.file_groups = len(stats)
        self.metrics.routed_file_groups = sum(1 for s in stats if s.prev_commit != "null")
        try:
            done = complete(transaction, self._metadata(operation, stats, {}, schema))
        except CommitStateUnknownError:
            raise  # the files may be committed: only a look at the timeline can tell
        except BaseException:
            discard_marked(table, instant, stats)
            raise
        delete_markers(table.storage, instant)
        return done

    def _small_file_groups(
        self, data: DataFrame, operation: SparkOperation, timeline: Timeline
    ) -> tuple[SmallGroups, float | None]:
        """The small file groups an append fills (partition -> (base file, room)), and the bytes per
        record of the table's files (None for a table without any).

        A bulk_insert fills none. An insert into a table with files looks in the partitions its input
        touches, and only there: a job over the input's partition columns finds them (Spark reads no
        other column of a columnar source), where a listing of every partition of the table costs a
        request per thousand files on an object store.
        """
        table = self.table
        small_file_bytes = self.config.get(keys.PARQUET_SMALL_FILE_LIMIT)
        if operation is SparkOperation.BULK_INSERT or small_file_bytes <= 0:
            return {}, record_bytes_of(table, timeline)
        if not timeline.data_commits():
            return {}, None
        view = FileSystemView.build(table, timeline, partitions=self._partitions_of(data), for_write=True)
        if not view.groups:
            return {}, record_bytes_of(table, timeline)
        record_bytes = estimate_record_bytes(view, table.storage, pa.table({}), sorted(view.partitions))
        sizing = SizingPolicy(self.config.get(keys.PARQUET_MAX_FILE_SIZE), small_file_bytes, record_bytes)
        return small_file_groups(view, sizing), record_bytes

    def _partitions_of(self, data: DataFrame) -> list[str]:
        """The partition paths of the input's records (its bad partition values fail here, first)."""
        fields = self.table.partition_fields
        if not fields:
            return [""]
        columns = data.select(*fields)
        values = self._run("partitions", lambda: columns.mapInArrow(distinct_rows, columns.schema).toArrow())
        paths = partition_paths(values, fields, self.table.hive_style_partitioning, self.spec.source)
        return sorted(set(paths.to_pylist()))

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
        mode = self.config.get(spark_keys.BULKINSERT_SORT_MODE).upper()
        if mode not in SORT_MODES:
            choices = ", ".join(SORT_MODES)
            raise ConfigError(f"{spark_keys.BULKINSERT_SORT_MODE.key}={mode}: use one of {choices}")
        data = df
        if mode == "GLOBAL_SORT":
            parallelism = self._parallelism(spark_keys.BULKINSERT_SHUFFLE_PARALLELISM)
            data = data.repartitionByRange(parallelism, *table.partition_fields, *table.record_key_fields)
        if mode == "NONE":
            return data, False
        return data.sortWithinPartitions(*table.partition_fields, *table.record_key_fields), True
