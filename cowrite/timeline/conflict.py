"""Conflict detection: pure functions over (my instant, the instants that completed since I began).

A strategy returns the conflicts it finds; the transaction raises on the first. The default strategy is
file-group overlap: two instants conflict when they wrote or replaced a common file group. Strategies are
pluggable through ``hoodie.write.lock.conflict.resolution.strategy`` (a dotted path to a callable with the
signature of :func:`file_group_overlap`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow.compute as pc
import pyarrow.parquet as pq

from .commit_metadata import CommitMetadata
from .errors import ConfigError
from .fs_view import open_base_file
from .instant import Instant
from .table import Table


@dataclass(frozen=True)
class Candidate:
    """An instant another writer published (or a table service planned) since this writer began."""

    instant: Instant
    metadata: CommitMetadata


@dataclass(frozen=True)
class Conflict:
    winner: Instant
    file_groups: frozenset[tuple[str, str]]  # (partition, file id)

    def describe(self) -> list[str]:
        return [f"{p}/{f}" if p else f for p, f in sorted(self.file_groups)]


ConflictStrategy = Callable[[CommitMetadata, Sequence[Candidate]], list[Conflict]]


def file_group_overlap(mine: CommitMetadata, candidates: Sequence[Candidate]) -> list[Conflict]:
    """Every candidate that touched (wrote or replaced) a file group this write touched."""
    touched = mine.touched_file_groups
    conflicts = []
    for candidate in candidates:
        overlap = touched & candidate.metadata.touched_file_groups
        if overlap:
            conflicts.append(Conflict(candidate.instant, overlap))
    return conflicts


_HUDI_STRATEGY = "org.apache.hudi.client.transaction.SimpleConcurrentFileWritesConflictResolutionStrategy"
_HUDI_NAMES = {"file-group": file_group_overlap, _HUDI_STRATEGY: file_group_overlap}


def strategy_named(name: str) -> ConflictStrategy:
    """The strategy registered as ``name``, or the callable at dotted path ``module:attr``/``module.attr``."""
    if name in _HUDI_NAMES:
        return _HUDI_NAMES[name]
    module_name, _, attribute = name.replace(":", ".").rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"unknown conflict resolution strategy {name!r} ({exc}); use 'file-group' or a dotted path "
            "to a callable(mine, candidates) -> list[Conflict]"
        ) from None
    if not callable(found):
        raise ConfigError(f"conflict resolution strategy {name!r} is not callable")
    return found


def record_key_overlap(
    table: Table, instant_time: str, mine: CommitMetadata, winners: Sequence[Candidate]
) -> list[Conflict]:
    """Winners that wrote a record with a key this write inserted too, in the same partition.

    Concurrent inserts of one new key into different file groups do not overlap by file group, yet
    leave two records with one key. Keys are read from the files only (the ``_hoodie_record_key`` and
    ``_hoodie_commit_time`` columns), and only when there is a winner to compare with.
    """
    if not winners:
        return []
    my_keys = _keys_written(table, mine, instant_time)
    conflicts = []
    for winner in winners:
        theirs = _keys_written(table, winner.metadata, winner.instant.requested_time)
        both = my_keys & theirs
        if both:
            conflicts.append(Conflict(winner.instant, frozenset(both)))
    return conflicts


def _keys_written(table: Table, metadata: CommitMetadata, instant_time: str) -> set[tuple[str, str]]:
    keys: set[tuple[str, str]] = set()
    for stat in metadata.write_stats:
        with open_base_file(table.storage, stat.path) as stream:
            columns = pq.read_table(stream, columns=["_hoodie_record_key", "_hoodie_commit_time"])
        mask = pc.equal(columns.column("_hoodie_commit_time"), instant_time)
        keys.update(
            (stat.partition_path, k) for k in columns.column("_hoodie_record_key").filter(mask).to_pylist()
        )
    return keys
