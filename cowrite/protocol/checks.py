"""The checks one write makes against its rivals: while it writes (early detection), while it waits for
the lock, and under it (:class:`WriteChecks`, a part of :class:`~.transaction.Transaction`); and the parts
of them a holder makes for a waiter's commit it publishes with its own (:mod:`.group`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cowrite.errors import WriteConflictError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.config import Config
from cowrite.format.instant import Instant
from cowrite.format.table import TABLE_SERVICE_OPERATIONS, Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.conflict import CHECKED, Candidate, Conflict, ConflictStrategy, record_key_overlap
from cowrite.protocol.revert import Revert
from cowrite.protocol.turns import completed_between
from cowrite.protocol.txn import Txn

# (the losing ingestion, the clusterings it lost to, the current timeline) -> the revert, or None
Reverting = Callable[[Any, list[Instant], Timeline], Revert | None]


class _Options(Protocol):
    config: Config
    txn: Txn | None


def pending_plans(table: Table, timeline: Timeline, instant_time: str) -> list[Candidate]:
    """The plans of the table services pending on ``timeline`` (but ``instant_time``'s): they count as
    touching their file groups."""
    return [
        Candidate(instant, plan)
        for instant in timeline.pending()
        if instant.requested_time != instant_time and (plan := table.service_plan(instant)) is not None
    ]


def key_overlap(
    table: Table, instant_time: str, metadata: CommitMetadata, rivals: list[Candidate]
) -> list[Conflict]:
    """The completed ``rivals`` that inserted a record key ``metadata`` inserts (see :mod:`.conflict`)."""
    completed = [c for c in rivals if c.instant.is_completed]
    return record_key_overlap(table, instant_time, metadata, completed)


class WriteChecks:
    """The conflict checks of a write; its :class:`~.transaction.Transaction` provides the state."""

    table: Table
    strategy: ConflictStrategy
    options: _Options
    begin_timeline: Timeline

    @property
    def instant_time(self) -> str:
        raise NotImplementedError

    def _check_early(self, planned: CommitMetadata) -> None:
        """Abort while writing if a commit that completed since begin, or a live writer with an earlier
        instant (which wins by this rule), plans to touch one of our file groups."""
        timeline = self.table.timeline()
        rivals = completed_between(self.table, self.begin_timeline, timeline) + [
            Candidate(i, plan)
            for i in timeline.pending()
            if i.action.writes_data
            and i.requested_time < self.instant_time
            and (plan := self.table.pending_plan(i)) is not None
        ]
        self._raise_first(self.strategy(planned, rivals))

    def _fail_while_waiting(
        self, metadata: CommitMetadata, revert: Reverting | None, published: list[Candidate]
    ) -> None:
        """While this writer waits for the lock, fail on a conflict with a commit the lock's turns
        published since begin, where the check under the lock would fail as well: on any, unless the
        write may revert clusterings it lost to (then on one with any other winner). A write that carries
        an application version is left to the lock: a version already committed is refused there first."""
        if self.options.txn is not None:
            return
        conflicts = self.strategy(metadata, published)
        if revert is not None and self._ingestion_first(metadata):
            conflicts = [c for c in conflicts if not self.table.is_clustering(c.winner)]
        self._raise_first(conflicts)

    def _ingestion_first(self, metadata: CommitMetadata) -> bool:
        """Whether this write wins over clusterings it conflicts with (the table lets ingestion win)."""
        allow = self.options.config.get(keys.CLUSTERING_UPDATES_STRATEGY) == "allow"
        return allow and metadata.operation not in TABLE_SERVICE_OPERATIONS

    def _raise_first(self, conflicts: list[Conflict]) -> None:
        for conflict in conflicts:
            raise WriteConflictError(
                self.table.name, self.instant_time, conflict.winner.requested_time, conflict.describe()
            )

    def _check_conflicts(
        self,
        metadata: CommitMetadata,
        timeline: Timeline,
        revert: Reverting | None,
        completed_since_begin: list[Candidate],
    ) -> Revert | None:
        """Raise on a conflict; return the clustering revert to publish when ingestion wins one."""
        ingestion_first = self._ingestion_first(metadata)
        candidates = list(completed_since_begin)
        if not ingestion_first:  # pending clustering plans count as touched
            candidates += pending_plans(self.table, timeline, self.instant_time)
        conflicts = self.strategy(metadata, candidates)
        undo = None
        if conflicts and revert is not None and ingestion_first:
            winners = [c.winner for c in conflicts]
            if all(w.is_completed and self.table.is_clustering(w) for w in winners):
                undo = revert(self, winners, timeline)
        if undo is None:
            self._raise_first(conflicts)
        if self._checks_keys(metadata):
            for conflict in key_overlap(self.table, self.instant_time, metadata, candidates):
                raise WriteConflictError(
                    self.table.name,
                    self.instant_time,
                    conflict.winner.requested_time,
                    conflict.describe(),
                    what="records with the same keys",
                )
        return undo

    def _checks_keys(self, metadata: CommitMetadata) -> bool:
        """Whether this write must not insert a record key a rival inserted (see :mod:`.conflict`)."""
        return self.options.config.get(keys.CONFLICT_ON_RECORD_KEYS) and metadata.operation in CHECKED
