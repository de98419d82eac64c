"""Routing on executors: updates to their file group, new records to small file groups first and then
to new ones of the target size (the local engine's ``assign_inserts``), and the routes joined back
to the whole rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.planning import FILE_ID
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.spark.errors import NondeterministicInputError
from cowrite.spark.executor import BUCKET, POSITION, TASK, chunks, from_ipc, rows_by, task_id, to_ipc


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
