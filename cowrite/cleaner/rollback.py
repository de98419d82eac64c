"""Lazy rollback of failed writes (RFC-22: writers never roll back inline).

For one failed instant ``t`` (pending, its heartbeat older than the tolerance):

1. under the table lock, reload the timeline and judge ``t`` again — still pending, still failed — and
   record a ``<r>.rollback.requested`` plan naming ``t`` and its files. From then on ``t``'s writer can
   no longer publish: it checks for such a plan under the same lock before it does.
2. delete ``t``'s data files (from its ``.inflight`` plan, plus any base file of ``t`` in the partitions
   it planned), its heartbeat, and last its own timeline files — the evidence goes after the garbage, so
   a reader never sees ``t``'s files as older than the timeline's start (archived, hence committed).
3. under the lock, complete ``<r>_<c>.rollback``.

A crash anywhere leaves a pending rollback whose plan says what to finish; :func:`rollback_failed` resumes
it first. Deleting twice is harmless, so every step is idempotent. A live writer is never touched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from operator import attrgetter

from cowrite.errors import CorruptTimelineError, InstantGoneError
from cowrite.format import claims
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import BaseFile, own_files
from cowrite.format.instant import Action, Instant, State
from cowrite.format.markers import delete_markers, marked_files
from cowrite.format.service_metadata import RollbackPlan, RollbackResult
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline, left_behind
from cowrite.protocol.heartbeat import HEARTBEAT_DIR, HeartbeatPolicy, heartbeat_path
from cowrite.protocol.liveness import judge, pending_writers
from cowrite.protocol.locks import TableLock
from cowrite.storage.backend import FileInfo, stays_inside

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolledBack:
    rollback: Instant  # the completed rollback instant
    target: str
    deleted: tuple[str, ...]


def planned_files(table: Table, target: Instant) -> tuple[str, ...]:
    """The data files ``target`` may have written: its plan, and its base files in the planned partitions."""
    inflight = Instant(target.requested_time, target.action, State.INFLIGHT)
    requested = Instant(target.requested_time, target.action, State.REQUESTED)
    files: set[str] = set()
    for pending in (inflight, requested):
        if (plan := _plan_of(table, pending)) is None:
            continue
        files.update(own_files(plan, target.requested_time))
        for partition in {s.partition_path for s in plan.write_stats}:
            for info in table.storage.list(partition):
                base = BaseFile.parse(info)
                if base is not None and base.instant_time == target.requested_time:
                    files.add(info.path)
    # Writers that do not plan their files up front (Spark inserts and the data source) leave markers,
    # each made after the claim it writes under. An older marker is another instant's: a commit whose
    # driver died before deleting its markers, archived since, whose time a claim made from a stale
    # view took again and left behind. Its files are committed.
    files.update(marked_files(table.storage, target.requested_time, made_since=_claimed_at(table, target)))
    return tuple(sorted(files))


def _claimed_at(table: Table, target: Instant) -> float | None:
    """When ``target``'s oldest timeline file still there was made (None when none is)."""
    for state in (State.REQUESTED, State.INFLIGHT):
        try:
            return table.storage.stat(
                table.instant_path(Instant(target.requested_time, target.action, state))
            ).modified
        except FileNotFoundError:
            continue
    return None


def _start(
    table: Table, lock: TableLock, target: Instant, policy: HeartbeatPolicy, now: float
) -> Instant | None:
    """Record the rollback plan for ``target`` if it is still failed; None if it is not."""
    with lock:
        timeline = table.timeline()
        current = timeline.get(target.requested_time)
        if current is None or current.is_completed:
            return None
        if not judge(table, current, policy, now).failed:
            log.info("%s is alive again; not rolling it back", current)
            return None
        if _rollback_underway(table, timeline, current) is not None:
            return None  # another cleaner recorded its rollback first; whoever runs ours finishes that one
        # After a completed rollback the instant is back: its writer, paused between its last lease
        # check and writing ``.inflight``, wrote it when it resumed. It is rolled back once more.
        plan = RollbackPlan(current.requested_time, current.action.value, planned_files(table, current))
        return claims.claim_instant(
            table, timeline, Action.ROLLBACK, int(now * 1000), plan.to_bytes(), lock=lock
        )


def _rollback_underway(table: Table, timeline: Timeline, target: Instant) -> Instant | None:
    """The pending rollback instant whose plan names ``target`` (its time and action), if there is one.

    ``timeline`` is the last one listed. It shows one instant per time: a rollback claimed at the time of a
    writer's claim whose withdrawal failed may be hidden behind it, and it is looked at all the same
    (missed, the target would be rolled back twice). The action counts: where two claims share a time,
    the rollback of one, completed, must not hide the rollback of the other underway.
    """
    hidden: dict[str, Instant] = {}
    for instant in Timeline.listed_at_shared_times(table.storage):
        known = hidden.get(instant.requested_time)
        if instant.action is Action.ROLLBACK and (known is None or instant.state > known.state):
            hidden[instant.requested_time] = instant
    for rollback in [*timeline.filter(actions=[Action.ROLLBACK]), *hidden.values()]:
        if rollback.is_completed or rollback.requested_time <= target.requested_time:
            continue
        try:
            plan = table.rollback_plan(rollback)
        except InstantGoneError:  # archived, so completed, or withdrawn unstarted: it holds back nothing
            continue
        except CorruptTimelineError as exc:  # at worst, a second (harmless) rollback of the target
            log.warning("%s; not counting it as a rollback of %s", exc, target)
            continue
        if (plan.target, plan.target_action) == (target.requested_time, target.action.value):
            return rollback
    return None


def _finish(table: Table, lock: TableLock, rollback: Instant, now: float) -> RolledBack | None:
    """Carry out a recorded rollback plan and complete the rollback instant.

    Several cleaners (daemons, ``cowrite rollback``) may carry out one plan at the same time: deleting
    twice is harmless, and only the first completes the instant. None if another one completed it, or
    if the plan is gone since ``rollback`` was listed: archived once completed, or withdrawn by a
    claimant that lost the lock before carrying it out. Either way nothing is left to finish.
    """
    started = time.monotonic()
    try:
        plan = table.rollback_plan(rollback)
    except InstantGoneError as exc:
        log.info("rollback %s is gone (%s); nothing to finish", rollback, exc)
        return None
    deleted: tuple[str, ...] = ()
    target = table.timeline().get(plan.target)
    if target is not None and target.is_completed:
        # Only a damaged or forged plan names a completed instant (a writer never publishes once a
        # rollback names it): deleting would destroy committed data. Complete the rollback as a no-op.
        log.warning("rollback %s names %s, which completed; deleting nothing", rollback, target)
    else:
        deleted = tuple(path for path in plan.files if _own(path, plan.target, rollback))
        for path in deleted:
            table.storage.delete(path)
        delete_markers(table.storage, plan.target)
        table.storage.delete(heartbeat_path(plan.target))
        try:
            action = Action(plan.target_action)
        except ValueError:
            log.warning("rollback %s names action %r; its timeline files stay", rollback, plan.target_action)
        else:
            for state in (State.INFLIGHT, State.REQUESTED):  # the evidence last
                table.storage.delete(table.instant_path(Instant(plan.target, action, state)))
    result = RollbackResult(
        rollback.requested_time, int((time.monotonic() - started) * 1000), plan.target, deleted
    )
    with lock:
        timeline = table.timeline()
        current = timeline.get(rollback.requested_time)
        if current is None or current.is_completed:
            return None  # completed by another cleaner meanwhile: a second completion would be a second
            # completed file (another completion time) for one instant
        done = rollback.transition(
            State.COMPLETED, table.completion_time(timeline, rollback.requested_time, int(now * 1000))
        )
        table.storage.create_if_absent(table.instant_path(done), result.to_bytes())
    log.info("rolled back %s: deleted %d files", plan.target, len(deleted))
    return RolledBack(done, plan.target, deleted)


def _own(path: str, target: str, rollback: Instant) -> bool:
    """Whether ``path`` is a base file ``target`` wrote inside the table: all a plan may delete."""
    base = BaseFile.parse(FileInfo(path, 0, 0.0)) if stays_inside(path) else None
    if base is None or base.instant_time != target:
        log.warning("rollback %s: its plan names %s, not a file of %s; leaving it", rollback, path, target)
        return False
    return True


def collect_heartbeats(
    table: Table, policy: HeartbeatPolicy, now: float | None = None, timeline: Timeline | None = None
) -> list[str]:
    """Delete heartbeats of instants that are not pending any more; return their instant times.

    They are left by a writer killed between publishing and deleting its heartbeat, by a failed delete,
    and by a writer that resumes after its instant was rolled back and records its abort. Only heartbeats
    older than the tolerance go (a live writer renews its own well within it), and only after a timeline
    loaded after the listing confirms the instant is not pending (``timeline`` may save that load when it
    shows nothing to collect).
    """
    now = time.time() if now is None else now
    stale = [info for info in table.storage.list(HEARTBEAT_DIR) if now - info.modified > policy.tolerance]
    if timeline is not None:
        pending = {i.requested_time for i in timeline.pending()}
        stale = [info for info in stale if info.name not in pending]
    if not stale:
        return []
    pending = {i.requested_time for i in table.timeline().pending()}
    deleted = []
    for info in stale:
        if info.name not in pending:
            table.storage.delete(info.path)
            deleted.append(info.name)
    if deleted:
        log.info("deleted heartbeats of instants no longer pending: %s", ", ".join(deleted))
    return deleted


def remove_withdrawn_claims(table: Table) -> list[Instant]:
    """Delete the files of claims withdrawn but left behind, a plan before its claim; return them.

    Two claimants of one time (of two actions) both list after claiming, and the later to list withdraws
    (:func:`~cowrite.format.claims.claim`). A withdrawal that failed, or a claimant killed before it,
    leaves its ``.requested`` file (and a writer's plan, written beside that listing) behind the other
    action's instant, where a timeline (one instant per time) hides them from every rollback;
    :func:`~cowrite.format.timeline.left_behind` tells them apart, since only the claim that stands
    proceeds. Under such a claim only a write that went ahead of its listing wrote anything: the base
    files its ``.requested`` plan names, which go first. A claimant that is only paused lists again,
    misses its file and claims anew. Reads the last listing of the timeline (:meth:`Timeline.load`).
    """
    at_shared: dict[str, list[Instant]] = {}
    for instant in Timeline.listed_at_shared_times(table.storage):
        at_shared.setdefault(instant.requested_time, []).append(instant)
    removed = []
    for instants in at_shared.values():
        behind = left_behind(instants)
        for path in (f for i in behind for f in _written_ahead(table, i)):  # one by one, as a withdrawal
            table.storage.delete(path)
        for instant in sorted(behind, key=attrgetter("state"), reverse=True):
            table.storage.delete(table.instant_path(instant))
            removed.append(instant)
    if removed:
        log.info("removed withdrawn claims: %s", ", ".join(i.file_name for i in removed))
    return removed


def _written_ahead(table: Table, claim: Instant) -> list[str]:
    """The base files a writer's claim may have had written ahead of its listing: those its plan names."""
    writes = claim.action is Action.COMMIT and claim.state is State.REQUESTED
    plan = _plan_of(table, claim) if writes else None
    return own_files(plan, claim.requested_time) if plan is not None else []


def _plan_of(table: Table, pending: Instant) -> CommitMetadata | None:
    """The plan in ``pending``'s file; None where there is none, or it cannot be read (logged: no data file
    is deleted for it)."""
    path = table.instant_path(pending)
    try:
        data = table.storage.read(path)
    except FileNotFoundError:
        return None
    try:
        return CommitMetadata.from_bytes(data, table.storage.full_path(path)) if data else None
    except CorruptTimelineError as exc:
        log.warning("unreadable plan of %s (%s); deleting no data files for it", pending, exc)
        return None


def rollback_failed(
    table: Table,
    lock: TableLock,
    policy: HeartbeatPolicy,
    now: float | None = None,
    timeline: Timeline | None = None,
) -> list[RolledBack]:
    """Finish interrupted rollbacks, then roll back every failed pending write. Returns what was done."""
    now = time.time() if now is None else now
    timeline = timeline if timeline is not None else table.timeline()
    remove_withdrawn_claims(table)
    finished = [_finish(table, lock, r, now) for r in timeline.pending().filter(actions=[Action.ROLLBACK])]
    done = [r for r in finished if r is not None]
    for pending in pending_writers(table, timeline, policy, now):
        if pending.failed:
            rollback = _start(table, lock, pending.instant, policy, now)
            if rollback is not None and (item := _finish(table, lock, rollback, now)) is not None:
                done.append(item)
    collect_heartbeats(table, policy, now)
    return done
