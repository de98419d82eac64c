"""A table as the daemon knows it: the fold of the events its follower reported.

:meth:`TableState.apply` is the only way the state changes, one event at a time; what the daemon decides
and reports — pending writers and their leases, the lock holder, the fence, what the END_COMMIT_TIME
overlay still lacks, the counters — is read from it. Nothing here touches storage, so a restarted daemon
that replays the events of one full look at the table gets the state back (its counters start afresh,
as Prometheus counters of a new process do).

Liveness is the one thing judged rather than folded: a lease is stale once its newest sign of life is
older than the tolerance *now*, and turns live again if the writer renews it, so it is asked of the state
with a time (:meth:`TableState.pending_writers`) instead of being an event that would make the state
depend on when polls happened to run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from cowrite.daemon.events import (
    ArchiveRead,
    Change,
    Event,
    HeartbeatGone,
    HeartbeatRenewed,
    InstantChanged,
    LockAcquired,
    LockReleased,
    OverlayAppended,
)
from cowrite.format.instant import Action, Instant, State
from cowrite.format.overlay import CommitEntry
from cowrite.format.timeline import Timeline
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.liveness import WRITER_ACTIONS, PendingInstant
from cowrite.protocol.locks import LockHolder


@dataclass(frozen=True)
class CurrentLock:
    """The filesystem lock with the highest id, as the lock directory showed it."""

    lock_id: int
    holder: LockHolder | None  # None when its ``.acquired`` file was not seen (released and collected)
    acquired_at: float | None
    released: bool

    @property
    def held(self) -> bool:
        return not self.released and self.holder is not None


@dataclass(frozen=True)
class Beat:
    at: float  # the heartbeat file's modification time
    aborted: str | None


class TableState:
    """The fold. ``following`` is off while the first look is applied: what it finds is history, so
    commits and lock files it shows are not counted as events."""

    def __init__(self) -> None:
        self.following = False
        # -- the timeline: one instant per requested time, in its latest state
        # requested time -> its files, each as the instant it names (keyed by what tells two files apart)
        self._files: dict[str, dict[_FileKey, Instant]] = {}
        self._visible: dict[str, Instant] = {}
        self._pending: set[str] = set()
        self._signs: dict[str, float] = {}  # pending time -> newest modification of its timeline files
        self._service_plans: set[str] = set()
        self._timeline: Timeline | None = None  # built when asked, kept until an instant changes
        self.by_state: Counter[State] = Counter()
        self.latest_completion: str | None = None
        self.newest: str | None = None  # the newest requested time
        # -- writers, locks
        self.heartbeats: dict[str, Beat] = {}
        self.aborted: dict[str, str] = {}  # instant -> why its writer gave up (kept for the page)
        self.lock: CurrentLock | None = None
        # -- the overlay: what its log holds, and what it lacks
        self.logged: OverlayAppended | None = None  # the newest file of the log
        self.unlogged: dict[str, CommitEntry] = {}  # requested time -> a completed commit not logged yet
        self.archived_through: str | None = None
        self.archive_seen: str | None = None
        # -- counters, exported by the service
        self.counts: Counter[tuple[str, str]] = Counter()
        self.lock_waits: list[float] = []  # seconds, not exported yet

    # -- the fold --------------------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        if isinstance(event, InstantChanged):
            self._instant(event)
        elif isinstance(event, ArchiveRead):
            self.archive_seen = max(event.name, self.archive_seen or "")
        elif isinstance(event, LockAcquired):
            self._acquired(event)
        elif isinstance(event, LockReleased):
            self._released(event)
        elif isinstance(event, HeartbeatRenewed):
            self._renewed(event)
        elif isinstance(event, HeartbeatGone):
            self.heartbeats.pop(event.instant, None)
        else:
            self._logged(event)

    def _instant(self, event: InstantChanged) -> None:
        file = event.file
        time = file.requested_time
        if event.change is Change.REMOVED:
            if event.archived and file.is_completed and file.action.writes_data:
                self.archived_through = max(file.completion_time or "", self.archived_through or "")
            known = self._files.get(time)
            if known is None:  # archived before this daemon saw it
                return
            known.pop(_key(file), None)
            self._show(time, known)
            return
        files = self._files.setdefault(time, {})
        files[_key(file)] = file
        if event.modified is not None and not file.is_completed:
            self._signs[time] = max(event.modified, self._signs.get(time, event.modified))
        if event.service_plan:
            self._service_plans.add(time)
        if event.entry is not None:
            self.unlogged[time] = event.entry
        if (
            file.is_completed
            and self.following
            and (file.completion_time or "") > (self.latest_completion or "")
        ):
            self.counts["commits", file.action.value] += 1  # completion times only grow: a new one
        self._show(time, files)

    def _show(self, time: str, files: dict[_FileKey, Instant]) -> None:
        """Make ``time`` show its latest file (of two in one state, the first by name, as every process
        shows it: see :class:`~cowrite.format.timeline.Timeline`)."""
        before = self._visible.get(time)
        if len(files) < 2:
            after = next(iter(files.values()), None)
        else:
            after = min(files.values(), key=_latest_first)
        if after == before:
            return
        self._timeline = None
        if before is not None:
            self.by_state[before.state] -= 1
        if after is None:
            del self._files[time]
            del self._visible[time]
            if time == self.newest:
                self.newest = max(self._visible, default=None)
        else:
            self._visible[time] = after
            self.by_state[after.state] += 1
            self.newest = max(time, self.newest or "")
            if after.is_completed:
                self.latest_completion = max(after.completion_time or "", self.latest_completion or "")
        if after is not None and not after.is_completed:
            self._pending.add(time)
        else:
            self._pending.discard(time)
            self._signs.pop(time, None)
            self._service_plans.discard(time)

    def _acquired(self, event: LockAcquired) -> None:
        lock = self.lock
        if lock is None or event.lock_id > lock.lock_id:
            self.lock = CurrentLock(event.lock_id, event.holder, event.acquired_at, released=False)
        elif event.lock_id == lock.lock_id:  # its release was reported first
            self.lock = replace(lock, holder=event.holder, acquired_at=event.acquired_at)
        if self.following:
            self.lock_waits.append(event.holder.waited_ms / 1000)

    def _released(self, event: LockReleased) -> None:
        lock = self.lock
        if lock is None or event.lock_id > lock.lock_id:
            self.lock = CurrentLock(event.lock_id, None, None, released=True)
        elif event.lock_id == lock.lock_id:
            self.lock = replace(lock, released=True)
        if event.expired and self.following:
            self.counts["lock_expiries", ""] += 1

    def _renewed(self, event: HeartbeatRenewed) -> None:
        known = self.heartbeats.get(event.instant)
        aborted = event.aborted or (known.aborted if known else None)
        self.heartbeats[event.instant] = Beat(event.at, aborted)
        if aborted and event.instant not in self.aborted:  # counted once per instant, history or not
            self.aborted[event.instant] = aborted
            self.counts["aborted", aborted] += 1
            if aborted == "conflict":
                self.counts["conflicts", ""] += 1

    def _logged(self, event: OverlayAppended) -> None:
        self.logged = replace(event, entries=())
        # The log holds every commit completed up to its watermark (also when this daemon did not see
        # the append through: its answer was lost, and the log was read again).
        mark = event.watermark or ""
        self.unlogged = {t: e for t, e in self.unlogged.items() if e.completion_time > mark}
        if event.archived_through is not None:
            self.archived_through = max(event.archived_through, self.archived_through or "")
        if event.archive_seen is not None:
            self.archive_seen = max(event.archive_seen, self.archive_seen or "")

    # -- what the state says ---------------------------------------------------------------------
    @property
    def timeline(self) -> Timeline:
        if self._timeline is None:  # sorting tens of thousands of instants every poll would dominate it
            self._timeline = Timeline(self._visible.values())
        return self._timeline

    @property
    def pending_instants(self) -> list[Instant]:
        """Every pending instant (of any action), oldest first."""
        return [self._visible[t] for t in sorted(self._pending)]

    @property
    def oldest_pending(self) -> str | None:
        return min(self._pending, default=None)

    @property
    def fence(self) -> str | None:
        """The requested time of the oldest pending data write."""
        writes = (t for t in self._pending if self._visible[t].action.writes_data)
        return min(writes, default=None)

    @property
    def busy(self) -> bool:
        """Whether a write is pending or the lock was held when last looked at: someone may be waiting for
        the lock, and leases count."""
        return bool(self._pending) or (self.lock is not None and self.lock.held)

    def pending_writers(self, policy: HeartbeatPolicy, now: float) -> list[PendingInstant]:
        """Every pending commit and replacecommit with its liveness at ``now`` (see
        :func:`cowrite.protocol.liveness.judge`, which asks storage what this state was told)."""
        found = []
        for time in sorted(self._pending):
            instant = self._visible[time]
            if instant.action not in WRITER_ACTIONS:
                continue
            if instant.state is State.REQUESTED and time in self._service_plans:
                continue  # a table service's plan waiting for its executor: no writer to fail
            beat = self.heartbeats.get(time)
            age = max(0.0, now - beat.at) if beat else None
            aborted = beat.aborted if beat else None
            idle = (
                age if age is not None else max(0.0, now - self._signs[time]) if time in self._signs else 0.0
            )
            found.append(
                PendingInstant(instant, age, idle, aborted is not None or idle > policy.tolerance, aborted)
            )
        return found

    def heartbeat_age(self, instant: str | None, now: float) -> float | None:
        beat = self.heartbeats.get(instant) if instant is not None else None
        return max(0.0, now - beat.at) if beat else None

    def overlay_batch(self, watermark: str | None) -> OverlayAppended | None:
        """What the overlay's log needs appended to reach ``watermark`` (a completion time through which
        every completed commit was reported), None when it holds all that already."""
        logged = self.logged
        mark = max(watermark or "", logged.watermark or "" if logged else "") or None
        entries = tuple(
            sorted(
                (e for e in self.unlogged.values() if mark is not None and e.completion_time <= mark),
                key=_completion,
            )
        )
        batch = OverlayAppended(mark, self.fence, self.archived_through, self.archive_seen, entries)
        if logged is not None and not entries and replace(batch, entries=()) == logged:
            return None
        return batch


_FileKey = tuple[State, Action, str | None]


def _key(file: Instant) -> _FileKey:
    """What tells one timeline file of a time from another, cheaper to make than its name."""
    return file.state, file.action, file.completion_time


def _latest_first(instant: Instant) -> tuple[int, str]:
    return -instant.state, instant.file_name


def _completion(entry: CommitEntry) -> str:
    return entry.completion_time
