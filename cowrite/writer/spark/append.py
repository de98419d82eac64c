"""Appends written where the records are: new file groups named by markers, reconciled at commit.

Shared by the data source (:mod:`.datasource`) and ``SparkWriter``'s insert and bulk_insert
(:mod:`.engine`). No driver plans the files of such a write: each task writes its own records as new file
groups of the target size, and creates a marker (:mod:`cowrite.timeline.markers`) before each base file.
So the driver needs no pass over the input before the write, and a failure is cleaned up from the
markers:

- commit: the driver deletes the marked files no task reported (those of failed task attempts, which
  Spark ran again) before it publishes, and the markers after (:func:`delete_unreported`,
  :func:`delete_markers`);
- abort: every marked file goes (:func:`discard`); a crash leaves them to the lazy rollback, which
  reads the markers too.

New file groups touch no file group of another writer, so such a write conflicts with nobody over file
groups. What it cannot do is fill the small file groups of a partition: those records must be merged
with the group's base file in one place (``SparkWriter`` plans such inserts instead).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from ...timeline.commit_metadata import WriteStat
from ...timeline.errors import CowriteError
from ...timeline.fs_view import BASE_FILE_EXTENSION, FileSystemView
from ...timeline.markers import create_marker, delete_markers, marked_files
from ...timeline.storage import Storage
from ...timeline.table import Table
from ...timeline.timeline import Timeline
from ..file_group import FileGroupWrite, write_file_group
from ..planning import SizingPolicy, estimate_record_bytes, new_file_id
from ..records import PARTITION_PATH, RECORD_KEY
from .tasks import STAT, TableSpec, check_lease, chunks, renew_lease, rows_by, stamp, stat_to_json

__all__ = ["NewFileGroups", "delete_markers", "delete_unreported", "discard", "record_bytes_of"]


def record_bytes_of(table: Table, timeline: Timeline) -> float | None:
    """Bytes per record in a base file of the newest files (the latest commit's stats); None without any."""
    for instant in reversed(timeline.data_commits().in_completion_order()):
        stats = [s for s in table.commit_metadata(instant).write_stats if s.num_writes]
        if stats:
            return sum(s.file_size for s in stats) / sum(s.num_writes for s in stats)
    return None


@dataclass(frozen=True)
class NewFileGroups:
    """A task's records as new file groups of the target size, a marker created before each base file.

    Records are taken in the order the task sees them; a partition's file is written once it holds the
    target number of records, and each partition's remainder at the end (or, for input sorted by
    partition, once the next partition began): a task holds at most one unfinished file per partition.
    ``renew``: the task renews the heartbeat itself (the data source, whose driver process does not
    last); otherwise the driver renews it and the task only checks it before each file.
    """

    spec: TableSpec
    instant: str
    owner: str
    data_columns: tuple[str, ...]  # the input's columns in order: base files keep it
    max_file_bytes: int
    record_bytes: float | None  # None: estimated from the task's first rows (a table without files)
    renew: bool = False
    sorted_by_partition: bool = False

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``: one ``STAT`` row per written base file, as soon as it is written."""
        task, token = task_and_token()
        for stat in self.write(batches, task, token):
            yield pa.RecordBatch.from_pydict({STAT: [stat_to_json(stat)]}, schema=STAT_SCHEMA)

    def write(self, batches: Iterable[pa.RecordBatch], task: int, token: str) -> Iterator[WriteStat]:
        """Write the records of ``batches``; raises the input errors of :func:`.tasks.stamp`."""
        storage = self.spec.storage.open()
        self._lease(storage)
        per_file: int | None = None
        pending: dict[str, pa.Table] = {}
        for chunk in chunks(batches):
            table = stamp(chunk, self.spec)
            if per_file is None:
                record_bytes = self.record_bytes or estimate_record_bytes(
                    FileSystemView(()), storage, table, []
                )
                per_file = SizingPolicy(self.max_file_bytes, 0, record_bytes).records_per_file
            for partition, rows in rows_by(table, PARTITION_PATH):
                held = pending.pop(partition, None)
                buffered = pa.concat_tables([held, rows]) if held is not None else rows
                while buffered.num_rows >= per_file:
                    yield self._flush(storage, partition, buffered.slice(0, per_file), task, token)
                    buffered = buffered.slice(per_file)
                if buffered.num_rows:
                    pending[partition] = buffered
            if self.sorted_by_partition and table.num_rows:
                current = table.column(PARTITION_PATH)[-1].as_py()
                for partition in sorted(p for p in pending if p != current):
                    yield self._flush(storage, partition, pending.pop(partition), task, token)
        for partition, rows in sorted(pending.items()):
            yield self._flush(storage, partition, rows, task, token)

    def _flush(self, storage: Storage, partition: str, rows: pa.Table, task: int, token: str) -> WriteStat:
        work = FileGroupWrite.create(partition, new_file_id(), self.instant, token, None, merge=False)
        self._lease(storage)
        create_marker(storage, self.instant, work.new_path)  # before the file: a crash leaves both
        return write_file_group(
            storage,
            work,
            self.instant,
            rows.select([*self.data_columns, RECORD_KEY, PARTITION_PATH]),
            ordering=self.spec.ordering_fields,
            compression=self.spec.compression,
            task=task,
        )

    def _lease(self, storage: Storage) -> None:
        if self.renew:
            renew_lease(storage, self.instant, self.spec.heartbeat, self.owner)
        else:
            check_lease(storage, self.instant, self.spec.heartbeat)


STAT_SCHEMA = pa.schema([pa.field(STAT, pa.string())])


def task_and_token() -> tuple[int, str]:
    """This Spark task's partition and Hudi's write token, ``<partition>-<stage>-<attempt>``: every
    attempt of a task names its files apart, so a failed attempt's files are told from the reported ones.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # called outside Spark (tests run a task's work in-process)
        return 0, "0-0-0"
    return context.partitionId(), f"{context.partitionId()}-{context.stageId()}-{context.attemptNumber()}"


def delete_unreported(storage: Storage, instant: str, reported: Iterable[WriteStat]) -> list[str]:
    """Delete the marked files of ``instant`` that no stat reports: those of failed task attempts.

    Returns the deleted paths. A reported file without a marker means the write is not what its
    markers say (a task wrote outside this protocol): nothing may be committed then.
    """
    paths = {s.path for s in reported}
    marked = marked_files(storage, instant)
    unmarked = sorted(paths - set(marked))
    if unmarked:
        raise CowriteError(
            f"instant {instant} reports base files without markers ({', '.join(unmarked[:3])}); "
            "nothing was committed"
        )
    doomed = [path for path in marked if path not in paths]
    for path in doomed:
        storage.delete(path)
    return doomed


def discard(storage: Storage, instant: str, reported: Iterable[WriteStat] = ()) -> None:
    """Delete every base file of ``instant`` that its markers or ``reported`` name, then the markers."""
    own = f"_{instant}{BASE_FILE_EXTENSION}"
    doomed = set(marked_files(storage, instant)) | {s.path for s in reported if s.path.endswith(own)}
    for path in sorted(doomed):
        storage.delete(path)
    delete_markers(storage, instant)
