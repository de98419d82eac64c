"""Tagging on executors: each task builds the index of its own partitions (the keys of the latest base
files, skipping files whose footer key range misses its keys) and gives each row its file group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cowrite.engine.planning import FILE_ID, index_keys, located, tag_locations
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.format.fs_view import BaseFile, open_base_file
from cowrite.spark.dedup import Count, footer_key_range
from cowrite.spark.executor import STAT, StorageSpec, carrying, from_ipc, rows_by, task_id, to_ipc
from cowrite.storage.backend import Storage
from cowrite.storage.together import together


@dataclass(frozen=True)
class TagRows:
    """Adds ``FILE_ID`` to a task's deduplicated rows: the file group that holds each key, null if none.

    The index is the local engine's (``index_keys`` over the latest base files of the row's partition,
    then ``tag_locations``), built inside the task for the keys the task holds: a base file whose footer
    key range misses the task's keys of its partition is skipped after reading its footer alone. The
    task's files are read at once (on an object store, their round trips together) and only the
    matches are kept. No index row crosses a shuffle. The task's rows per (partition path, file group)
    are reported in ``STAT`` rows (:class:`~.dedup.Count` as JSON): the driver plans from them.

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
            candidates = tuple(f for files in self.files.values() for f in files)
            [index] = self._matches(storage, [(candidates, table.column(RECORD_KEY))])
            incoming = table.drop_columns([PARTITION_PATH]).join(
                index.select([RECORD_KEY, PARTITION_PATH]), keys=RECORD_KEY, join_type="inner"
            )
            yield tag_locations(incoming, index)
            return
        partitions = list(rows_by(table, PARTITION_PATH))
        lookups = [(self.files.get(partition, ()), rows.column(RECORD_KEY)) for partition, rows in partitions]
        for (_, rows), index in zip(partitions, self._matches(storage, lookups), strict=True):
            yield tag_locations(rows, index)

    def _matches(
        self, storage: Storage, lookups: list[tuple[tuple[BaseFile, ...], pa.ChunkedArray]]
    ) -> list[pa.Table]:
        """For each of ``lookups`` (base files, keys), index rows of the files whose key is among the
        keys; every file read at once."""
        calls = []
        for files, keys in lookups:
            low, high, wanted = pc.min(keys).as_py(), pc.max(keys).as_py(), keys.combine_chunks()
            calls += [partial(_matches_in, storage, base, low, high, wanted) for base in files]
        found = together(storage, calls)
        read = sum(index is not None for index in found)
        if self.pruned is not None:
            self.pruned.add(len(found) - read)
        if self.read is not None:
            self.read.add(read)
        indexes, at = [], 0
        for files, _ in lookups:
            mine = [index for index in found[at : at + len(files)] if index is not None]
            indexes.append(pa.concat_tables([index_keys(storage, []), *mine]))
            at += len(files)
        return indexes


def _matches_in(storage: Storage, base: BaseFile, low: str, high: str, wanted: pa.Array) -> pa.Table | None:
    """Index rows of ``base`` whose key is among ``wanted``, from one open of the file: None, with its
    footer read alone, when its key range misses ``low`` to ``high``."""
    with open_base_file(storage, base.path) as stream:
        parquet = pq.ParquetFile(stream)
        bounds = footer_key_range(parquet.metadata)
        if bounds is not None and (bounds[1] < low or bounds[0] > high):
            return None
        return located(base, parquet.read(columns=[RECORD_KEY]).column(RECORD_KEY), wanted)
