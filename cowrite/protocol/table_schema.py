"""The table's schema among concurrent writers.

Every data commit records the table's schema after it (``extraMetadata.schema``), so the newest one's is
the table's; before the first commit, ``hoodie.table.create.schema`` is (:func:`latest_schema`). A write
holds its input to the schema of the timeline it began on, and records that schema evolved by its own
columns. Another writer may have changed the schema meanwhile — added a column, widened one. A commit that
recorded only its own view would take that change back: the table would forget a column its files hold,
and a later input could add the column again with another type, which no reader can merge.

So under the lock a write whose table's schema changed since its begin records (:func:`recorded_schema`),
as Hudi's schema conflict resolution does: the table's new schema, if the write did not change the schema
itself; else its own changes applied to the new schema, as the engines' rules allow (a :data:`Rebase`);
and when they cannot be — two writers added one column with types neither widens to — the write loses,
with a conflict, and commits nothing.

Readers that take the table's schema from the commit of the latest instant time (hudi-rs, for one) would
not see a change made by a commit that completed after a rival of a later instant time. Such a commit is
followed, in the same turn of the lock, by an empty commit of a new instant that records the schema
(:func:`publish_schema`; Hudi's operation ``alter_schema``, as its ``ALTER TABLE`` makes). A writer that
dies or fails between the two leaves the change unseen by those readers until the next commit; the
daemon's cleaning records it (:func:`record_unseen_schema`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cowrite.errors import CommitStateUnknownError, CowriteError, SchemaError, WriteConflictError
from cowrite.format import claims
from cowrite.format import config as keys
from cowrite.format.claims import HeldLock
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.locks import TableLock
from cowrite.protocol.sketch import carried_by
from cowrite.protocol.txn import CommittedTxns

log = logging.getLogger(__name__)

ALTER_SCHEMA = "alter_schema"  # the operation of a commit that only records the table's schema

# (a write's schema, the table's current one) -> the write's changes applied to the current one, or
# SchemaError when they cannot be (the engines' rules: cowrite.engine.contract.rebase).
Rebase = Callable[[str, str], str]


def latest_schema(table: Table, timeline: Timeline) -> str:
    """The Avro schema (JSON) the table had as of ``timeline``; "" for an empty table without one. Reads
    the newest data commit, unless its note names what it carries (:func:`.sketch.carried_by`)."""
    for commit in reversed(timeline.data_commits().in_completion_order()):
        recorded = carried_by(table, commit).schema
        if recorded:
            return recorded
    return table.config.get(keys.TABLE_CREATE_SCHEMA)


def recorded_schema(
    table: Table, instant: str, timeline: Timeline, begun: str, mine: str, rebase: Rebase | None
) -> tuple[str, str]:
    """The schema the write ``instant`` records that began on a table of schema ``begun`` and wrote for
    ``mine``, when the table is at ``timeline`` as it commits; and the table's schema there. Raises
    :class:`WriteConflictError`, naming the newest commit, when both it and another writer changed the
    schema and ``rebase`` cannot apply its changes to the table's (without ``rebase``: always)."""
    current = latest_schema(table, timeline)
    if current == begun or mine == current:
        return mine, current
    if mine == begun:
        return current, current
    try:
        if rebase is None:
            raise SchemaError("both changed it")
        return rebase(mine, current), current
    except SchemaError as exc:
        winner = timeline.data_commits().in_completion_order()[-1].requested_time
        raise WriteConflictError(table.name, instant, winner, [str(exc)], "the table's schema:") from None


def hidden(timeline: Timeline, instant: str, recorded: str, current: str) -> bool:
    """Whether the write ``instant``, recording ``recorded`` on a table of schema ``current`` as it stands
    in ``timeline``, changes the schema where readers that go by instant times would not see it."""
    return recorded != current and bool(timeline.data_commits().after(instant))


def unseen_schema(table: Table, timeline: Timeline) -> str | None:
    """The table's schema as of ``timeline`` when the commit of the latest instant time records another
    (readers that go by instant times miss it), else None. A commit that records none is left alone."""
    latest = timeline.data_commits().last
    if latest is None:
        return None
    recorded, current = table.commit_metadata(latest).schema, latest_schema(table, timeline)
    return current if recorded and current and recorded != current else None


def record_unseen_schema(table: Table, lock: TableLock, now_millis: int) -> Instant | None:
    """Record the table's schema at the latest instant time (:func:`publish_schema`) where readers that go
    by instant times miss it; the commit made, or None when none was needed or it could not be made (a
    failure is logged). Takes the lock only when a listing without it shows the need; raises what taking
    the lock raises."""
    if unseen_schema(table, table.timeline()) is None:
        return None
    with lock:
        timeline = table.timeline()
        schema = unseen_schema(table, timeline)
        if schema is None:  # a writer recorded it meanwhile
            return None
        carries = CommittedTxns.of(table, timeline).extra(None)
        return publish_schema(table, lock, now_millis, schema, carries)


def publish_schema(
    table: Table, lock: HeldLock, now_millis: int, schema: str, extra: dict[str, str]
) -> Instant | None:
    """Complete, under ``lock``, an empty commit of a new instant, the latest, that records ``schema`` and
    ``extra`` (what every data commit carries forward); return it. A failure is only logged (None): the
    commit it follows stands, a claim made is left to the lazy rollback, and the daemon's cleaning or the
    next commit records the schema."""
    try:
        timeline = table.timeline()
        requested = claims.claim_instant(table, timeline, Action.COMMIT, now_millis, lock=lock)
        completion = table.completion_time(timeline, requested.requested_time, now_millis)
        done = requested.transition(State.COMPLETED, completion)
        payload = CommitMetadata(ALTER_SCHEMA, (), schema=schema, extra=extra).to_bytes(Action.COMMIT)
        if not table.storage.create_if_absent(table.instant_path(done), payload):
            raise CommitStateUnknownError(f"{done} already exists")
    except CowriteError as exc:
        log.warning("the schema of %s is recorded at an earlier instant time only: %s", table, exc)
        return None
    table.published(done, payload)
    return done
