"""A table's recent timeline as the daemon's page draws it (``GET /api/tables/<name>/recent``).

The timeline alone cannot say what a rollback undid: a rollback deletes its target's instant files, so
only the rollback's plan still names it (time and action). Nor why a writer gave up: the reason is in its
heartbeat until the rollback deletes that too, so the table service remembers what its polls saw.

A request costs what its ``limit`` allows, never the table's history: the last ``limit`` instants of the
timeline the daemon already follows, and one read of each rollback plan among them, the first time it is
asked for (a plan never changes once written, so :class:`RollbackTargets` keeps it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from cowrite.errors import CowriteError
from cowrite.format.instant import Action, Instant, from_millis
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.liveness import PendingInstant

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 60
MAX_LIMIT = 500


class RollbackTargets:
    """The instant each rollback undoes, read from its plan once and kept (the newest ``size`` plans).

    Thread-safe: the HTTP server answers requests in threads of their own.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._known: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()
        self._mutex = threading.Lock()

    def target(self, table: Table, rollback: Instant) -> tuple[str, str] | None:
        """(requested time, action) of the instant ``rollback`` undoes; None when its plan is gone
        (archived since the timeline was listed) or unreadable (logged; readers of the table fail on it
        too, and the daemon's own jobs report it)."""
        key = (table.uri, rollback.requested_time)
        with self._mutex:
            if key in self._known:
                self._known.move_to_end(key)
                return self._known[key]
        try:
            plan = table.rollback_plan(rollback)
        except FileNotFoundError:
            return None
        except CowriteError as exc:
            log.debug("no target for rollback %s of %s: %s", rollback.requested_time, table.uri, exc)
            return None
        with self._mutex:
            self._known[key] = (plan.target, plan.target_action)
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return plan.target, plan.target_action


def parse_limit(raw: str | None) -> int:
    """The ``limit`` query parameter: 1 to :data:`MAX_LIMIT`, :data:`DEFAULT_LIMIT` when absent.
    Raises :class:`CowriteError` (the endpoint answers 400) for anything else."""
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise CowriteError(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {raw!r}")
    return int(raw)


def recent(
    table: Table,
    timeline: Timeline,
    pending: Sequence[PendingInstant],
    abort_reason: Callable[[str], str | None],
    targets: RollbackTargets,
    limit: int = DEFAULT_LIMIT,
    now: float | None = None,
) -> dict[str, Any]:
    """The last ``limit`` instants (by requested time) and the instants their rollbacks undid.

    ``pending`` is the last poll's judgement of pending writers, ``abort_reason`` what the daemon
    remembers of writers that gave up. Shape::

        {"now": time,
         "instants": [{"requested_time", "action", "state", "completion_time",
                       "rollback_of": {"requested_time", "action"} | null,   # rollbacks only
                       "rolled_back_by": time | null,    # a rollback of it has begun
                       "aborted": reason | null,         # "conflict", "lease-lost", ...
                       "writer": {"heartbeat_age_seconds", "idle_seconds", "failed", "stale"} | null}],
         "rolled_back": [{"requested_time", "action", "rolled_back_by", "aborted"}]}

    ``writer`` is set for pending commits and replacecommits: ``failed`` once the daemon judged them so,
    ``stale`` when that is for want of a sign of life (not an abort). ``rolled_back`` holds the targets
    no longer on the timeline, ordered by time.
    """
    now = time.time() if now is None else now
    shown = list(timeline)[-limit:]
    judged = {p.instant.requested_time: p for p in pending}
    undone: dict[str, tuple[str, str]] = {}  # target time -> (rollback time, target action)
    rollback_of: dict[str, tuple[str, str]] = {}
    for instant in shown:
        if instant.action is Action.ROLLBACK and (found := targets.target(table, instant)) is not None:
            rollback_of[instant.requested_time] = found
            undone.setdefault(found[0], (instant.requested_time, found[1]))

    def entry(instant: Instant) -> dict[str, Any]:
        time_ = instant.requested_time
        writer = judged.get(time_)
        target = rollback_of.get(time_)
        return {
            "requested_time": time_,
            "action": instant.action.value,
            "state": instant.state.name,
            "completion_time": instant.completion_time,
            "rollback_of": {"requested_time": target[0], "action": target[1]} if target else None,
            "rolled_back_by": undone[time_][0] if time_ in undone else None,
            "aborted": (writer.aborted if writer else None) or abort_reason(time_),
            "writer": None
            if writer is None
            else {
                "heartbeat_age_seconds": writer.heartbeat_age,
                "idle_seconds": writer.idle,
                "failed": writer.failed,
                "stale": writer.stale,
            },
        }

    return {
        "now": from_millis(int(now * 1000)),
        "instants": [entry(i) for i in shown],
        "rolled_back": [
            {"requested_time": t, "action": action, "rolled_back_by": by, "aborted": abort_reason(t)}
            for t, (by, action) in sorted(undone.items())
            if timeline.get(t) is None
        ],
    }
