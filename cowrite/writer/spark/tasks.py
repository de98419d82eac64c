"""What Spark's Python workers run: plain pyarrow over cowrite's shared writer functions.

Every callable here is a small frozen dataclass that Spark pickles into ``mapInArrow`` / ``applyInArrow``
tasks. Executors never receive a :class:`~cowrite.timeline.storage.Storage` (fsspec clients are neither
picklable nor safe to share between processes): they get a :class:`StorageSpec` — the table's URI and
fsspec options, S3 endpoint and keys included — and open their own storage from it, once per process.

The row formats follow the local engine exactly: keys and partition paths come from
:mod:`cowrite.writer.records`, deduplication from ``latest_per_key``, the index from ``index_keys``, and
every base file from ``write_file_group``, so a table reads the same whichever engine wrote it.

Columns of our own that travel between the stages of one write (never written to a base file):

============  ==================================================================================
``POSITION``  the row's place in the input DataFrame (``monotonically_increasing_id``): "a tie goes
              to the later row" must hold across a shuffle
``BUCKET``    the route key of the file group a row goes to (see :mod:`.plan`)
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

from ...timeline import config as keys
from ...timeline.commit_metadata import WriteStat
from ...timeline.config import Config
from ...timeline.errors import LeaseLostError
from ...timeline.fs_view import BaseFile
from ...timeline.heartbeat import Heartbeat, HeartbeatPolicy, abort_reason, heartbeat_age
from ...timeline.storage import Storage
from ...timeline.table import Table
from ..file_group import FileGroupWrite, write_file_group
from ..planning import FILE_ID, index_keys
from ..records import PARTITION_PATH, RECORD_KEY, latest_per_key, partition_paths, record_keys
from .errors import NondeterministicInputError

POSITION = "__cowrite_position"
BUCKET = "__cowrite_bucket"
STAT = "__cowrite_stat"
HELPER_COLUMNS = (POSITION, BUCKET, STAT, FILE_ID)


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


def _rows_by(table: pa.Table, column: str) -> Iterator[tuple[Any, pa.Table]]:
    """(value, rows with that value) for each distinct value of ``column``, rows in their order."""
    values = table.column(column)
    if table.num_rows == 0:
        return
    if values.null_count == 0 and pc.all(pc.equal(values, values[0])).as_py():
        yield values[0].as_py(), table
        return
    positions = pa.table({"value": values, "row": pa.array(np.arange(table.num_rows), pa.int64())})
    grouped = positions.group_by("value", use_threads=False).aggregate([("row", "list")])
    for value, rows in zip(grouped.column("value").to_pylist(), grouped.column("row_list"), strict=True):
        yield value, table.take(rows.values)


def _stat_json(stat: WriteStat) -> str:
    return json.dumps(dataclasses.asdict(stat), sort_keys=True)


def stat_from_json(text: str) -> WriteStat:
    return WriteStat(**json.loads(text))


def _only_stats(schema: pa.Schema, stats: Sequence[WriteStat]) -> pa.RecordBatch:
    """Rows of ``schema`` that carry nothing but write stats."""
    columns = [
        pa.array([_stat_json(s) for s in stats], pa.string())
        if f.name == STAT
        else pa.nulls(len(stats), f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# -- deduplication (upsert, delete, insert_overwrite) ------------------------------------------------------
@dataclass(frozen=True)
class Deduplicate:
    """One row per record key in a shuffle partition that holds every row of its keys.

    Input: the DataFrame's columns plus ``POSITION``; output: the columns plus key and partition path.
    """

    spec: TableSpec
    ordering: tuple[str, ...]
    with_paths: bool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        collected = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not collected:
            return
        table = pa.concat_tables(collected).sort_by(POSITION)  # input order: ties go to the later row
        stamped = stamp(table.drop_columns([POSITION]), self.spec, self.with_paths)
        yield from latest_per_key(stamped, stamped.column(RECORD_KEY), self.ordering).to_batches()


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
class ReadIndex:
    """(record key, partition path, file id) of the latest base files, one file per input id.

    A file whose footer key range misses the incoming keys of its partition is skipped without reading
    its keys (its footer is all that is read); ``pruned`` counts those files.
    """

    storage: StorageSpec
    files: tuple[BaseFile, ...]
    ranges: Mapping[str, tuple[str, str]]  # partition path -> incoming (min key, max key)
    pruned: Any = None  # a Spark accumulator

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        storage = self.storage.open()
        for batch in batches:
            for number in batch.column(0).to_pylist():
                base = self.files[number]
                wanted = self.ranges.get(base.partition)
                if wanted is not None:
                    with storage.open_input(base.path) as stream:
                        bounds = footer_key_range(pq.ParquetFile(stream).metadata)
                    if bounds is not None and (bounds[1] < wanted[0] or bounds[0] > wanted[1]):
                        if self.pruned is not None:
                            self.pruned.add(1)
                        continue
                yield from index_keys(storage, [base]).to_batches()


INDEX_SCHEMA = f"{RECORD_KEY} string, {PARTITION_PATH} string, {FILE_ID} string"


# -- counting and bucket assignment ------------------------------------------------------------------------
@dataclass(frozen=True)
class CountRows:
    """Rows per (task, partition path, file id) — file id null for new records — of this task's input.

    ``stamp_input``: the input holds the raw key and partition columns (inserts), so the keys are
    computed here, which is where null keys are found — before the transaction begins.
    """

    spec: TableSpec
    stamp_input: bool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = task_id()
        counts: Counter[tuple[str, str | None]] = Counter()
        for batch in batches:
            table = pa.Table.from_batches([batch])
            if self.stamp_input:
                table = stamp(table, self.spec)
            file_ids = (
                table.column(FILE_ID)
                if FILE_ID in table.column_names
                else pa.chunked_array([pa.nulls(table.num_rows, pa.string())])
            )
            grouped = pa.table({"p": table.column(PARTITION_PATH), "f": file_ids}).group_by(
                ["p", "f"], use_threads=False
            )
            found = grouped.aggregate([([], "count_all")])
            for p, f, n in zip(
                found.column("p").to_pylist(),
                found.column("f").to_pylist(),
                found.column("count_all").to_pylist(),
                strict=True,
            ):
                counts[(p, f)] += n
        if counts:
            items = sorted(counts.items(), key=lambda item: (item[0][0], item[0][1] or ""))
            yield pa.record_batch(
                {
                    "task": pa.array([task] * len(items), pa.int64()),
                    "partition": pa.array([p for (p, _), _ in items], pa.string()),
                    "file_id": pa.array([f for (_, f), _ in items], pa.string()),
                    "rows": pa.array([n for _, n in items], pa.int64()),
                }
            )


COUNT_SCHEMA = "task long, partition string, file_id string, rows long"


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
    by the segments."""

    updates: Mapping[tuple[str, str], int]  # (partition path, file id) -> route key
    segments: Mapping[tuple[int, str], Segments]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        inserts = RankedInserts(self.segments, task_id())
        lookup = pa.table(
            {
                PARTITION_PATH: pa.array([p for p, _ in self.updates], pa.string()),
                FILE_ID: pa.array([f for _, f in self.updates], pa.string()),
                BUCKET: pa.array(list(self.updates.values()), pa.int64()),
            }
        )
        for batch in batches:
            table = pa.Table.from_batches([batch])
            columns = [c for c in table.column_names if c != FILE_ID] + [BUCKET]
            known = pc.is_valid(table.column(FILE_ID))
            updates = table.filter(known)
            if updates.num_rows:
                routed = updates.join(lookup, keys=[PARTITION_PATH, FILE_ID], join_type="inner")
                if routed.num_rows != updates.num_rows:
                    raise AssertionError("a tagged file group is missing from the plan")
                yield from routed.select(columns).to_batches()
            new = table.filter(pc.invert(known))
            for partition, rows in _rows_by(new, PARTITION_PATH):
                routes = pa.array(inserts.route(partition, rows.num_rows), pa.int64())
                yield from rows.append_column(BUCKET, routes).select(columns).to_batches()
        inserts.check_complete()


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
            stats.append(_stat_json(self.context.write(storage, route, table)))
        return pa.table({STAT: pa.array(stats, pa.string())})


@dataclass(frozen=True)
class WriteInserts:
    """``mapInArrow`` over the input of an insert: writes the new file groups of this task's own records.

    Records bound for a small file group (which other tasks may feed too, and which must be merged with
    its base file) leave as rows with ``BUCKET`` for a shuffle; every written file leaves as a ``STAT`` row.
    Output columns: the input's, key, partition path, ``BUCKET``, ``STAT``. A file group is written as
    soon as its last record arrived, so a task holds only the file groups it is in the middle of.
    """

    context: WriteContext
    segments: Mapping[tuple[int, str], Segments]
    local: frozenset[int]  # route keys of the file groups written here

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        storage = self.context.spec.storage.open()
        inserts = RankedInserts(self.segments, task_id())
        expected = {
            route: rows
            for (task, _), plan in self.segments.items()
            if task == inserts.task
            for route, rows in _sizes(plan).items()
            if route in self.local
        }
        pending: dict[int, list[pa.Table]] = {}
        filled: Counter[int] = Counter()
        for batch in batches:
            table = stamp(pa.Table.from_batches([batch]), self.context.spec)
            output = pa.schema([*table.schema, pa.field(BUCKET, pa.int64()), pa.field(STAT, pa.string())])
            for partition, rows in _rows_by(table, PARTITION_PATH):
                routes = inserts.route(partition, rows.num_rows)
                for route in np.unique(routes).tolist():
                    part = rows.filter(pa.array(routes == route))
                    if route not in self.local:
                        yield from _routed(part, route, output)
                        continue
                    pending.setdefault(route, []).append(part)
                    filled[route] += part.num_rows
                    if filled[route] == expected[route]:
                        stat = self.context.write(storage, route, pa.concat_tables(pending.pop(route)))
                        yield _only_stats(output, [stat])
        inserts.check_complete()


def _routed(rows: pa.Table, route: int, output: pa.Schema) -> Iterator[pa.RecordBatch]:
    bucket = pa.array(np.full(rows.num_rows, route, dtype=np.int64))
    stat = pa.nulls(rows.num_rows, pa.string())
    yield from rows.append_column(BUCKET, bucket).append_column(STAT, stat).cast(output).to_batches()


def _sizes(plan: Segments) -> dict[int, int]:
    sizes: Counter[int] = Counter()
    start = 0
    for end, route in zip(plan.ends, plan.buckets, strict=True):
        sizes[route] += end - start
        start = end
    return dict(sizes)


# -- reading -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadFiles:
    """Rows of base files, one file per input id, conformed to one schema (the reader's).

    ``commit_times``: keep only rows written by these commits (incremental reads).
    """

    storage: StorageSpec
    files: tuple[str, ...]
    schema: pa.Schema
    commit_times: tuple[str, ...] | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from self.read(int(n) for n in batch.column(0).to_pylist())

    def read(self, numbers: Iterable[int]) -> Iterator[pa.RecordBatch]:
        from ..file_group import read_base_file
        from ..records import COMMIT_TIME

        storage = self.storage.open()
        wanted = self.commit_times
        for number in numbers:
            table = read_base_file(storage, self.files[number])
            if wanted is not None:
                table = table.filter(
                    pc.is_in(table.column(COMMIT_TIME), value_set=pa.array(wanted, pa.string()))
                )
            yield from conform(table, self.schema).to_batches()


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
