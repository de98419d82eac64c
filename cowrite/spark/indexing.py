"""The index lookup of a merge, as the driver runs it: which Spark tasks give each deduplicated row the
file group that holds its key (:class:`~.tagging.TagRows`), and what they report.

Tagging tasks read the index themselves — the keys of the latest base files of their partitions, footers
outside their key range skipped — so no index row is shuffled. The driver decides where they run: where
deduplication left the rows, after a range shuffle by (partition, key), or over ranges of rows the driver
holds (:meth:`IndexLookup._tag_here`). Each task reports its rows per (partition, file group) as
``STAT`` rows (:class:`~.dedup.Count`), from which the driver plans (:mod:`.plan`). A base file a task
cannot read fails the job, and the write with it (as a cowrite error, :func:`.errors.translate`) before
anything is planned or written.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.types import StringType, StructField, StructType

from cowrite.engine.planning import FILE_ID
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.format.fs_view import FileSystemView
from cowrite.spark.dedup import Count
from cowrite.spark.driver import Driver
from cowrite.spark.executor import STAT, TASK, StorageSpec, from_ipc, to_ipc
from cowrite.spark.tagging import TagRows

# Reading the keys of this many bytes of base files once more costs about what a range shuffle of the
# deduplicated rows costs in its extra job and pass (measured with bench/spark_write.py)
IN_PLACE_INDEX_BYTES = 128 << 20


class IndexLookup(Driver):
    """The tagging step of :class:`~.merging.MergePipeline`; index metrics go to ``self.metrics``."""

    def _tag(
        self,
        deduplicated: DataFrame,
        held: int,
        view: FileSystemView,
        partitions: int,
        by_key_only: bool,
        keep_new: bool,
    ) -> DataFrame:
        """``deduplicated`` with ``FILE_ID`` and count rows, tagged on executors (:class:`~.tagging.TagRows`).

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
