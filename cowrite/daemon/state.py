"""A table as the daemon knows it: the fold of the events its follower reported.

:meth:`TableState.apply` is the only way the state changes, one event at a time; what the daemon decides
and reports — pending writers and their leases, the lock holder, the fence, what the END_COMMIT_TIME
overlay still lacks, the counters — is read from it. Nothing here touches storage, so a restarted daemon
that replays the events of one full look at the table gets the state back (its counters start afresh,
as Prometheus counters of a new process do).

**What it keeps.** Counts of instants by state, the pending instants, and the newest :data:`RECENT`
instants in full: what decisions and the page need. Older completed instants are all the state keeps of
most of a long timeline, so each is packed into 16 bytes (its times and action) instead of an object
and its dictionaries; :attr:`TableState.timeline` unpacks them when the whole timeline is asked for.

Liveness is the one thing judged rather than folded: a lease is stale once its newest sign of life is
older than the tolerance *now*, and turns live again if the writer renews it, so it is asked of the state
with a time (:meth:`TableState.pending_writers`) instead of being an event that would make the state
depend on when polls happened to run.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from operator import attrgetter

from cowrite.daemon.events import (
    ArchiveRead,
    Change,
    Event,
    HeartbeatGone,
    HeartbeatRenewed,
    HistoryFound,
    InstantChanged,
    LockAcquired,
    LockReleased,
    OverlayAppended,
)
from cowrite.format.instant import Action, Instant, State
from cowrite.format.overlay import CommitEntry
from cowrite.format.timeline import Timeline, left_behind
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.liveness import WRITER_ACTIONS, PendingInstant
from cowrite.protocol.locks import LockHolder

RECENT = 512  # instants kept in full besides the pending ones: the page asks for at most 500


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
        # -- the timeline: one instant per requested time, in its latest state. The recent times, the
        # pending ones and those with several files are held in full; the others are packed in _settled.
        # requested time -> its files, each as the instant it names (keyed by what tells two files apart)
        self._files: dict[str, dict[_FileKey, Instant]] = {}
        self._visible: dict[str, Instant] = {}
        self._settled = _Settled()
        self._settle_above = 2 * RECENT  # held in full beyond this many: pack the older ones
        self._pending: set[str] = set()
        self._signs: dict[str, float] = {}  # pending time -> newest modification of its timeline files
        self._service_plans: set[str] = set()
        self._recent: Timeline | None = None  # built when asked, kept until an instant changes
        self.by_state: Counter[State] = Counter()
        self.latest_completion: str | None = None
        self.newest_completed: str | None = None  # the newest requested time of a completed instant
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
            if len(self._visible) > self._settle_above:
                self._settle()
        elif isinstance(event, HistoryFound):
            self._history(event)
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
        if time not in self._files and (settled := self._settled.get(time)) is not None:
            if event.change is not Change.REMOVED and file == settled and event.entry is None:
                return  # reported again (a full look, an archival that stopped half way): nothing new
            self._settled.pop(time)
            self._files[time] = {_key(settled): settled}  # held in full while it changes
            self._visible[time] = settled
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

    def _history(self, event: HistoryFound) -> None:
        """Pack the instants found at times the state does not know yet, each alone at its time, but the
        newest :data:`RECENT`; fold the others one by one, as :class:`InstantChanged` events."""
        at = Counter(instant.requested_time for instant in event.instants)
        alone: list[Instant] = []
        shared: list[Instant] = []
        for instant in event.instants:
            time = instant.requested_time
            (alone if at[time] == 1 and not self._knows(time) else shared).append(instant)
        alone.sort(key=attrgetter("requested_time"))
        packed, held = alone[:-RECENT], alone[-RECENT:]
        self._settled.add(packed)
        if packed:
            self._recent = None
            self.by_state[State.COMPLETED] += len(packed)
            self.newest_completed = max(packed[-1].requested_time, self.newest_completed or "")
            completion = max(i.completion_time or "" for i in packed)
            self.latest_completion = max(completion, self.latest_completion or "")
            self.unlogged.update((t, e) for i in packed if (e := event.entries.get(t := i.requested_time)))
        for instant in (*held, *shared):
            entry = event.entries.get(instant.requested_time)
            self.apply(InstantChanged(Change.COMPLETED, instant, entry=entry))

    def _knows(self, time: str) -> bool:
        return time in self._files or self._settled.get(time) is not None

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
        self._recent = None
        if before is not None:
            self.by_state[before.state] -= 1
        if after is None:
            del self._files[time]
            del self._visible[time]
        else:
            self._visible[time] = after
            self.by_state[after.state] += 1
            if after.is_completed:
                self.newest_completed = max(time, self.newest_completed or "")
                self.latest_completion = max(after.completion_time or "", self.latest_completion or "")
        if time == self.newest_completed and (after is None or not after.is_completed):
            visible = (t for t, i in self._visible.items() if i.is_completed)
            self.newest_completed = max(max(visible, default=""), self._settled.newest or "") or None
        if after is not None and not after.is_completed:
            self._pending.add(time)
        else:
            self._pending.discard(time)
            self._signs.pop(time, None)
            self._service_plans.discard(time)

    def _settle(self) -> None:
        """Pack the completed instants older than the newest :data:`RECENT` (each alone at its time)."""
        times = sorted(self._visible)
        settled = [
            instant
            for time in times[:-RECENT]
            if time not in self._pending
            and len(self._files[time]) == 1
            and (instant := self._visible[time]).is_completed
        ]
        for instant in settled:
            del self._files[instant.requested_time]
            del self._visible[instant.requested_time]
        self._settled.add(settled)
        self._settle_above = len(self._visible) + RECENT  # those that stay (several files) count once

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
        """The whole timeline: unpacked on each call, and not kept (for a request that asks for it all, and
        for rebuilding the END_COMMIT_TIME log)."""
        return Timeline([*self._settled, *self._visible.values()])

    @property
    def recent_timeline(self) -> Timeline:
        """The newest :data:`RECENT` instants (or more), and every pending one: its last :data:`RECENT`
        instants are exactly the timeline's last ones."""
        if self._recent is None:  # built when asked (the page, every few seconds), kept until a change
            held = sorted(self._visible)
            # Packed instants are older than those held when they were packed, unless rollbacks removed
            # many newer ones since: those among the newest are unpacked for the view.
            floor = held[-RECENT] if len(held) >= RECENT else ""
            self._recent = Timeline([*self._visible.values(), *self._settled.since(floor)])
        return self._recent

    @property
    def held_in_full(self) -> int:
        """How many instants the state holds as objects (the others are packed): at most about twice
        :data:`RECENT`, plus the pending ones and those sharing a time, whatever the timeline's length."""
        return len(self._visible)

    @property
    def pending_instants(self) -> list[Instant]:
        """Every pending instant (of any action), oldest first."""
        return [self._visible[t] for t in sorted(self._pending)]

    @property
    def claims_left_behind(self) -> bool:
        """Whether a time holds a claim left behind beside another action's instant (see
        :func:`~cowrite.format.timeline.left_behind`): hidden from the timeline, pending to other readers."""
        return any(left_behind(files.values()) for files in self._files.values() if len(files) > 1)

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
_ACTIONS = list(Action)


class _Settled:
    """Completed instants, each alone at its requested time, packed into two arrays sorted by requested
    time: the requested time as an integer (instant times are 17 digits), and the completion time times
    the number of actions plus the action's index. Each change replaces both arrays at once, so the HTTP
    endpoint's threads, which read while a poll folds, see one version or the other."""

    def __init__(self) -> None:
        self._rows: tuple[array[int], array[int]] = (array("Q"), array("Q"))

    def __len__(self) -> int:
        return len(self._rows[0])

    def __iter__(self) -> Iterator[Instant]:
        return iter(self.since(""))

    @property
    def newest(self) -> str | None:
        times = self._rows[0]
        return f"{times[-1]:017d}" if times else None

    def since(self, time: str) -> list[Instant]:
        """The instants packed at ``time`` or later ("": all), unpacked."""
        times, rest = self._rows
        at = bisect_left(times, int(time)) if time else 0
        return [_unpack(t, r) for t, r in zip(times[at:], rest[at:], strict=True)]

    def add(self, instants: Iterable[Instant]) -> None:
        """Pack ``instants`` (completed, at times not packed yet)."""
        rows = sorted(
            (int(i.requested_time), int(i.completion_time or 0) * len(_ACTIONS) + _ACTIONS.index(i.action))
            for i in instants
        )
        times, rest = array("Q", self._rows[0]), array("Q", self._rows[1])
        if rows and (not times or rows[0][0] > times[-1]):  # all newer than the packed ones: the usual case
            times.extend(time for time, _ in rows)
            rest.extend(row for _, row in rows)
        else:
            for time, row in rows:
                at = bisect_left(times, time)
                times.insert(at, time)
                rest.insert(at, row)
        self._rows = (times, rest)

    def get(self, time: str) -> Instant | None:
        """The instant packed at ``time``, unpacked; None when none is."""
        times, rest = self._rows
        at = bisect_left(times, int(time)) if times else 0
        return _unpack(times[at], rest[at]) if at < len(times) and times[at] == int(time) else None

    def pop(self, time: str) -> None:
        """No longer pack the instant at ``time`` (one is)."""
        times, rest = self._rows
        at = bisect_left(times, int(time))
        self._rows = (times[:at] + times[at + 1 :], rest[:at] + rest[at + 1 :])


def _unpack(time: int, rest: int) -> Instant:
    completion, action = divmod(rest, len(_ACTIONS))
    return Instant(f"{time:017d}", _ACTIONS[action], State.COMPLETED, f"{completion:017d}")


def _key(file: Instant) -> _FileKey:
    """What tells one timeline file of a time from another, cheaper to make than its name."""
    return file.state, file.action, file.completion_time


def _latest_first(instant: Instant) -> tuple[int, str]:
    return -instant.state, instant.file_name


def _completion(entry: CommitEntry) -> str:
    return entry.completion_time
