"""Readers as Arrow tables: snapshot, time travel and incremental.

- :func:`snapshot` reads the latest visible base file of every file group (``as_of`` a requested instant
  time for time travel: only commits requested at or before it count).
- :func:`incremental` returns the records written by commits whose *completion* time lies in
  ``(since, until]`` — the order in which commits became visible, which is what a consumer that
  checkpoints must follow when several writers interleave. File groups come from the commits' write stats;
  of each, the newest base file written in the range is read, keeping the rows those commits wrote.
- :func:`pull` is that for a consumer: rows since a checkpoint plus the next checkpoint, by completion
  time, through the daemon's END_COMMIT_TIME overlay, or fenced by the oldest pending write.
- :func:`watermark` is how far a reader that checkpoints by completion time may read: :func:`pull`'s, and
  the Spark streaming source's (:mod:`cowrite.spark.source`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.file_group import read_base_file
from cowrite.engine.records import COMMIT_TIME, META_COLUMNS
from cowrite.errors import CheckpointArchivedError, CowriteError
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import check_time
from cowrite.format.overlay import CommitEntry, Overlay, entries_of, newest_files, read_since
from cowrite.format.table import Table
from cowrite.format.timeline import InstantRange, Timeline, archived


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})


def _finish(table: pa.Table, with_meta: bool, columns: Sequence[str] | None) -> pa.Table:
    if not with_meta:
        table = table.drop_columns([c for c in META_COLUMNS if c in table.column_names])
    if columns is not None:
        table = table.select(list(columns))
    return table


def _read(table: Table, paths: Iterable[str]) -> list[pa.Table]:
    return [read_base_file(table.storage, path) for path in paths]


def snapshot(
    table: Table,
    as_of: str | None = None,
    columns: Sequence[str] | None = None,
    partitions: Iterable[str] | None = None,
    with_meta: bool = False,
) -> pa.Table:
    """All visible records (as of a requested instant time, for time travel)."""
    if as_of is not None:
        check_time(as_of)
    view = FileSystemView.build(table, as_of=as_of, partitions=partitions)
    return _finish(_concat(_read(table, (b.path for b in view.latest_base_files()))), with_meta, columns)


def incremental(
    table: Table,
    since: str | None = None,
    until: str | None = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
) -> pa.Table:
    """Records written by commits completed in ``(since, until]`` (completion times), as the timeline
    shows them (see :meth:`Table.read_timeline`: a commit archived meanwhile is no longer on it)."""
    entries = table.read_timeline(
        lambda timeline: entries_of(
            table, table.verified(timeline).completed_in(InstantRange.within(since, until))
        )
    )
    return _read_entries(table, entries, columns, with_meta)


def _read_entries(
    table: Table, entries: Sequence[CommitEntry], columns: Sequence[str] | None, with_meta: bool
) -> pa.Table:
    """The rows ``entries`` wrote: of each file group, the newest file among them, filtered by commit."""
    wanted = pa.array(sorted({e.requested_time for e in entries}), pa.string())
    parts = [
        part.filter(pc.is_in(part.column(COMMIT_TIME), value_set=wanted))
        for part in _read(table, newest_files(entries))
    ]
    return _finish(_concat(parts), with_meta, columns)


class PullMode(enum.Enum):
    """How an incremental consumer checkpoints (RFC-22's options for incremental reads)."""

    COMPLETION_TIME = "completion-time"  # option 3: checkpoint = completion time, read from the timeline
    OVERLAY = "overlay"  # option 3 through the daemon's END_COMMIT_TIME overlay file
    FENCE = "fence"  # option 2: checkpoint = requested time, never past the oldest pending write


@dataclass(frozen=True)
class Pull:
    rows: pa.Table
    checkpoint: str | None  # store it; pass it to the next pull
    commits: tuple[str, ...]  # requested times of the commits read


def pull(
    table: Table, checkpoint: str | None, mode: PullMode = PullMode.COMPLETION_TIME, with_meta: bool = False
) -> Pull:
    """Everything committed since ``checkpoint``, and the checkpoint to store for the next pull.

    Every committed record of every commit is returned by exactly one pull, however writers interleave.
    A consumer that fell so far behind that commits after its checkpoint were archived gets
    :class:`CheckpointArchivedError` instead of a pull that silently skips them.
    """
    if mode is PullMode.OVERLAY:
        # Only the daemon's log, and of it only the files that can hold commits completed after the
        # checkpoint: the daemon parsed every commit before it logged it, and the log records how far
        # archival went (read_since refuses an older checkpoint), so neither the timeline nor the archive
        # is read. Rows come from the base files the entries name, as below.
        overlay = read_since(table.storage, checkpoint)
        if overlay is None:
            raise CowriteError(
                f"{table.uri} has no END_COMMIT_TIME overlay yet; is `cowrite daemon` serving it?"
            )
        entries = list(overlay.entries)
        new_checkpoint = watermark(table, overlay) if entries else checkpoint
        rows = _read_entries(table, entries, None, with_meta)
        return Pull(rows, new_checkpoint, tuple(e.requested_time for e in entries))
    elif mode is PullMode.COMPLETION_TIME:
        # Two looks (see watermark): the commits are read from a second listing. A commit archived after
        # that listing was taken is read past (Table.read_timeline): _refuse_if_archived below still sees it.
        until = watermark(table)

        def completed(timeline: Timeline) -> list[CommitEntry]:
            commits = table.verified(timeline).completed_in(InstantRange.within(checkpoint, until))
            return entries_of(table, commits) if until else []

        entries = table.read_timeline(completed)
        new_checkpoint = max((e.completion_time for e in entries), default=checkpoint)
    else:
        # Two looks, as above: an instant claimed after another completed carries the later time, so every
        # instant requested before the newest completed one of the first look was claimed before that look
        # ended, and is in the second. (A pending one may have a claim of an earlier time made after it.)
        newest = table.timeline().completed().last
        cap = newest.requested_time if newest is not None else None

        def ready(timeline: Timeline) -> list[CommitEntry]:
            timeline = table.verified(timeline)
            fence = min((i.requested_time for i in timeline.pending() if i.action.writes_data), default=None)
            commits = [
                i
                for i in timeline.data_commits()
                if (checkpoint is None or i.requested_time > checkpoint)
                and (fence is None or i.requested_time < fence)
                and cap is not None
                and i.requested_time <= cap
            ]
            return entries_of(table, commits)

        entries = table.read_timeline(ready)
        new_checkpoint = max((e.requested_time for e in entries), default=checkpoint)
    _refuse_if_archived(table, checkpoint, mode)
    rows = _read_entries(table, entries, None, with_meta)
    return Pull(rows, new_checkpoint, tuple(e.requested_time for e in entries))


def watermark(table: Table, overlay: Overlay | None = None) -> str | None:
    """The completion time an incremental reader may read up to: every commit completed at or before it
    is on every listing of the timeline begun after this call returned (unless archived meanwhile), and
    every write still pending completes after it. None: nothing has completed yet.

    It is the newest completion time of one look at the timeline: ``overlay``'s (the daemon's look,
    as its log records it), else a listing taken now. The look itself may lack earlier commits — a listing
    taken while commits land can show a later commit without an earlier one — so read the commits from a
    later listing. Completion times are taken under the table lock, each above every earlier one, and
    a commit's completed file exists before the lock is released: a commit that completed before the
    newest one seen is on every later listing, and a pending write, whatever its requested time, gets a
    completion time above the watermark. So no fence is needed, unlike by requested time
    (:attr:`PullMode.FENCE`).
    """
    if overlay is not None:
        return overlay.watermark
    # Data commits only: a clean or a rollback completing would move the watermark past nothing to read.
    return table.timeline().data_commits().latest_completion_time


def _refuse_if_archived(table: Table, checkpoint: str | None, mode: PullMode) -> None:
    """Raise if archival took away a commit this pull would have had to return.

    Called after the timeline or overlay was read: a commit missing from what was read was archived by
    then, so it is in the archive listed now.
    """
    by_completion = mode is not PullMode.FENCE
    missed = sorted(
        i.requested_time
        for i in archived(table.storage).data_commits()
        if checkpoint is None
        or ((i.completion_time or "") if by_completion else i.requested_time) > checkpoint
    )
    if missed:
        shown = ", ".join(missed[:5]) + (f" (+{len(missed) - 5} more)" if len(missed) > 5 else "")
        raise CheckpointArchivedError(
            f"commits after checkpoint {checkpoint} of table {table.name} were archived before this consumer "
            f"pulled them ({shown}): pulling on would skip them. Start over from a snapshot, or keep more "
            "commits on the active timeline (hoodie.keep.min.commits / hoodie.keep.max.commits)"
        )
