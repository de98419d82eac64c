"""Cleaning old file versions: keep what the last N commits need (Hudi's KEEP_LATEST_COMMITS).

With ``E`` the earliest requested time among the last N completed data commits, a base file is removable
when a newer base file of its file group was written at or before ``E`` (no retained commit, and no time
travel to one, can see it), and every file of a file group that a replacecommit requested at or before
``E`` replaced. The latest file of a live file group, files of pending instants, and anything a retained
commit wrote are never touched. Nor is what a pending writer may still read: the newer file, or the
replacecommit, must have completed before every pending instant was claimed (as Hudi keeps the earliest
commit to retain below the earliest pending one).

The plan is recorded in ``<t>.clean.requested`` before deleting, so a crashed clean is finished by the
next run; deleting only superseded files never makes garbage visible to a reader.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from cowrite.errors import InstantGoneError
from cowrite.format import claims
from cowrite.format.fs_view import (
    BaseFile,
    FileSystemView,
    list_base_files,
    replaced_file_groups,
    timeline_start,
)
from cowrite.format.instant import Action, Instant, State
from cowrite.format.service_metadata import CleanPlan, CleanResult
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR, Timeline
from cowrite.protocol.locks import TableLock
from cowrite.storage.backend import FileInfo, stays_inside

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cleaned:
    clean: Instant
    deleted: tuple[str, ...]


def plan_clean(table: Table, timeline: Timeline, commits_retained: int) -> CleanPlan | None:
    """What may be deleted now; None when there is nothing to clean."""
    commits = timeline.data_commits().in_completion_order()
    if len(commits) <= commits_retained:
        return None
    earliest = (
        min(i.requested_time for i in commits[-commits_retained:])
        if commits_retained
        else max(i.requested_time for i in commits)
    )
    completed = {i.requested_time for i in commits}
    start = timeline_start(table, timeline) or ""
    # A pending writer reads the file slices that were latest when it claimed its instant (and may revert
    # a clustering it began before): only what every pending instant saw supersedes or replaces anything.
    seen = seen_by_every_pending(table, timeline)
    settled = {i.requested_time for i in commits if i.requested_time <= earliest and i.requested_time in seen}
    gone = replaced_file_groups(table, [i for i in commits if i.requested_time in settled])

    groups: dict[tuple[str, str], list[BaseFile]] = {}
    for base in list_base_files(table):
        # files of a completed commit, or older than the timeline's start (archived, hence committed)
        if base.instant_time in completed or base.instant_time < start:
            groups.setdefault((base.partition, base.file_id), []).append(base)
    doomed = []
    for key, files in groups.items():
        files.sort(key=lambda b: b.instant_time)
        if key in gone:
            doomed.extend(files)
            continue
        for older, newer in zip(files, files[1:], strict=False):
            if newer.instant_time in settled or newer.instant_time < start:
                doomed.append(older)
    if not doomed:
        return None
    return CleanPlan(earliest, tuple(sorted(b.path for b in doomed)))


def clean(table: Table, lock: TableLock, commits_retained: int, now: float | None = None) -> Cleaned | None:
    """Finish an interrupted clean, or plan and run a new one. Returns what was deleted, or None when
    nothing was cleaned.

    A timeline file that vanishes after the listing (:class:`InstantGoneError`) stops the run with a
    warning and nothing deleted: met while planning, nothing was recorded; met later, the recorded plan
    stays pending and the next run carries it out.
    """
    now = time.time() if now is None else now
    with lock:
        timeline = table.timeline()
        pending = list(timeline.pending().filter(actions=[Action.CLEAN]))
        try:
            plan = table.clean_plan(pending[0]) if pending else plan_clean(table, timeline, commits_retained)
        except InstantGoneError as exc:
            # Under the lock, only when a lease ran out: ours (archival went on meanwhile), or that of a
            # cleaner which then withdrew its claimed plan. The next run starts from a new listing.
            log.warning("the timeline of %s changed while planning a clean (%s); nothing cleaned", table, exc)
            return None
        if plan is None:
            return None
        instant = (
            pending[0]
            if pending
            else claims.claim_instant(
                table, timeline, Action.CLEAN, int(now * 1000), plan.to_bytes(), lock=lock
            )
        )
    started = time.monotonic()
    # A plan only ever names superseded or replaced base files; anything else in it (a damaged or forged
    # plan) is left alone: never a path outside the table, never the file a reader sees in its group.
    try:
        protected = {b.path for b in FileSystemView.build(table).latest_base_files()}
    except InstantGoneError as exc:  # the timeline moved on twice while it was read
        log.warning("clean %s of %s stops (%s); the next run carries out its plan", instant, table, exc)
        return None
    deleted = []
    for path in plan.files:
        if not stays_inside(path) or BaseFile.parse(FileInfo(path, 0, 0.0)) is None or path in protected:
            log.warning("clean %s: its plan names %s, which cleaning never deletes; left", instant, path)
            continue
        table.storage.delete(path)
        deleted.append(path)
    result = CleanResult(
        instant.requested_time,
        int((time.monotonic() - started) * 1000),
        plan.earliest_retained,
        tuple(deleted),
    )
    with lock:
        timeline = table.timeline()
        current = timeline.get(instant.requested_time)
        if current is None or current.is_completed:
            return None  # another cleaner finished this plan meanwhile; it completed the instant
        done = instant.transition(
            State.COMPLETED, table.completion_time(timeline, instant.requested_time, int(now * 1000))
        )
        table.storage.create_if_absent(table.instant_path(done), result.to_bytes())
    log.info("cleaned %s: deleted %d files, retaining from %s", table, len(deleted), plan.earliest_retained)
    return Cleaned(done, tuple(deleted))


def seen_by_every_pending(table: Table, timeline: Timeline) -> frozenset[str]:
    """The completed instants of ``timeline`` that every pending instant saw when it was claimed.

    A pending writer's view and conflict check were built on the timeline listed right after its claim
    (:func:`~cowrite.format.claims.begin_instant`); an instant completed after the claim is news to it.
    The storage's modification times order the two files (one clock for everybody; a tie counts as
    unseen).
    """
    completed = [i for i in timeline if i.is_completed]
    pending = list(timeline.pending())
    if not pending:
        return frozenset(i.requested_time for i in completed)
    modified = {info.name: info.modified for info in table.storage.list(TIMELINE_DIR)}
    oldest_claim = min(
        modified.get(Instant(i.requested_time, i.action, State.REQUESTED).file_name, float("-inf"))
        for i in pending
    )
    return frozenset(
        i.requested_time for i in completed if modified.get(i.file_name, float("inf")) < oldest_claim
    )
