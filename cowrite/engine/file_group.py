"""Writing one file group: merge its current base file with incoming rows into a new base file.

This is the unit of work of every engine (the local engine runs it in the driver, the Spark engine on
executors): it reads at most one base file, writes exactly one, and returns the write stat for the commit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cowrite.engine.records import (
    COMMIT_SEQNO,
    COMMIT_TIME,
    FILE_NAME,
    META_COLUMNS,
    RECORD_KEY,
    latest_positions,
)
from cowrite.format.commit_metadata import WriteStat
from cowrite.format.fs_view import BaseFile, open_base_file
from cowrite.storage.backend import Storage

_INCOMING = "__cowrite_incoming"


@dataclass(frozen=True)
class FileGroupWrite:
    """The plan for one file group within one instant."""

    partition: str
    file_id: str
    new_path: str  # the base file this write creates
    base_path: str | None = None  # the current base file to merge, None for a new file group
    base_instant: str | None = None
    merge: bool = True  # False: append (insert), True: incoming rows replace rows of the same key

    @classmethod
    def create(
        cls, partition: str, file_id: str, instant: str, token: str, base: BaseFile | None, merge: bool
    ) -> FileGroupWrite:
        name = BaseFile.file_name(file_id, token, instant)
        return cls(
            partition=partition,
            file_id=file_id,
            new_path=f"{partition}/{name}" if partition else name,
            base_path=base.path if base else None,
            base_instant=base.instant_time if base else None,
            merge=merge,
        )


class RecentFiles:
    """Base files one writer wrote lately, kept in memory (least recently used go first).

    A writer that upserts small batches into the same file groups again and again would otherwise read
    back the files it has just written. A base file never changes once written (its name carries its
    instant), so a kept copy cannot go stale; one deleted since (an aborted write's) never becomes the
    latest base file of its group, so nobody asks for it.
    """

    def __init__(self, max_bytes: int = 64 * 1024**2) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()
        self._bytes = 0

    def get(self, path: str) -> pa.Table | None:
        table = self._tables.get(path)
        if table is not None:
            self._tables.move_to_end(path)
        return table

    def put(self, path: str, table: pa.Table) -> None:
        if table.nbytes > self.max_bytes // 4 or path in self._tables:
            return
        self._tables[path] = table
        self._bytes += table.nbytes
        while self._bytes > self.max_bytes:
            _, dropped = self._tables.popitem(last=False)
            self._bytes -= dropped.nbytes


def read_base_file(
    storage: Storage, path: str, columns: Sequence[str] | None = None, recent: RecentFiles | None = None
) -> pa.Table:
    kept = recent.get(path) if recent is not None else None
    if kept is not None:
        return kept if columns is None else kept.select(list(columns))
    # ParquetFile, not read_table: one known file needs none of the dataset machinery, which costs more
    # than reading a small file group
    with open_base_file(storage, path) as stream:
        return pq.ParquetFile(stream).read(columns=list(columns) if columns is not None else None)


def count_rows(storage: Storage, path: str, recent: RecentFiles | None = None) -> int:
    """The number of records in a base file (from its footer, or from the kept copy)."""
    kept = recent.get(path) if recent is not None else None
    if kept is not None:
        return kept.num_rows
    with open_base_file(storage, path) as stream:
        return pq.ParquetFile(stream).metadata.num_rows


def write_file_group(
    storage: Storage,
    work: FileGroupWrite,
    instant: str,
    incoming: pa.Table,
    deleted_keys: pa.Array | None = None,
    ordering: Sequence[str] = (),
    compression: str = "snappy",
    task: int = 0,
    recent: RecentFiles | None = None,
    before_write: Callable[[], object] | None = None,
) -> WriteStat:
    """Write ``work.new_path``: the base file's rows, changed by ``incoming`` and ``deleted_keys``.

    ``incoming`` holds the data columns plus ``_hoodie_record_key`` and ``_hoodie_partition_path``.
    When merging, an incoming row replaces the stored row of its key unless the stored row has a larger
    ordering value; rows nobody touched are copied with their original meta columns. ``before_write`` is
    called once the new file is encoded, right before it is written; what it raises stops the write.
    """
    name = work.new_path.rsplit("/", 1)[-1]
    existing = read_base_file(storage, work.base_path, recent=recent) if work.base_path else None
    stamped = _stamp(incoming, instant, name)
    num_updates: int | None = None  # counted below unless the merge knows it
    if existing is None:
        combined = stamped  # in the order given, as Hudi writes inserts (bulk_insert sorts beforehand)
    else:
        stored = existing.append_column(_INCOMING, pa.repeat(False, existing.num_rows))
        fresh_rows = stamped.append_column(_INCOMING, pa.repeat(True, stamped.num_rows))
        if work.merge:
            # only keys that arrive again are contested; the others are copied as they are
            touched_at = _positions(pc.is_in(stored.column(RECORD_KEY), value_set=stamped.column(RECORD_KEY)))
            again = stored.take(touched_at)
            contested = pa.concat_tables([again, fresh_rows], promote_options="permissive")
            winners = latest_positions(contested, contested.column(RECORD_KEY), ordering).to_numpy()
            arriving = fresh_rows.take(winners[winners >= again.num_rows] - again.num_rows)
            # an arriving winner takes the place of its key's first stored row, as Hudi's merge does; a
            # stored row that neither won nor was replaced goes (inserts keep duplicate keys in a file)
            slot = pc.index_in(arriving.column(RECORD_KEY), value_set=again.column(RECORD_KEY))
            kept = np.zeros(again.num_rows, dtype=bool)
            kept[winners[winners < again.num_rows]] = True
            kept[slot.drop_null().to_numpy()] = True
            combined = _placed(stored, arriving, pc.take(touched_at, slot), touched_at[~kept])
            num_updates = len(slot) - slot.null_count
        else:
            combined = pa.concat_tables([stored, fresh_rows], promote_options="permissive")
    deletes = 0
    if deleted_keys is not None and len(deleted_keys):
        doomed = pc.is_in(combined.column(RECORD_KEY), value_set=deleted_keys)
        deletes = pc.sum(pc.and_(doomed, pc.invert(_incoming_mask(combined)))).as_py() or 0
        combined = combined.filter(pc.invert(doomed))
        num_updates = None  # a deleted key may have been an update
    fresh = _incoming_mask(combined)
    num_new = pc.sum(fresh).as_py() or 0
    if num_updates is None:
        existing_keys = existing.column(RECORD_KEY) if existing is not None else pa.array([], pa.string())
        updated = pc.and_(fresh, pc.is_in(combined.column(RECORD_KEY), value_set=existing_keys))
        num_updates = pc.sum(updated).as_py() or 0
    result = _finish(combined, instant, task, name)
    # Encoded in memory and written at once: parquet's many small writes through a Python stream cost
    # more than the encoding itself. Dictionary encoding of the two unique meta columns only costs time
    # before parquet gives up on it.
    encoded = pa.BufferOutputStream()
    dictionary = [c for c in result.column_names if c not in (COMMIT_SEQNO, RECORD_KEY)]
    pq.write_table(result, encoded, compression=compression, use_dictionary=dictionary)
    content = encoded.getvalue()
    if before_write is not None:
        before_write()
    with storage.open_output(work.new_path) as stream:
        stream.write(content)
    if recent is not None:
        recent.put(work.new_path, result)
    size = content.size  # what was written, whole: no need to ask the storage
    return WriteStat(
        file_id=work.file_id,
        path=work.new_path,
        partition_path=work.partition,
        prev_commit=work.base_instant or "null",
        num_writes=result.num_rows,
        num_inserts=num_new - num_updates,
        num_update_writes=num_updates,
        num_deletes=deletes,
        file_size=size,
    )


def _stamp(incoming: pa.Table, instant: str, file_name: str) -> pa.Table:
    """Incoming rows with the meta columns of this write (sequence numbers come at the end)."""
    data = incoming.drop_columns(
        [c for c in (COMMIT_TIME, COMMIT_SEQNO, FILE_NAME) if c in incoming.column_names]
    )
    rows = data.num_rows
    return (
        data.append_column(COMMIT_TIME, pa.repeat(pa.scalar(instant), rows))
        .append_column(COMMIT_SEQNO, pa.nulls(rows, pa.string()))
        .append_column(FILE_NAME, pa.repeat(pa.scalar(file_name), rows))
    )


def _whole(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _incoming_mask(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    if _INCOMING in table.column_names:
        return table.column(_INCOMING)
    return pa.repeat(True, table.num_rows)


def _placed(stored: pa.Table, arriving: pa.Table, at: pa.Array, dropped: np.ndarray) -> pa.Table:
    """``stored`` with ``arriving[i]`` in place of row ``at[i]`` and without the rows at ``dropped``;
    arriving rows whose ``at`` is null (new keys) follow the stored rows, in their order."""
    count = stored.num_rows
    order = np.arange(count, dtype=np.int64)
    valid = pc.is_valid(at)
    order[at.filter(valid).to_numpy()] = count + _positions(valid)
    order = np.concatenate([np.delete(order, dropped), count + _positions(pc.invert(valid))])
    return pa.concat_tables([stored, arriving], promote_options="permissive").take(order)


def _positions(mask: pa.Array) -> np.ndarray:
    return pc.indices_nonzero(mask).to_numpy().astype(np.int64)


def _finish(combined: pa.Table, instant: str, task: int, file_name: str) -> pa.Table:
    """Number the new rows, point every row at its file, put meta columns first."""
    fresh = _incoming_mask(combined)
    # the new rows' positions only: a merge keeps most rows, with their sequence numbers
    positions = pc.cast(pc.indices_nonzero(fresh), pa.string())
    numbers = pc.binary_join_element_wise(f"{instant}_{task}_", positions, "")  # f"{instant}_{task}_{i}"
    seqno = pc.replace_with_mask(_whole(combined.column(COMMIT_SEQNO)), _whole(fresh), numbers)
    table = combined.set_column(combined.schema.get_field_index(COMMIT_SEQNO), COMMIT_SEQNO, seqno)
    table = table.set_column(
        table.schema.get_field_index(FILE_NAME), FILE_NAME, pa.repeat(pa.scalar(file_name), table.num_rows)
    )
    data_columns = [c for c in table.column_names if c not in META_COLUMNS and c != _INCOMING]
    return table.select([*META_COLUMNS, *data_columns])
