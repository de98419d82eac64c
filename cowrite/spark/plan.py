"""Planning a Spark merge (upsert, delete, insert_overwrite) on the driver: from row counts to file
groups, before any file is written. (Inserts are not planned: :mod:`.append`.)

Executors count rows per (task, partition path, file group) first; from those counts alone the driver
decides every file the write creates — so the ``.inflight`` plan names them all, and a failed write is
cleaned up from the plan — with the shared planning functions:

- records that update or delete go to the file group that holds their key (the index found it);
- new records fill small file groups first, then open new ones of the target size
  (:func:`~cowrite.engine.planning.assign_inserts`, the local engine's rule).

New records of a partition are ranked task by task, in the order each task sees them; a task's
:class:`~.routing.Segments` say which file group each of its ranks goes to, so tasks route records without
talking to each other; every record is *routed*: shuffled to the task that writes its file group.

Routed file groups are told apart by their *route key*, the value of the ``BUCKET`` column. Keys are
picked so that Spark's hash partitioning (``pmod(hash(key), n)``) sends the ``i``-th routed file group
to write task ``i mod n``: file groups are spread evenly, whatever the hash would have done to the numbers
0, 1, ... (``n`` is at most the cluster's cores: every Python task has a fixed cost, so a task writes
several file groups when there are many).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cowrite.engine.file_group import FileGroupWrite
from cowrite.engine.planning import SizingPolicy, assign_inserts, planned_stat
from cowrite.format.commit_metadata import WriteStat
from cowrite.format.fs_view import BaseFile, FileSystemView
from cowrite.spark.dedup import Count
from cowrite.spark.routing import Segments
from cowrite.spark.writing import BucketWrite

_MASK = 0xFFFFFFFF


def _rotate(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _mix_k1(k1: int) -> int:
    return (_rotate((k1 * 0xCC9E2D51) & _MASK, 15) * 0x1B873593) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotate(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK


def spark_hash(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a LongType value (Murmur3 x86 32-bit, seed 42), a signed 32-bit int."""
    unsigned = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(_mix_h1(seed, _mix_k1(unsigned & _MASK)), _mix_k1(unsigned >> 32))
    h1 ^= 8  # the length in bytes
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def route_keys(count: int, tasks: int | None = None) -> list[int]:
    """``count`` distinct longs that ``repartition(tasks, col)`` sends to shuffle partitions
    0, 1, ..., tasks - 1, 0, 1, ... in turn (``tasks`` defaults to ``count``: one each).

    Spark's hash partitioning is ``pmod(hash(col), n)``; a test checks :func:`spark_hash` against Spark.
    """
    tasks = tasks or count
    free: dict[int, list[int]] = {}
    wanted = [i % tasks for i in range(count)]
    need = {p: wanted.count(p) for p in set(wanted)}
    candidate = 0
    while any(len(free.get(p, [])) < n for p, n in need.items()):
        place = spark_hash(candidate) % tasks
        if len(free.setdefault(place, [])) < need.get(place, 0):
            free[place].append(candidate)
        candidate += 1
    return [free[p].pop(0) for p in wanted]


@dataclass
class SparkPlan:
    """Every file group a write creates, and how rows find theirs."""

    buckets: dict[int, BucketWrite] = field(default_factory=dict)  # route key -> file group
    updates: dict[tuple[str, str], int] = field(default_factory=dict)  # (partition, file id) -> route key
    segments: dict[tuple[int, str], Segments] = field(default_factory=dict)  # (task, partition) -> ...
    write_tasks: int = 0  # shuffle partitions that write the file groups

    @property
    def routed(self) -> list[int]:
        return sorted(self.buckets)

    def planned_stats(self) -> list[WriteStat]:
        return [planned_stat(b.write) for _, b in sorted(self.buckets.items(), key=lambda item: item[1].task)]


class _Builder:
    """Numbers file groups in creation order (the write token and sequence numbers use the number)."""

    def __init__(self, instant: str, merge: bool) -> None:
        self.instant = instant
        self.merge = merge
        self.writes: list[FileGroupWrite] = []
        self.index: dict[tuple[str, str], int] = {}

    def add(self, partition: str, file_id: str, base: BaseFile | None) -> int:
        known = self.index.get((partition, file_id))
        if known is not None:
            return known
        number = len(self.writes)
        token = f"{number}-0-1"
        self.writes.append(FileGroupWrite.create(partition, file_id, self.instant, token, base, self.merge))
        self.index[(partition, file_id)] = number
        return number

    def finish(
        self,
        max_tasks: int,
        updates: dict[tuple[str, str], int],
        segments: dict[tuple[int, str], list[tuple[int, int]]],
    ) -> SparkPlan:
        count = len(self.writes)
        tasks = max(1, min(count, max_tasks))
        keys = dict(enumerate(route_keys(count, tasks)))
        return SparkPlan(
            buckets={keys[n]: BucketWrite(w, n) for n, w in enumerate(self.writes)},
            updates={group: keys[n] for group, n in updates.items()},
            segments={
                where: Segments(tuple(end for end, _ in parts), tuple(keys[n] for _, n in parts))
                for where, parts in segments.items()
            },
            write_tasks=tasks if count else 0,
        )


def _inserts_by_partition(counts: Iterable[Count]) -> dict[str, list[tuple[int, int]]]:
    """partition -> [(task, new records)] in task order."""
    found: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for c in counts:
        if c.file_id is None and c.rows:
            found[c.partition][c.task] += c.rows
    return {p: sorted(tasks.items()) for p, tasks in found.items()}


def _slice(ranges: Sequence[tuple[int, int, int]], start: int, stop: int) -> list[tuple[int, int]]:
    """The parts of global ranks [start, stop) that ``ranges`` ((begin, end, bucket)) cover, as
    (local end, bucket) pairs relative to ``start``."""
    parts: list[tuple[int, int]] = []
    for begin, end, number in ranges:
        low, high = max(begin, start), min(end, stop)
        if low < high:
            parts.append((high - start, number))
    return parts


def plan_merge(
    instant: str,
    counts: Iterable[Count],
    view: FileSystemView,
    sizing: SizingPolicy,
    merge: bool,
    max_tasks: int,
) -> SparkPlan:
    """Upsert, delete, insert_overwrite: every touched file group and every new record is routed.

    The same file groups as the local engine's ``plan_buckets``: updates to their file group, new
    records through ``assign_inserts`` over the whole partition (small file groups first).
    """
    counts = list(counts)
    builder = _Builder(instant, merge)
    updates: dict[tuple[str, str], int] = {}
    for partition, file_id in sorted({(c.partition, c.file_id) for c in counts if c.file_id is not None}):
        updates[(partition, file_id)] = builder.add(
            partition, file_id, view.groups[(partition, file_id)].latest
        )
    segments: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for partition, tasks in sorted(_inserts_by_partition(counts).items()):
        total = sum(rows for _, rows in tasks)
        ranges, start = [], 0
        for file_id, base, take in assign_inserts(partition, total, view, sizing):
            ranges.append((start, start + take, builder.add(partition, file_id, base)))
            start += take
        offset = 0
        for task, rows in tasks:
            segments[(task, partition)] = _slice(ranges, offset, offset + rows)
            offset += rows
    return builder.finish(max_tasks, updates, segments)
