"""Conflict detection: pure functions over (my instant, the instants that completed since I began).

A strategy returns the conflicts it finds; the transaction raises on the first. The default strategy is
file-group overlap: two instants conflict when they wrote or replaced a common file group. Strategies are
pluggable through ``hoodie.write.lock.conflict.resolution.strategy`` (a dotted path to a callable with the
signature of :func:`file_group_overlap`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import chain

from cowrite.errors import ConfigError
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import open_base_file
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.protocol.key_summary import INSERTED_KEYS, KeySummary
from cowrite.storage.together import together

# Operations that insert keys; upserts and insert_overwrites (CHECKED) must not duplicate one.
INSERTING = frozenset({"insert", "bulk_insert", "upsert", "insert_overwrite"})
CHECKED = frozenset({"upsert", "insert_overwrite"})


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
    """Winners that inserted a record key this write inserted too, into the same partition.

    Concurrent inserts of one new key into different file groups do not overlap by file group, yet
    leave two records with one key. The commits' key summaries (:mod:`.key_summary`) answer without
    reading a file; only where they cannot — a Bloom filter's "maybe", or a winner that recorded none —
    are the keys read from the files (the ``_hoodie_record_key`` of the rows each instant wrote).
    """
    summary = inserted_keys(mine)
    conflicts = []
    my_keys: set[tuple[str, str]] | None = None
    for winner in winners:
        theirs = inserted_keys(winner.metadata)
        if summary is not None and theirs is not None:
            sure, maybe = summary.shared(theirs)
            if not maybe:
                if sure:
                    conflicts.append(Conflict(winner.instant, frozenset(sure)))
                continue
        elif theirs is None and winner.metadata.operation not in INSERTING:
            continue
        if my_keys is None:
            my_keys = _keys_written(table, mine, instant_time)
        both = my_keys & _keys_written(table, winner.metadata, winner.instant.requested_time)
        if both:
            conflicts.append(Conflict(winner.instant, frozenset(both)))
    return conflicts


def inserted_keys(metadata: CommitMetadata) -> KeySummary | None:
    """The summary of the keys a commit inserted, if it recorded one that can be read."""
    text = metadata.extra.get(INSERTED_KEYS)
    return KeySummary.from_json(text) if text else None


def with_inserted_keys(table: Table, metadata: CommitMetadata, instant_time: str) -> CommitMetadata:
    """``metadata`` with the summary of the keys it wrote, read from its files, where an engine did not
    record one (it knows them in memory, this reads them): every key the instant wrote counts as
    inserted, which can only add conflicts that updates of one key cause anyway."""
    if metadata.operation not in INSERTING or INSERTED_KEYS in metadata.extra:
        return metadata
    summary = KeySummary.of(_keys_written(table, metadata, instant_time))
    return replace(metadata, extra={**metadata.extra, INSERTED_KEYS: summary.to_json()})


def _keys_written(table: Table, metadata: CommitMetadata, instant_time: str) -> set[tuple[str, str]]:
    # imported here: the daemon, which reads what commits carry through this module's callers, loads no
    # dataframe engine (only a commit without a summary of its keys is read this way)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    def written(stat: WriteStat) -> list[tuple[str, str]]:
        with open_base_file(table.storage, stat.path) as stream:
            columns = pq.read_table(stream, columns=["_hoodie_record_key", "_hoodie_commit_time"])
        mask = pc.equal(columns.column("_hoodie_commit_time"), instant_time)
        return [
            (stat.partition_path, k) for k in columns.column("_hoodie_record_key").filter(mask).to_pylist()
        ]

    # the files read at once: on an object store, their round trips together
    return set(chain(*together(table.storage, [partial(written, stat) for stat in metadata.write_stats])))
