"""What every task on an executor starts from: the table and its storage, leases, batches, and the
columns that travel between the stages of one write.

What Spark's Python workers run is plain pyarrow over cowrite's shared writer functions, in modules by
what it does: :mod:`.dedup` (deduplication, key ranges), :mod:`.tagging` (the index), :mod:`.routing`
(rows to file groups), :mod:`.writing` (base files).

Every callable here is a small frozen dataclass that Spark pickles into ``mapInArrow`` / ``applyInArrow``
tasks. Executors never receive a :class:`~cowrite.storage.backend.Storage` (fsspec clients are neither
picklable nor safe to share between processes): they get a :class:`StorageSpec` — the table's URI and
fsspec options, with the S3 endpoint and keys the driver resolved from its own environment — and open
their own storage from it, once per process. Workers need no AWS environment of their own.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.records import PARTITION_PATH, RECORD_KEY, partition_paths, record_keys
from cowrite.errors import LeaseLostError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import WriteStat
from cowrite.format.config import Config
from cowrite.format.table import Table
from cowrite.process import keep_mapping
from cowrite.protocol.heartbeat import Heartbeat, HeartbeatPolicy, abort_reason, heartbeat_age
from cowrite.storage.backend import Storage
from cowrite.storage.together import ahead

POSITION = "__cowrite_position"
BUCKET = "__cowrite_bucket"
TASK = "__cowrite_task"
STAT = "__cowrite_stat"


@dataclass(frozen=True)
class StorageSpec:
    """How an executor opens the table's storage: its URI and fsspec options (credentials included)."""

    uri: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, storage: Storage) -> StorageSpec:
        return cls(storage.uri, storage.portable_options())

    def open(self) -> Storage:
        key = (self.uri, json.dumps(self.options, sort_keys=True, default=repr))
        with _OPEN_LOCK:
            storage = _OPENED.get(key)
            if storage is None:
                storage = _OPENED[key] = Storage.for_uri(self.uri, **dict(self.options))
        return storage


_OPENED: dict[tuple[str, str], Storage] = {}
_OPEN_LOCK = threading.Lock()
keep_mapping(
    f"{__name__}._OPENED",
    _OPENED,
    "one Storage per table and storage options, in each Python worker",
    "fsspec clients are costly to open and cannot travel with a task; a worker runs many tasks",
)


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
    lease_asked(storage, instant, policy)()


def lease_asked(storage: Storage, instant: str, policy: HeartbeatPolicy) -> Callable[[], None]:
    """:func:`check_lease` in two halves: the heartbeat's age and the abort reason are asked now (beside
    each other and beside what the caller reads next, on an object store), and the function returned
    judges the answers, raising :class:`LeaseLostError` as :func:`check_lease` does. A task asks before
    its reads and judges right before it writes: the answers are as fresh as a check before the reads."""
    age_of = ahead(storage, partial(heartbeat_age, storage, instant))
    reason_of = ahead(storage, partial(abort_reason, storage, instant))

    def judge() -> None:
        age, reason = age_of(), reason_of()
        if age is None or age > policy.tolerance:
            raise LeaseLostError(
                f"the heartbeat of instant {instant} is {'gone' if age is None else f'{age:.0f} s old'}; "
                "the writer lost its lease, its tasks stop writing"
            )
        if reason is not None:
            raise LeaseLostError(f"instant {instant} was aborted ({reason}); its tasks stop writing")

    return judge


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
