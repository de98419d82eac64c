"""Planning a write: which file group each incoming row goes to.

Updates and deletes go to the file group that holds their key (found by an index over the latest base
files of the touched partitions). Inserts fill small file groups first, then open new file groups, each
sized to the target file size. Engines share this; the Spark engine runs the index on executors.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.file_group import FileGroupWrite, RecentFiles, count_rows, read_base_file
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.format.commit_metadata import WriteStat
from cowrite.format.fs_view import BaseFile, FileSystemView
from cowrite.storage.backend import Storage

FILE_ID = "__cowrite_file_id"


def new_file_id() -> str:
    return f"{uuid.uuid4()}-0"


def index_keys(
    storage: Storage,
    base_files: Iterable[BaseFile],
    recent: RecentFiles | None = None,
    among: pa.Array | None = None,
) -> pa.Table:
    """(record key, partition, file id) of every record in the given base files, or of those whose key
    is ``among`` the given keys (the lookup costs less than two more columns for every key)."""
    parts = [
        located(base, read_base_file(storage, base.path, [RECORD_KEY], recent).column(RECORD_KEY), among)
        for base in base_files
    ]
    if not parts:
        return pa.table(
            {
                RECORD_KEY: pa.array([], pa.string()),
                PARTITION_PATH: pa.array([], pa.string()),
                FILE_ID: pa.array([], pa.string()),
            }
        )
    return pa.concat_tables(parts)


def located(base: BaseFile, keys: pa.ChunkedArray, among: pa.Array | None = None) -> pa.Table:
    """Index rows of the record keys ``keys`` of ``base`` (those ``among`` the given keys)."""
    if among is not None:
        keys = keys.filter(pc.is_in(keys, value_set=among))
    return pa.table(
        {
            RECORD_KEY: keys,
            PARTITION_PATH: pa.repeat(pa.scalar(base.partition), len(keys)),
            FILE_ID: pa.repeat(pa.scalar(base.file_id), len(keys)),
        }
    )


def tag_locations(incoming: pa.Table, index: pa.Table) -> pa.Table:
    """``incoming`` with a ``FILE_ID`` column: the file group holding each key, null for new keys."""
    # a hash lookup of (partition, key), in the rows' own order: a join would reorder them
    found = pc.index_in(_location(incoming), value_set=_location(index))
    return incoming.append_column(FILE_ID, pc.take(index.column(FILE_ID), found))


def _location(table: pa.Table) -> pa.ChunkedArray:
    """(partition, key) as one string: ``<length of partition>:<partition><key>``, unambiguous whatever
    the two contain."""
    partition, key = (pc.cast(table.column(c), pa.string()) for c in (PARTITION_PATH, RECORD_KEY))
    length = pc.cast(pc.utf8_length(partition), pa.string())
    return pc.binary_join_element_wise(length, ":", partition, key, "")


@dataclass
class SizingPolicy:
    max_file_bytes: int
    small_file_bytes: int
    record_bytes: float  # estimated bytes of one record in a base file

    @property
    def records_per_file(self) -> int:
        return max(1, int(self.max_file_bytes / max(self.record_bytes, 1.0)))


@dataclass
class Bucket:
    """Rows bound for one file group."""

    partition: str
    file_id: str
    base: BaseFile | None
    rows: list[pa.Array] = field(default_factory=list)  # row indices into the incoming table


def assign_inserts(
    partition: str, count: int, view: FileSystemView, sizing: SizingPolicy
) -> list[tuple[str, BaseFile | None, int]]:
    """Split ``count`` new records of ``partition`` into (file id, base file or None, how many)."""
    assignments: list[tuple[str, BaseFile | None, int]] = []
    left = count
    for group in view.in_partition(partition):
        if left <= 0:
            break
        base = group.latest
        if base.size >= sizing.small_file_bytes:
            continue
        room = int((sizing.max_file_bytes - base.size) / max(sizing.record_bytes, 1.0))
        if room > 0:
            take = min(room, left)
            assignments.append((group.file_id, base, take))
            left -= take
    while left > 0:
        take = min(sizing.records_per_file, left)
        assignments.append((new_file_id(), None, take))
        left -= take
    return assignments


def plan_buckets(tagged: pa.Table, view: FileSystemView, sizing: SizingPolicy) -> list[Bucket]:
    """Group rows of ``tagged`` (with ``FILE_ID``) into file groups; new keys go through assign_inserts."""
    buckets: dict[tuple[str, str], Bucket] = {}
    partitions = tagged.column(PARTITION_PATH)
    locations = (
        tagged.column(FILE_ID) if FILE_ID in tagged.column_names else pa.nulls(tagged.num_rows, pa.string())
    )
    known = pc.is_valid(locations)
    for partition in pc.unique(partitions).to_pylist():
        in_partition = pc.equal(partitions, partition)
        updates = pc.indices_nonzero(pc.and_(in_partition, known))
        for file_id in pc.unique(pc.take(locations, updates)).to_pylist():
            rows = pc.filter(updates, pc.equal(pc.take(locations, updates), file_id))
            group = view.groups[(partition, file_id)]
            buckets[(partition, file_id)] = Bucket(partition, file_id, group.latest, [rows])
        inserts = pc.indices_nonzero(pc.and_(in_partition, pc.invert(known)))
        start = 0
        for file_id, base, count in assign_inserts(partition, len(inserts), view, sizing):
            rows = inserts.slice(start, count)
            start += count
            bucket = buckets.setdefault((partition, file_id), Bucket(partition, file_id, base))
            bucket.rows.append(rows)
    return list(buckets.values())


def to_work(bucket: Bucket, instant: str, task: int, merge: bool) -> FileGroupWrite:
    return FileGroupWrite.create(bucket.partition, bucket.file_id, instant, f"{task}-0-1", bucket.base, merge)


def estimate_record_bytes(
    view: FileSystemView,
    storage: Storage,
    incoming: pa.Table,
    partitions: Sequence[str],
    recent: RecentFiles | None = None,
) -> float:
    """Bytes per record in a base file, from the existing files when there are any."""
    for partition in partitions:
        for group in view.in_partition(partition):
            base = group.latest
            if base.size and (rows := count_rows(storage, base.path, recent)):
                return base.size / rows
    # Parquet compresses Arrow's in-memory size by roughly this much on typical tables.
    return max(1.0, incoming.nbytes / max(incoming.num_rows, 1) / 3)


def planned_stat(work: FileGroupWrite) -> WriteStat:
    """The ``.inflight`` plan's entry for a file group about to be written: its new base file, no counts."""
    return WriteStat(work.file_id, work.new_path, work.partition, work.base_instant or "null", 0, 0, 0, 0, 0)
