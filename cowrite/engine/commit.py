"""The one commit path: how every engine's write becomes a completed instant.

The local engine, the Spark engine and the Spark data source all end here, so a rule of the protocol
that applies to every write — that an ingestion which lost to a completed clustering reverts it under
``hoodie.clustering.updates.strategy=allow``, that a write's changes of the table's schema are applied to
another writer's made meanwhile — is applied once, and the engines cannot drift apart.
A write that lost a conflict runs again the same way for all of them (:func:`retry_on_conflict`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from cowrite.engine.clustering import revert_clusterings
from cowrite.engine.contract import rebase
from cowrite.errors import WriteConflictError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.config import Config
from cowrite.format.instant import Action, Instant
from cowrite.format.table import Table
from cowrite.protocol.transaction import Transaction, WriteOptions

log = logging.getLogger(__name__)


def write_instant(
    table: Table,
    operation: str,
    action: Action,
    options: WriteOptions,
    write: Callable[[Transaction], CommitMetadata],
    alongside: Callable[[], object] | None = None,
    draft: Callable[[str], CommitMetadata | None] | None = None,
    write_ahead: Callable[[str], object] | None = None,
) -> Instant:
    """Begin a transaction, let ``write`` write its base files and return their commit metadata, then
    :func:`complete` it.

    Whatever ``write`` raises aborts the transaction (its planned files are deleted, its heartbeat marks
    it failed for the rollback) and propagates; so do :meth:`Transaction.begin`'s and the commit's errors.
    ``alongside``, ``draft`` and ``write_ahead``: requests made beside the claim, the plan drafted beside it
    (or before it, to go ahead) and written beside the listing after it, and the files written ahead of
    that listing (see :meth:`Transaction.begin`).
    """
    transaction = Transaction.begin(table, operation, action, options, alongside, draft, write_ahead)
    try:
        metadata = write(transaction)
    except BaseException as exc:
        transaction.abort(exc)
        raise
    return complete(transaction, metadata)


def complete(transaction: Transaction, metadata: CommitMetadata) -> Instant:
    """Commit ``metadata``, reverting the completed clusterings it lost to where the table lets
    ingestion win (:func:`~cowrite.engine.clustering.revert_clusterings`), and applying its changes of the
    table's schema to another writer's made meanwhile (:func:`~cowrite.engine.contract.rebase`); raises as
    :meth:`Transaction.commit` does, which aborts the transaction on every error but
    :class:`CommitStateUnknownError`."""
    table = transaction.table
    written = {(s.partition_path, s.file_id): s.path for s in metadata.write_stats}
    reverts = revert_clusterings(table, written)
    return transaction.commit(metadata, revert=reverts, rebase=partial(rebase, table))


def retry_on_conflict(config: Config, write: Callable[[], Instant]) -> Instant:
    """Run ``write`` (one whole write, which begins its own instant) and run it again after a write
    conflict, up to ``hoodie.write.num.retries.on.conflict.failures`` times: a retry is a new instant."""
    retries = config.get(keys.RETRIES_ON_CONFLICT)
    for attempt in range(retries):
        try:
            return write()
        except WriteConflictError as exc:
            log.warning("retrying after conflict (%d of %d): %s", attempt + 1, retries, exc)
    return write()
