"""Appends written where the records are: new file groups named by markers, reconciled at commit.

Shared by the data source (:mod:`.datasource`) and ``SparkWriter``'s insert and bulk_insert
(:mod:`.engine`). No driver plans the files of such a write: each task writes its own records as new file
groups of the target size, and creates a marker (:mod:`cowrite.format.markers`) before each base file.
So the driver needs no pass over the input before the write, and a failure is cleaned up from the
markers:

- commit: the driver deletes the marked files no task reported (those of failed task attempts, which
  Spark ran again) before it publishes, and the markers after (:func:`delete_unreported`,
  :func:`delete_markers`);
- abort: every marked file goes (:func:`discard`); a crash leaves them to the lazy rollback, which
  reads the markers too.

New file groups touch no file group of another writer, so such a write conflicts with nobody over file
groups. Filling the small file groups of a partition needs its records in one place, merged with the
group's base file: ``SparkWriter``'s inserts set those records aside in the same job
(:class:`SetAside`) and fill the groups after a shuffle by partition (:class:`FillSmallGroups`); the
files they write are marked all the same, and the commit's stats name the file groups they touched, for
the conflict check. The data source cannot shuffle, and fills none.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.contract import conform
from cowrite.engine.file_group import FileGroupWrite, write_file_group
from cowrite.engine.planning import SizingPolicy, estimate_record_bytes, new_file_id
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.errors import CowriteError
from cowrite.format.commit_metadata import WriteStat
from cowrite.format.fs_view import BASE_FILE_EXTENSION, BaseFile, FileSystemView
from cowrite.format.markers import create_marker, delete_markers, marked_files
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.spark.executor import (
    STAT,
    TableSpec,
    carrying,
    check_lease,
    chunks,
    renew_lease,
    rows_by,
    stamp,
    stat_to_json,
)
from cowrite.storage.backend import Storage

__all__ = [
    "FillSmallGroups",
    "NewFileGroups",
    "SetAside",
    "SmallGroups",
    "delete_markers",
    "delete_unreported",
    "discard",
    "record_bytes_of",
    "small_file_groups",
]


def record_bytes_of(table: Table, timeline: Timeline) -> float | None:
    """Bytes per record in a base file of the newest files (the latest commit's stats); None without any."""
    for instant in reversed(timeline.data_commits().in_completion_order()):
        stats = [s for s in table.commit_metadata(instant).write_stats if s.num_writes]
        if stats:
            return sum(s.file_size for s in stats) / sum(s.num_writes for s in stats)
    return None


def distinct_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function: the distinct rows of a task's input (of a few columns: the partition
    fields, to learn which partitions an insert touches in one job without a shuffle)."""
    found = [b for b in batches if b.num_rows]
    if found:
        data = pa.Table.from_batches(found)
        yield from data.group_by(data.column_names, use_threads=False).aggregate([]).to_batches()


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
        """Write the records of ``batches``; raises the input errors of :func:`.executor.stamp`."""
        for written in self.write_or_set_aside(batches, task, token, {}):
            assert isinstance(written, WriteStat)
            yield written

    def write_or_set_aside(
        self, batches: Iterable[pa.RecordBatch], task: int, token: str, room: Mapping[str, int]
    ) -> Iterator[WriteStat | pa.Table]:
        """:meth:`write`, except that the first ``room[p]`` records of each partition ``p`` are not
        written but returned, stamped (as tables), for the small file groups of ``p`` to take."""
        storage = self.spec.storage.open()
        self._lease(storage)
        per_file: int | None = None
        pending: dict[str, pa.Table] = {}
        kept: Counter[str] = Counter()
        for chunk in chunks(batches):
            table = stamp(chunk, self.spec)
            if per_file is None:
                record_bytes = self.record_bytes or estimate_record_bytes(
                    FileSystemView(()), storage, table, []
                )
                per_file = SizingPolicy(self.max_file_bytes, 0, record_bytes).records_per_file
            for partition, rows in rows_by(table, PARTITION_PATH):
                keep = min(room.get(partition, 0) - kept[partition], rows.num_rows)
                if keep > 0:
                    kept[partition] += keep
                    yield rows.slice(0, keep)
                    rows = rows.slice(keep)
                    if not rows.num_rows:
                        continue
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
        return self._write(storage, work, rows, task)

    def _write(self, storage: Storage, work: FileGroupWrite, rows: pa.Table, task: int) -> WriteStat:
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


@dataclass(frozen=True)
class SetAside:
    """``mapInArrow``, the first stage of an insert into partitions with small file groups: a task writes
    its records as :class:`NewFileGroups` do, except the first records of each such partition — as many
    as its small file groups have room for — which leave as rows for :class:`FillSmallGroups`.

    Output: the set-aside rows (the input's columns, key and partition path; ``STAT`` null), and a
    ``STAT`` row (every other column null) per written base file. Its Arrow types are those of the
    input batches (Spark's choice, string or large string): Spark takes back what it handed out.
    """

    files: NewFileGroups
    room: Mapping[str, int]  # partition path -> records its small file groups take

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task, token = task_and_token()
        first = next(batches, None)
        if first is None:
            return
        stamped = stamp(pa.Table.from_batches([first]).slice(0, 0), self.files.spec)
        schema = stamped.schema.append(pa.field(STAT, pa.string()))
        everything = itertools.chain([first], batches)
        for written in self.files.write_or_set_aside(everything, task, token, self.room):
            if isinstance(written, WriteStat):
                yield carrying(schema, [stat_to_json(written)])
            else:
                rows = written.append_column(STAT, pa.nulls(written.num_rows, pa.string()))
                yield from rows.select(schema.names).cast(schema).to_batches()


@dataclass(frozen=True)
class FillSmallGroups:
    """``mapInArrow``, the second stage: the set-aside rows of whole partitions, sorted by partition,
    fill the partition's small file groups in order, each up to its room (merged with its base file, as
    ``assign_inserts`` decides for the local engine); the rest become new file groups. ``STAT`` rows of
    the first stage pass through.

    Every task set aside as many records of a partition as the small file groups take (or all it had),
    so together they set aside at least what ``assign_inserts`` would put there: the small file groups are
    filled exactly as if the rows had been counted first. What the tasks set aside beyond that is
    written as new file groups here, a few more than a counted plan would open.
    """

    files: NewFileGroups  # writes the rest (sorted_by_partition) and names the instant
    small: Mapping[str, tuple[tuple[BaseFile, int], ...]]  # partition -> (base file, room) in order

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task, token = task_and_token()
        storage = self.files.spec.storage.open()
        filler = _Filler(self, storage, task, token)
        for chunk in chunks(batches):
            carried = pc.is_valid(chunk.column(STAT))
            reported = chunk.column(STAT).filter(carried)
            if len(reported):
                yield pa.RecordBatch.from_arrays([reported.combine_chunks()], schema=STAT_SCHEMA)
            rows = chunk.filter(pc.invert(carried)).drop_columns([STAT])
            for partition, part in rows_by(rows, PARTITION_PATH):
                for stat in filler.take(partition, part):
                    yield pa.RecordBatch.from_pydict({STAT: [stat_to_json(stat)]}, schema=STAT_SCHEMA)
        for stat in filler.finish():
            yield pa.RecordBatch.from_pydict({STAT: [stat_to_json(stat)]}, schema=STAT_SCHEMA)


class _Filler:
    """The state of :class:`FillSmallGroups` in one task: the partition at hand, its small file groups
    left to fill, the rows gathered for the first of them, and the rest waiting to be written."""

    def __init__(self, fill: FillSmallGroups, storage: Storage, task: int, token: str) -> None:
        self.fill, self.storage, self.task, self.token = fill, storage, task, token
        files = fill.files
        assert files.record_bytes is not None  # a table with small file groups has files to size by
        self.per_file = SizingPolicy(files.max_file_bytes, 0, files.record_bytes).records_per_file
        self.partition: str | None = None
        self.groups: list[tuple[BaseFile, int]] = []
        self.gathered: list[pa.Table] = []
        self.rest: pa.Table | None = None

    def take(self, partition: str, rows: pa.Table) -> Iterator[WriteStat]:
        if partition != self.partition:
            yield from self.finish()
            self.partition, self.groups = partition, list(self.fill.small.get(partition, ()))
        while rows.num_rows and self.groups:
            base, room = self.groups[0]
            need = room - sum(t.num_rows for t in self.gathered)
            self.gathered.append(rows.slice(0, need))
            rows = rows.slice(need)
            if sum(t.num_rows for t in self.gathered) == room:
                yield self._merge()
        if rows.num_rows:
            self.rest = pa.concat_tables([self.rest, rows]) if self.rest is not None else rows
            while self.rest.num_rows >= self.per_file:
                yield self.fill.files._flush(
                    self.storage, partition, self.rest.slice(0, self.per_file), self.task, self.token
                )
                self.rest = self.rest.slice(self.per_file)

    def finish(self) -> Iterator[WriteStat]:
        """The partition at hand is complete: its last small file group and its rest are written."""
        if self.gathered:
            yield self._merge()
        if self.partition is not None and self.rest is not None and self.rest.num_rows:
            yield self.fill.files._flush(self.storage, self.partition, self.rest, self.task, self.token)
        self.partition, self.groups, self.rest = None, [], None

    def _merge(self) -> WriteStat:
        base, _ = self.groups.pop(0)
        rows, self.gathered = pa.concat_tables(self.gathered), []
        files = self.fill.files
        work = FileGroupWrite.create(
            base.partition, base.file_id, files.instant, self.token, base, merge=False
        )
        return files._write(self.storage, work, rows, self.task)


def write_new_file_groups(
    spec: TableSpec,
    instant: str,
    owner: str,
    target: pa.Schema,
    max_file_bytes: int,
    record_bytes: float | None,
    batches: Iterable[pa.RecordBatch],
    renew: bool = True,
) -> list[WriteStat]:
    """A data source task's rows, conformed to ``target`` (the table's schema, see ..contract), written as
    new file groups of ``instant`` (:class:`NewFileGroups`, ``renew`` as there); raises what it raises."""
    writer = NewFileGroups(spec, instant, owner, tuple(target.names), max_file_bytes, record_bytes, renew)
    task, token = task_and_token()
    conformed = (b for batch in batches for b in conform(pa.table(batch), target).to_batches())
    return list(writer.write(conformed, task, token))


def task_and_token() -> tuple[int, str]:
    """This Spark task's partition and Hudi's write token, ``<partition>-<stage>-<attempt>``: every
    attempt of a task names its files apart, so a failed attempt's files are told from the reported ones.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # called outside Spark (tests run a task's work in-process)
        return 0, "0-0-0"
    return context.partitionId(), f"{context.partitionId()}-{context.stageId()}-{context.attemptNumber()}"


# partition path -> (base file, records it has room for) of each of its small file groups, in order
SmallGroups = dict[str, tuple[tuple[BaseFile, int], ...]]


def small_file_groups(view: FileSystemView, sizing: SizingPolicy) -> SmallGroups:
    """partition -> (base file, records it has room for) of its small file groups, in the order and by
    the rule of ``assign_inserts``: below the small file limit, with room for at least one record."""
    found: dict[str, list[tuple[BaseFile, int]]] = {}
    for partition in sorted(view.partitions):
        for group in view.in_partition(partition):
            base = group.latest
            if base.size >= sizing.small_file_bytes:
                continue
            room = int((sizing.max_file_bytes - base.size) / max(sizing.record_bytes, 1.0))
            if room > 0:
                found.setdefault(partition, []).append((base, room))
    return {p: tuple(groups) for p, groups in found.items()}


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
