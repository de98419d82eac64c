"""Writing on executors: each route's whole rows merged into their file group by the local engine's
``write_file_group``, and base files read back for the rows a merge keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cowrite.engine.file_group import FileGroupWrite, write_file_group
from cowrite.engine.records import COMMIT_TIME, PARTITION_PATH, RECORD_KEY
from cowrite.format.commit_metadata import WriteStat
from cowrite.format.fs_view import open_base_file
from cowrite.spark.executor import BUCKET, STAT, StorageSpec, TableSpec, conform, lease_asked, stat_to_json
from cowrite.spark.filters import Predicate, arrow_filter
from cowrite.storage.backend import Storage


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
        """Write the file group of ``route`` with ``rows`` (data, key and path columns), once the writer's
        lease, asked beside the read of the base file, holds."""
        lease_holds = lease_asked(storage, self.instant, self.spec.heartbeat)
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
            before_write=lease_holds,
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
