"""Which pending instants belong to writers that are gone.

A pending commit or replacecommit is *failed* once its writer recorded that it gave up (an aborted
heartbeat), or once its newest sign of life is older than the heartbeat tolerance (interval x tolerable
misses). The sign of life is its heartbeat file; an instant without one (its writer died before the
first renewal) is judged by its newest timeline file. All ages are measured against the storage's
modification times, so every judge uses the same clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.heartbeat import HeartbeatPolicy, abort_reason, heartbeat_age

WRITER_ACTIONS = (Action.COMMIT, Action.REPLACE_COMMIT)


@dataclass(frozen=True)
class PendingInstant:
    instant: Instant
    heartbeat_age: float | None  # seconds; None when the instant has no heartbeat file
    idle: float  # seconds since its newest sign of life
    failed: bool
    aborted: str | None = None  # the writer's own reason when it gave up

    @property
    def stale(self) -> bool:
        """Failed for want of a sign of life within the tolerance, not by the writer's own abort."""
        return self.failed and self.aborted is None


def judge(
    table: Table, instant: Instant, policy: HeartbeatPolicy, now: float | None = None
) -> PendingInstant:
    now = time.time() if now is None else now
    age = heartbeat_age(table.storage, instant.requested_time, now)
    aborted = abort_reason(table.storage, instant.requested_time) if age is not None else None
    idle = age
    if idle is None:
        ages = []
        for state in (State.REQUESTED, State.INFLIGHT):
            try:
                modified = table.storage.stat(
                    table.instant_path(Instant(instant.requested_time, instant.action, state))
                )
            except FileNotFoundError:
                continue
            ages.append(max(0.0, now - modified.modified))
        idle = min(ages) if ages else 0.0
    return PendingInstant(instant, age, idle, aborted is not None or idle > policy.tolerance, aborted)


def pending_writers(
    table: Table, timeline: Timeline, policy: HeartbeatPolicy, now: float | None = None
) -> list[PendingInstant]:
    """Every pending commit/replacecommit with its liveness.

    A table service's plan that nobody executes yet (a requested replacecommit with a plan) is not a
    write: it has no writer to fail and no files, and waits for its executor however long it takes.
    """
    return [
        judge(table, i, policy, now)
        for i in timeline.pending().filter(actions=WRITER_ACTIONS)
        if not (i.state is State.REQUESTED and table.service_plan(i) is not None)
    ]
