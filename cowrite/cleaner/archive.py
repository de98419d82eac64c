"""Timeline archival: keep the active timeline short, so opening a table stays fast however old it is.

Once more than ``hoodie.keep.max.commits`` data commits are active, the oldest completed instants are
moved out until ``hoodie.keep.min.commits`` remain: their timeline files are copied into one archive file
under ``.hoodie/.cowrite/archive/`` and then deleted, oldest instant first and, for each instant, its
completed file last — a reader listing meanwhile never sees a committed instant as pending.

Readers treat base files older than the active timeline's start as committed (their evidence was
archived; :func:`~cowrite.format.fs_view.timeline_start`). So archival stops before:

- the oldest pending instant of any kind, and keeps the completed instant right before it: a failed
  write's garbage must be rolled back first, or its files would turn visible once nothing older is left
  on the timeline (on a table that archived instants, claims older than every other instant do not start
  it, so an older completed instant must);
- a replacecommit whose replaced file groups still have files: without it on the timeline, readers
  would see the replaced files again next to their replacement (the cleaner deletes them first);
- an instant that completed after a pending instant was claimed: that writer's conflict check looks only
  at the completed instants it can still see, and would miss it (a lost update);
- the instant holding the latest requested or completion time: new times are taken above those on the
  timeline, and must never repeat or go back;
- an instant whose time another action's files share: a claim withdrawn but left behind hides there
  (:func:`~cowrite.cleaner.rollback.remove_withdrawn_claims` removes it first), and would stay alone,
  a pending instant at the time of an archived one.

A consumer whose checkpoint is older than an archived commit can no longer pull it;
:func:`cowrite.local.read.pull` says so (:class:`~cowrite.errors.CheckpointArchivedError`).
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass

from cowrite.cleaner.clean import seen_by_every_pending
from cowrite.format import config as keys
from cowrite.format.fs_view import list_base_files
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import ARCHIVE_DIR, TIMELINE_DIR, Timeline
from cowrite.protocol.locks import TableLock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Archived:
    path: str  # the archive file written
    instants: tuple[str, ...]  # requested times moved out of the active timeline


def archivable(table: Table, timeline: Timeline, keep_min: int, keep_max: int) -> list[Instant]:
    """The oldest completed instants that may leave the active timeline now, oldest first; ``timeline`` is
    the last one this process listed (:meth:`Timeline.load`)."""
    commits = timeline.data_commits()
    if len(commits) <= keep_max:
        return []
    keep_from = sorted(i.requested_time for i in commits)[-keep_min] if keep_min else "99999999999999999"
    live_groups: set[tuple[str, str]] | None = None
    # A pending writer checks for conflicts only against the completed instants it can still see; one
    # that completed after the writer claimed its instant must stay until the writer is done.
    seen = seen_by_every_pending(table, timeline)
    # New instant and completion times are taken above those on the timeline: the instants holding the
    # latest of each stay, or times could repeat, or go back, after archival.
    latest_requested = max(i.requested_time for i in timeline)
    latest_completion = timeline.latest_completion_time
    shared = Timeline.shared_times(table.storage)  # of the listing ``timeline`` came from
    chosen: list[Instant] = []
    for instant in timeline:
        if not instant.is_completed:
            return chosen[:-1]  # the completed instant before the oldest pending one stays
        if instant.requested_time >= keep_from:
            break
        if instant.requested_time not in seen:
            break
        if instant.requested_time == latest_requested or instant.completion_time == latest_completion:
            break
        if instant.requested_time in shared:
            break
        if instant.action is Action.REPLACE_COMMIT:
            if live_groups is None:
                live_groups = {(b.partition, b.file_id) for b in list_base_files(table)}
            replaced = table.commit_metadata(instant).replaced_file_ids
            if any((p, f) in live_groups for p, ids in replaced.items() for f in ids):
                break
        chosen.append(instant)
    return chosen


def archive(
    table: Table, lock: TableLock, keep_min: int | None = None, keep_max: int | None = None
) -> Archived | None:
    """Archive what :func:`archivable` allows; None when nothing may move."""
    keep_min = table.config.get(keys.KEEP_MIN_COMMITS) if keep_min is None else keep_min
    keep_max = table.config.get(keys.KEEP_MAX_COMMITS) if keep_max is None else keep_max
    if keep_min > keep_max:
        keep_min = keep_max
    with lock:
        timeline = table.timeline()
        chosen = archivable(table, timeline, keep_min, keep_max)
        if not chosen:
            return None
        files = {info.name for info in table.storage.list(TIMELINE_DIR)}
        steps = [[step for step in _states(instant) if step.file_name in files] for instant in chosen]
        try:
            records = [
                {
                    "file": step.file_name,
                    "content": base64.b64encode(table.storage.read(table.instant_path(step))).decode(),
                }
                for states in steps
                for step in states
            ]
        except FileNotFoundError as exc:
            # Only a holder of the lock removes timeline files: ours was expired while we paused, and
            # someone moved the timeline on. Archive nothing now; the next run starts from a new listing.
            log.warning("the timeline of %s changed while archiving (%s); nothing archived", table, exc)
            return None
        path = f"{ARCHIVE_DIR}/{chosen[0].requested_time}_{chosen[-1].requested_time}.json"
        table.storage.write(path, json.dumps(records).encode())
        for states in steps:  # oldest instant first; for each, its completed file last
            for step in states:
                table.storage.delete(table.instant_path(step))
    log.info("archived %d instants of %s into %s", len(chosen), table, path)
    return Archived(path, tuple(i.requested_time for i in chosen))


def _states(instant: Instant) -> list[Instant]:
    """The timeline files of a completed instant, in the order it created them."""
    return [
        Instant(instant.requested_time, instant.action, State.REQUESTED),
        Instant(instant.requested_time, instant.action, State.INFLIGHT),
        instant,
    ]
