"""What Spark's Python workers run: plain pyarrow over cowrite's shared writer functions.

Every callable here is a small frozen dataclass that Spark pickles into ``mapInArrow`` / ``applyInArrow``
tasks. Executors never receive a :class:`~cowrite.storage.backend.Storage` (fsspec clients are neither
picklable nor safe to share between processes): they get a :class:`StorageSpec` — the table's URI and
fsspec options, S3 endpoint and keys included — and open their own storage from it, once per process.

The row formats follow the local engine exactly: keys and partition paths come from
:mod:`cowrite.engine.records`, deduplication from ``latest_per_key``, the index from ``index_keys``, and
every base file from ``write_file_group``, so a table reads the same whichever engine wrote it.

Columns of our own that travel between the stages of one write (never written to a base file):

============  ==================================================================================
``POSITION``  the row's place in the input DataFrame (``monotonically_increasing_id``): "a tie goes
              to the later row" must hold across a shuffle, and the narrow rows that decide find
              their whole row again by it
``FILE_ID``   the file group that holds the row's key (the index's answer; null for a new key)
``BUCKET``    the route key of the file group a row goes to (see :mod:`.plan`)
``TASK``      the task that tagged a row, when the rows are routed on the driver
``STAT``      a write stat as JSON, on the rows that report a written base file
============  ==================================================================================
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cowrite.engine.file_group import FileGroupWrite, write_file_group
from cowrite.engine.planning import FILE_ID, index_keys, tag_locations
from cowrite.engine.records import (
    COMMIT_TIME,
    PARTITION_PATH,
    RECORD_KEY,
    latest_per_key,
    partition_paths,
    record_keys,
)
from cowrite.errors import LeaseLostError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import WriteStat
from cowrite.format.config import Config
from cowrite.format.fs_view import BaseFile, open_base_file
from cowrite.format.table import Table
from cowrite.protocol.heartbeat import Heartbeat, HeartbeatPolicy, abort_reason, heartbeat_age
from cowrite.spark.errors import NondeterministicInputError
from cowrite.spark.filters import Predicate, arrow_filter
from cowrite.storage.backend import Storage

POSITION = "__cowrite_position"
BUCKET = "__cowrite_bucket"
TASK = "__cowrite_task"
STAT = "__cowrite_stat"


# -- storage and table on an executor ---------------------------------------------------------------------
@dataclass(frozen=True)
class StorageSpec:
    """How an executor opens the table's storage: its URI and fsspec options (credentials included)."""

    uri: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, storage: Storage) -> StorageSpec:
        return cls(storage.uri, dict(storage.fs.storage_options))

    def open(self) -> Storage:
        key = (self.uri, json.dumps(self.options, sort_keys=True, default=repr))
        with _OPEN_LOCK:
            storage = _OPENED.get(key)
            if storage is None:
                storage = _OPENED[key] = Storage.for_uri(self.uri, **dict(self.options))
        return storage


_OPENED: dict[tuple[str, str], Storage] = {}  # one Storage per table and options in each worker process
_OPEN_LOCK = threading.Lock()


@dataclass(frozen=True)
class TableSpec:
    """What tasks need of a table and of one write's settings."""

    storage: StorageSpec
    name: str
    record_key_fields: tuple[str, ...]
    partition_fields: tuple[str, ...]
    hive_style: bool
    ordering_fields: tuple[str, ...]
    compression: str
    heartbeat: HeartbeatPolicy
    source: str = "input"  # how error messages name the input

    @classmethod
    def of(cls, table: Table, config: Config, source: str = "input") -> TableSpec:
        return cls(
            storage=StorageSpec.of(table.storage),
            name=table.name,
            record_key_fields=table.record_key_fields,
            partition_fields=table.partition_fields,
            hive_style=table.hive_style_partitioning,
            ordering_fields=table.ordering_fields,
            compression=config.get(keys.PARQUET_COMPRESSION),
            heartbeat=HeartbeatPolicy.from_config(config),
            source=source,
        )


def task_id() -> int:
    """The Spark partition this task works on (the same in every job over one persisted input)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def stamp(data: pa.Table, spec: TableSpec, with_paths: bool = True) -> pa.Table:
    """``data`` without input ``_hoodie_*`` columns, plus record key and partition path columns.

    ``with_paths=False`` (a delete without partition columns): the path is null, found later by key.
    """
    data = data.drop_columns([c for c in data.column_names if c.startswith("_hoodie_")])
    key_column = record_keys(data, spec.record_key_fields, spec.source)
    if with_paths:
        paths = partition_paths(data, spec.partition_fields, spec.hive_style, spec.source)
    else:
        paths = pa.chunked_array([pa.nulls(data.num_rows, pa.string())])
    return data.append_column(RECORD_KEY, key_column).append_column(PARTITION_PATH, paths)


def check_lease(storage: Storage, instant: str, policy: HeartbeatPolicy) -> None:
    """Stop writing once the writer's heartbeat is stale or marked aborted (the executors' check_alive).

    The driver (or, for the data source, the tasks themselves) renews the heartbeat; tasks judge it by
    its age on storage, as every other judge does.
    """
    age = heartbeat_age(storage, instant)
    if age is None or age > policy.tolerance:
        raise LeaseLostError(
            f"the heartbeat of instant {instant} is {'gone' if age is None else f'{age:.0f} s old'}; "
            "the writer lost its lease, its tasks stop writing"
        )
    reason = abort_reason(storage, instant)
    if reason is not None:
        raise LeaseLostError(f"instant {instant} was aborted ({reason}); its tasks stop writing")


def renew_lease(storage: Storage, instant: str, policy: HeartbeatPolicy, owner: str) -> None:
    """Renew a live heartbeat from a task (data source writes, whose driver process does not last).

    A heartbeat that is already stale or aborted is never revived: the writer is failed for good.
    """
    check_lease(storage, instant, policy)
    Heartbeat(storage, instant, policy, owner).renew()


CHUNK_ROWS = 131_072  # Spark hands Python 10,000-row batches; fewer, larger steps cost less per row


def chunks(batches: Iterable[pa.RecordBatch], rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """The batches regrouped into tables of at least ``rows`` rows (the last may be smaller); no copies."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if batch.num_rows:
            pending.append(batch)
            count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(pending)
            pending, count = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def rows_by(table: pa.Table, column: str) -> Iterator[tuple[Any, pa.Table]]:
    """(value, rows with that value) for each distinct value of ``column``, rows in their order.

    One stable sort of the values' dictionary codes and one take: the groups are slices of the result.
    """
    values = table.column(column)
    if table.num_rows == 0:
        return
    if values.null_count == 0 and pc.all(pc.equal(values, values[0])).as_py():
        yield values[0].as_py(), table
        return
    encoded = pc.dictionary_encode(values, null_encoding="encode").combine_chunks()
    codes = encoded.indices
    ordered = table.take(pc.sort_indices(codes))
    sizes = np.bincount(codes.to_numpy(zero_copy_only=False), minlength=len(encoded.dictionary))
    start = 0
    for value, size in zip(encoded.dictionary.to_pylist(), sizes.tolist(), strict=True):
        if size:
            yield value, ordered.slice(start, size)
        start += size


def to_ipc(table: pa.Table) -> pa.Buffer:
    """``table`` as an Arrow IPC stream, to hand to a Python RDD: it holds the rows of a slice alone,
    where a pickled slice carries the whole buffers it is cut from."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(stream: pa.Buffer) -> pa.Table:
    return pa.ipc.open_stream(stream).read_all()


def stat_to_json(stat: WriteStat) -> str:
    return json.dumps(dataclasses.asdict(stat), sort_keys=True)


def stat_from_json(text: str) -> WriteStat:
    return WriteStat(**json.loads(text))


def carrying(schema: pa.Schema, texts: Sequence[str]) -> pa.RecordBatch:
    """Rows of ``schema`` that carry nothing but ``texts`` (JSON) in ``STAT``, every other column null."""
    columns = [
        pa.array(texts, pa.string()) if f.name == STAT else pa.nulls(len(texts), f.type) for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# -- deduplication (upsert, delete, insert_overwrite) ------------------------------------------------------
@dataclass(frozen=True)
class Deduplicate:
    """One row per record key in a shuffle partition that holds every row of its keys.

    Input: key, partition and ordering columns plus ``POSITION``; output: the same plus key, partition
    path and ``STAT`` (the position stays: it finds the whole row again). The task's rows of each
    partition path are reported, with their smallest and largest key, in ``STAT`` rows
    (:class:`KeyRange`): the driver plans from them without a pass of its own over the rows.
    """

    spec: TableSpec
    ordering: tuple[str, ...]
    with_paths: bool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not collected:
            return
        winners = deduplicate(pa.concat_tables(collected), self.spec, self.ordering, self.with_paths)
        output = winners.append_column(STAT, pa.nulls(winners.num_rows, pa.string()))
        yield from output.to_batches()
        yield carrying(output.schema, [r.to_json() for r in key_ranges(winners, task_id())])


def deduplicate(narrow: pa.Table, spec: TableSpec, ordering: tuple[str, ...], with_paths: bool) -> pa.Table:
    """The winner of each record key among ``narrow`` rows (with ``POSITION``), stamped with key and path."""
    stamped = stamp(narrow.sort_by(POSITION), spec, with_paths)  # input order: ties go to the later row
    return latest_per_key(stamped, stamped.column(RECORD_KEY), ordering)


def key_ranges(winners: pa.Table, task: int) -> list[KeyRange]:
    """Rows, smallest and largest key of deduplicated ``winners`` per partition path."""
    found = winners.group_by(PARTITION_PATH, use_threads=False).aggregate(
        [(RECORD_KEY, "count"), (RECORD_KEY, "min"), (RECORD_KEY, "max")]
    )
    return [
        KeyRange(task, path, rows, low, high)
        for path, rows, low, high in zip(
            found.column(PARTITION_PATH).to_pylist(),
            found.column(f"{RECORD_KEY}_count").to_pylist(),
            found.column(f"{RECORD_KEY}_min").to_pylist(),
            found.column(f"{RECORD_KEY}_max").to_pylist(),
            strict=True,
        )
    ]


@dataclass(frozen=True)
class Count:
    """Rows one task holds of one partition path and file group (None: new records)."""

    task: int
    partition: str
    file_id: str | None
    rows: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Count:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class KeyRange:
    """Deduplicated rows one task holds of one partition path (None: not known yet), and their keys."""

    task: int
    partition: str | None
    rows: int
    low: str
    high: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> KeyRange:
        return cls(**json.loads(text))


# -- the index (upsert, delete) ----------------------------------------------------------------------------
def footer_key_range(metadata: pq.FileMetaData) -> tuple[str, str] | None:
    """(smallest, largest) record key of a base file from its footer statistics; None if unknown."""
    schema = metadata.schema.to_arrow_schema()
    if RECORD_KEY not in schema.names:
        return None
    column = schema.get_field_index(RECORD_KEY)
    low: str | None = None
    high: str | None = None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if metadata.row_group(group).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            return None
        low = stats.min if low is None or stats.min < low else low
        high = stats.max if high is None or stats.max > high else high
    return (low, high) if low is not None and high is not None else None


@dataclass(frozen=True)
class TagRows:
    """Adds ``FILE_ID`` to a task's deduplicated rows: the file group that holds each key, null if none.

    The index is the local engine's (``index_keys`` over the latest base files of the row's partition,
    then ``tag_locations``), built inside the task for the keys the task holds: a base file whose footer
    key range misses the task's keys of its partition is skipped after reading its footer alone. Keys
    are read one file at a time and only the matches are kept: memory stays at one file's keys. No
    index row crosses a shuffle. The task's rows per (partition path, file group) are reported in
    ``STAT`` rows (:class:`~.plan.Count` as JSON): the driver plans from them.

    ``by_key_only`` (deletes without partition columns): every partition's files are candidates, the
    key alone decides, as in the local engine. ``keep_new=False`` (deletes): rows whose key no file
    group holds are dropped.
    """

    storage: StorageSpec
    files: Mapping[str, tuple[BaseFile, ...]]  # partition path -> its latest base files
    columns: tuple[str, ...]  # output columns, in order (the input's plus FILE_ID and STAT)
    by_key_only: bool = False
    keep_new: bool = True
    read: Any = None  # Spark accumulators: files whose keys were read, files skipped by footer
    pruned: Any = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not collected:
            return
        table = pa.concat_tables(collected)
        schema = pa.schema(
            [
                table.schema.field(c) if c in table.column_names else pa.field(c, pa.string())
                for c in self.columns
            ]
        )
        storage = self.storage.open()
        counts: Counter[tuple[str, str | None]] = Counter()
        for tagged in self._tagged(storage, table):
            if not self.keep_new:
                tagged = tagged.filter(pc.is_valid(tagged.column(FILE_ID)))
            found = tagged.group_by([PARTITION_PATH, FILE_ID], use_threads=False).aggregate(
                [([], "count_all")]
            )
            for path, file_id, rows in zip(
                found.column(PARTITION_PATH).to_pylist(),
                found.column(FILE_ID).to_pylist(),
                found.column("count_all").to_pylist(),
                strict=True,
            ):
                counts[(path, file_id)] += rows
            output = tagged.append_column(STAT, pa.nulls(tagged.num_rows, pa.string()))
            yield from output.select(list(self.columns)).cast(schema).to_batches()
        task = task_id()
        yield carrying(schema, [Count(task, p, f, n).to_json() for (p, f), n in counts.items()])

    def stream(self, rows: pa.Buffer) -> pa.Buffer:
        """The output for ``rows`` (a job of Python tasks that tag ranges of rows), both as Arrow IPC
        streams (see :func:`to_ipc`)."""
        table = from_ipc(rows)
        schema = pa.schema(
            [
                table.schema.field(c) if c in table.column_names else pa.field(c, pa.string())
                for c in self.columns
            ]
        )
        return to_ipc(pa.Table.from_batches(list(self(iter(table.to_batches()))), schema=schema))

    def _tagged(self, storage: Storage, table: pa.Table) -> Iterator[pa.Table]:
        if self.by_key_only:
            candidates = [f for files in self.files.values() for f in files]
            index = self._matches(storage, candidates, table.column(RECORD_KEY))
            incoming = table.drop_columns([PARTITION_PATH]).join(
                index.select([RECORD_KEY, PARTITION_PATH]), keys=RECORD_KEY, join_type="inner"
            )
            yield tag_locations(incoming, index)
            return
        for partition, rows in rows_by(table, PARTITION_PATH):
            index = self._matches(storage, self.files.get(partition, ()), rows.column(RECORD_KEY))
            yield tag_locations(rows, index)

    def _matches(self, storage: Storage, files: Iterable[BaseFile], keys: pa.ChunkedArray) -> pa.Table:
        """Index rows of ``files`` whose key is among ``keys``."""
        low, high = pc.min(keys).as_py(), pc.max(keys).as_py()
        wanted = keys.combine_chunks()
        found = [index_keys(storage, [])]
        for base in files:
            with open_base_file(storage, base.path) as stream:
                bounds = footer_key_range(pq.ParquetFile(stream).metadata)
            if bounds is not None and (bounds[1] < low or bounds[0] > high):
                if self.pruned is not None:
                    self.pruned.add(1)
                continue
            if self.read is not None:
                self.read.add(1)
            found.append(index_keys(storage, [base], among=wanted))
        return pa.concat_tables(found)


# -- counting and bucket assignment ------------------------------------------------------------------------
@dataclass(frozen=True)
class Segments:
    """Where one task's new records of one partition go, in the order the task sees them.

    Records ``[ends[i-1], ends[i])`` (0 for ``i = 0``) go to the file group of route key ``buckets[i]``.
    """

    ends: tuple[int, ...]
    buckets: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else 0

    def assign(self, start: int, count: int) -> np.ndarray:
        """Route keys of the records ranked ``start .. start + count - 1``."""
        ranks = np.arange(start, start + count, dtype=np.int64)
        return np.asarray(self.buckets, dtype=np.int64)[np.searchsorted(self.ends, ranks, side="right")]


class RankedInserts:
    """Counts a task's new records per partition as they come, and routes them by the plan's segments."""

    def __init__(self, segments: Mapping[tuple[int, str], Segments], task: int) -> None:
        self.segments = segments
        self.task = task
        self.seen: Counter[str] = Counter()

    def route(self, partition: str, count: int) -> np.ndarray:
        plan = self.segments.get((self.task, partition), Segments((), ()))
        start = self.seen[partition]
        if start + count > plan.total:
            raise NondeterministicInputError(self.task, partition, plan.total, start + count)
        self.seen[partition] += count
        return plan.assign(start, count)

    def check_complete(self) -> None:
        for (task, partition), plan in self.segments.items():
            if task == self.task and self.seen[partition] != plan.total:
                raise NondeterministicInputError(task, partition, plan.total, self.seen[partition])


@dataclass(frozen=True)
class AssignBuckets:
    """Adds ``BUCKET`` to tagged rows (dropping ``FILE_ID``): updates go to their file group, new records
    by the segments.

    Runs in the tasks that tagged the rows, or on the driver over the rows of all those tasks (with
    their task in ``TASK``) when they are as few as Spark would broadcast anyway.
    """

    updates: Mapping[tuple[str, str], int]  # (partition path, file id) -> route key
    segments: Mapping[tuple[int, str], Segments]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for table in self.route(chunks(batches), task_id()):
            yield from table.to_batches()

    def route_tasks(self, tagged: pa.Table) -> pa.Table:
        """All tasks' rows routed: ``tagged`` holds them with ``TASK``, in each task's order."""
        routed = [
            table
            for task, rows in rows_by(tagged, TASK)
            for table in self.route([rows.drop_columns([TASK])], task)
        ]
        columns = [c for c in tagged.column_names if c not in (FILE_ID, TASK)] + [BUCKET]
        schema = pa.schema([*(tagged.schema.field(c) for c in columns[:-1]), pa.field(BUCKET, pa.int64())])
        return pa.concat_tables(routed) if routed else schema.empty_table()

    def route(self, tables: Iterable[pa.Table], task: int) -> Iterator[pa.Table]:
        """The rows of one task, in its order, with their route key."""
        inserts = RankedInserts(self.segments, task)
        lookup = pa.table(
            {
                PARTITION_PATH: pa.array([p for p, _ in self.updates], pa.string()),
                FILE_ID: pa.array([f for _, f in self.updates], pa.string()),
                BUCKET: pa.array(list(self.updates.values()), pa.int64()),
            }
        )
        for table in tables:
            columns = [c for c in table.column_names if c != FILE_ID] + [BUCKET]
            known = pc.is_valid(table.column(FILE_ID))
            updates = table.filter(known)
            if updates.num_rows:
                routed = updates.join(lookup, keys=[PARTITION_PATH, FILE_ID], join_type="inner")
                if routed.num_rows != updates.num_rows:
                    raise AssertionError("a tagged file group is missing from the plan")
                yield routed.select(columns)
            new = table.filter(pc.invert(known))
            for partition, rows in rows_by(new, PARTITION_PATH):
                routes = pa.array(inserts.route(partition, rows.num_rows), pa.int64())
                yield rows.append_column(BUCKET, routes).select(columns)
        inserts.check_complete()


@dataclass(frozen=True)
class AttachRoutes:
    """``mapInArrow`` over a merge's whole input rows (with ``POSITION``): keeps the rows the driver
    routed (deduplication's winners) and adds their key, partition path and ``BUCKET``.

    A join by position done in the tasks that read the input: the routes are few (as few as Spark would
    broadcast), and travel with the function.
    """

    routes: pa.Buffer  # POSITION, RECORD_KEY, PARTITION_PATH, BUCKET of every routed row (see of)
    columns: tuple[str, ...]  # output columns: the input's (without key and path), key, path, BUCKET

    @classmethod
    def of(cls, routes: pa.Table, columns: tuple[str, ...]) -> AttachRoutes:
        """The routes travel as an IPC stream (:func:`to_ipc`): those of new records are slices, one per
        partition, and pickled each would carry every partition's rows."""
        return cls(to_ipc(routes), columns)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        routes = from_ipc(self.routes)
        positions = routes.column(POSITION)
        attached = [RECORD_KEY, PARTITION_PATH, BUCKET]
        for table in chunks(batches):
            found = pc.index_in(table.column(POSITION), value_set=positions)
            kept = pc.is_valid(found)
            rows = table.filter(kept).drop_columns([c for c in attached if c in table.column_names])
            routed = routes.take(found.filter(kept))
            for name in attached:
                rows = rows.append_column(name, routed.column(name))
            yield from rows.select(list(self.columns)).to_batches()


# -- writing file groups -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BucketWrite:
    """One file group of the plan, as a task writes it."""

    write: FileGroupWrite
    task: int  # numbers the write token and the sequence numbers, as the local engine's task index


@dataclass(frozen=True)
class WriteContext:
    """Everything a writing task needs besides its rows."""

    spec: TableSpec
    instant: str
    buckets: Mapping[int, BucketWrite]  # route key -> file group
    data_columns: tuple[str, ...]  # the input's columns in order: new base files keep it
    delete: bool = False

    def write(self, storage: Storage, route: int, rows: pa.Table) -> WriteStat:
        """Write the file group of ``route`` with ``rows`` (data, key and path columns)."""
        check_lease(storage, self.instant, self.spec.heartbeat)
        bucket = self.buckets[route]
        deleted_keys = None
        if self.delete:
            deleted_keys = rows.column(RECORD_KEY).combine_chunks()
            incoming = rows.select([RECORD_KEY, PARTITION_PATH]).slice(0, 0)
        else:
            incoming = rows.select([*self.data_columns, RECORD_KEY, PARTITION_PATH])
        return write_file_group(
            storage,
            bucket.write,
            self.instant,
            incoming,
            deleted_keys=deleted_keys,
            ordering=self.spec.ordering_fields,
            compression=self.spec.compression,
            task=bucket.task,
        )


@dataclass(frozen=True)
class WriteGroup:
    """``applyInArrow`` over ``BUCKET`` groups: writes the group's file group; passes stat rows through."""

    context: WriteContext

    def as_function(self) -> Callable[[pa.Table], pa.Table]:
        """A plain function: Spark tells applyInArrow's two call forms apart by counting arguments,
        and counts ``self`` of a callable object."""

        def write_group(table: pa.Table) -> pa.Table:
            return self(table)

        return write_group

    def __call__(self, table: pa.Table) -> pa.Table:
        stats: list[str] = []
        if STAT in table.column_names:
            carried = pc.is_valid(table.column(STAT))
            stats = [s for s in table.column(STAT).filter(carried).to_pylist() if s is not None]
            table = table.filter(pc.invert(carried))
        if table.num_rows:
            route = table.column(BUCKET)[0].as_py()
            storage = self.context.spec.storage.open()
            stats.append(stat_to_json(self.context.write(storage, route, table)))
        return pa.table({STAT: pa.array(stats, pa.string())})


# -- reading -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadFiles:
    """Rows of base files, one file per input id, conformed to one schema (the reader's).

    ``commit_times``: keep only rows written by these commits (incremental reads); ``rules``: keep only
    rows that satisfy these filters.
    """

    storage: StorageSpec
    files: tuple[str, ...]
    schema: pa.Schema
    commit_times: tuple[str, ...] | None = None
    rules: tuple[Predicate, ...] = ()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from self.read(int(n) for n in batch.column(0).to_pylist())

    def read(self, numbers: Iterable[int]) -> Iterator[pa.RecordBatch]:
        storage = self.storage.open()
        wanted = pa.array(self.commit_times, pa.string()) if self.commit_times is not None else None
        needed = [*self.schema.names, *(r.column for r in self.rules)]
        if wanted is not None:
            needed.append(COMMIT_TIME)
        for number in numbers:
            with open_base_file(storage, self.files[number]) as stream:
                parquet = pq.ParquetFile(stream)
                present = set(parquet.schema_arrow.names)
                table = parquet.read(columns=[c for c in dict.fromkeys(needed) if c in present])
            if wanted is not None:
                table = table.filter(pc.is_in(table.column(COMMIT_TIME), value_set=wanted))
            yield from conform(arrow_filter(table, self.rules), self.schema).to_batches()


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns: missing ones null, others cast (older file versions)."""
    columns = []
    for target in schema:
        if target.name in table.column_names:
            column = table.column(target.name)
            columns.append(column if column.type == target.type else column.cast(target.type))
        else:
            columns.append(pa.chunked_array([pa.nulls(table.num_rows, target.type)]))
    return pa.Table.from_arrays(columns, schema=schema)
