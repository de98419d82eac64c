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

from .commit_metadata import CommitMetadata
from .errors import ConfigError
from .instant import Instant


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
