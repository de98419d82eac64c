"""Lazy rollback of failed writes (RFC-22: writers never roll back inline).

For one failed instant ``t`` (pending, its heartbeat older than the tolerance):

1. under the table lock, reload the timeline and judge ``t`` again — still pending, still failed — and
   record a ``<r>.rollback.requested`` plan naming ``t`` and its files. From then on ``t``'s writer can
   no longer publish: it checks for such a plan under the same lock before it does.
2. delete ``t``'s data files (from its ``.inflight`` plan, plus any base file of ``t`` in the partitions
   it planned), its heartbeat, and last its own timeline files — the evidence goes after the garbage, so
   a reader never sees ``t``'s files as "older than the timeline" (archived, hence committed).
3. under the lock, complete ``<r>_<c>.rollback``.

A crash anywhere leaves a pending rollback whose plan says what to finish; :func:`rollback_failed` resumes
it first. Deleting twice is harmless, so every step is idempotent. A live writer is never touched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..timeline.commit_metadata import CommitMetadata
from ..timeline.errors import CorruptTimelineError
from ..timeline.fs_view import BaseFile
from ..timeline.heartbeat import HeartbeatPolicy, heartbeat_path
from ..timeline.instant import Action, Instant, State
from ..timeline.liveness import judge, pending_writers
from ..timeline.locks import TableLock
from ..timeline.markers import delete_markers, marked_files
from ..timeline.service_metadata import RollbackPlan, RollbackResult
from ..timeline.table import Table
from ..timeline.timeline import Timeline
from ..timeline.transaction import own_files

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
        try:
            data = table.storage.read(table.instant_path(pending))
        except FileNotFoundError:
            continue
        if not data:
            continue
        try:
            plan = CommitMetadata.from_bytes(data, table.storage.full_path(table.instant_path(pending)))
        except CorruptTimelineError as exc:
            log.warning(
                "unreadable plan of failed instant %s (%s); deleting no data files for it", target, exc
            )
            continue
        files.update(own_files(plan, target.requested_time))
        for partition in {s.partition_path for s in plan.write_stats}:
            for info in table.storage.list(partition):
                base = BaseFile.parse(info)
                if base is not None and base.instant_time == target.requested_time:
                    files.add(info.path)
    # writers that cannot plan their files up front (the Spark data source) leave markers instead
    files.update(marked_files(table.storage, target.requested_time))
    return tuple(sorted(files))


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
        plan = RollbackPlan(current.requested_time, current.action.value, planned_files(table, current))
        return table.claim_instant(timeline, Action.ROLLBACK, int(now * 1000), plan.to_bytes())


def _finish(table: Table, lock: TableLock, rollback: Instant, now: float) -> RolledBack:
    """Carry out a recorded rollback plan and complete the rollback instant."""
    started = time.monotonic()
    plan = table.rollback_plan(rollback)
    for path in plan.files:
        table.storage.delete(path)
    delete_markers(table.storage, plan.target)
    table.storage.delete(heartbeat_path(plan.target))
    action = Action(plan.target_action)
    for state in (State.INFLIGHT, State.REQUESTED):  # the evidence last
        table.storage.delete(table.instant_path(Instant(plan.target, action, state)))
    result = RollbackResult(
        rollback.requested_time, int((time.monotonic() - started) * 1000), plan.target, plan.files
    )
    with lock:
        timeline = table.timeline()
        done = rollback.transition(
            State.COMPLETED, table.completion_time(timeline, rollback.requested_time, int(now * 1000))
        )
        table.storage.create_if_absent(table.instant_path(done), result.to_bytes())
    log.info("rolled back %s: deleted %d files", plan.target, len(plan.files))
    return RolledBack(done, plan.target, plan.files)


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
    done = [_finish(table, lock, r, now) for r in timeline.pending().filter(actions=[Action.ROLLBACK])]
    for pending in pending_writers(table, timeline, policy, now):
        if pending.failed:
            rollback = _start(table, lock, pending.instant, policy, now)
            if rollback is not None:
                done.append(_finish(table, lock, rollback, now))
    return done
