"""The revert of clusterings an ingestion won over (``hoodie.clustering.updates.strategy`` = allow): a
replacecommit that writes the clusterings' input file groups back, published right after the ingestion's
own commit, under the same turn of the table lock (RFC-22's example of priority)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from cowrite.errors import CommitStateUnknownError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.protocol.txn import TXNS_KEY

log = logging.getLogger(__name__)

REVERTED_KEY = "cowrite.reverted.clusterings"


@dataclass(frozen=True)
class Revert:
    """A replacecommit, claimed and written up to inflight, that undoes clusterings."""

    instant: Instant
    plan: CommitMetadata

    def publish(self, table: Table, mine: CommitMetadata, now_millis: int) -> None:
        """Complete it, under the lock, right after ``mine``, the ingestion's commit: it carries forward what
        ``mine`` carries, the map of applications' versions and the schema. Raises
        :class:`CommitStateUnknownError` when its completed file exists already."""
        completion = table.completion_time(table.timeline(), self.instant.requested_time, now_millis)
        done = self.instant.transition(State.COMPLETED, completion)
        extra = {**self.plan.extra, TXNS_KEY: mine.extra[TXNS_KEY]}
        plan = replace(self.plan, schema=mine.schema, extra=extra)
        if not table.storage.create_if_absent(table.instant_path(done), plan.to_bytes(Action.REPLACE_COMMIT)):
            raise CommitStateUnknownError(f"{done} already exists on {table.uri}; reload the timeline")
        log.info("reverted clusterings %s with %s", self.plan.extra.get(REVERTED_KEY), done)
