"""Deduplication by key on executors, and what each task reports of the keys it kept: counts and
key ranges, which decide where the index is read (:mod:`.tagging`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from cowrite.engine.records import PARTITION_PATH, RECORD_KEY, latest_per_key
from cowrite.spark.executor import POSITION, STAT, TableSpec, carrying, stamp, task_id


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
