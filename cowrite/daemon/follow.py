"""Following a table: what storage shows, turned into events (:mod:`cowrite.daemon.events`).

**The timeline.** Each look reports the instant files that appeared or vanished since the last one. On
local disk the storage keeps the directory's listing current from the kernel's change events
(:meth:`~cowrite.storage.backend.Storage.watched_names`): a look with nothing new is one comparison of
identity. Object stores have no events, and a listing of the whole timeline costs a request per
thousand instants; so a look lists only the names after a *start point*
(:meth:`~cowrite.storage.backend.Storage.list_after`, one request for the tail), which is the older of

- the oldest pending instant's requested time: its next files (inflight, completed, or its removal by a
  rollback) sort with its requested time, at or after it;
- the newest completed instant's requested time known *two* looks ago. A claim stands only if the listing
  its claimant made right after it shows no later completed instant
  (:func:`~cowrite.format.claims.claim`), and archival keeps the newest completed instant, so a new
  instant sorts after every instant that had completed when it was claimed. A listing is no snapshot,
  though: one may miss an instant claimed while it ran, and show a later one; the instant it missed sorts
  after every completed instant the look before it knew, so starting there finds it on the next look.

Below the start point only completed instants remain, and only archival removes those: the follower
learns of it from the archive itself (:meth:`TimelineFollower.look_archive`, new archive files only). A
full look (:meth:`TimelineFollower.look` with ``full``, on the cleaner's schedule) reconciles anything
else — a claim withdrawn by a claimant that died before deleting it, a file deleted by hand.

**Locks and heartbeats** are a listing each, made by the service only when they can matter
(:class:`~cowrite.daemon.service.TableService`); every lock file and heartbeat payload is read once, when
it first appears, and a heartbeat again only when its size changes (an aborting writer rewrites it with
its reason).

Not thread-safe: one poller per table.
"""

from __future__ import annotations

import json
import logging
import time
from bisect import bisect_right, insort
from collections.abc import Collection, Iterable
from dataclasses import dataclass

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
)
from cowrite.daemon.state import TableState
from cowrite.errors import CorruptTimelineError, CowriteError, InstantGoneError
from cowrite.format.instant import Action, Instant, InvalidInstantError, State
from cowrite.format.overlay import CommitEntry
from cowrite.format.table import Table
from cowrite.format.timeline import ARCHIVE_DIR, TIMELINE_DIR, instant_named
from cowrite.protocol.heartbeat import HEARTBEAT_DIR, abort_reason
from cowrite.protocol.locks.holders import holder_or_unknown
from cowrite.protocol.locks.lock_files import (
    LOCK_DIR,
    LockFiles,
    files_listed,
    files_named,
    parse_lock_file,
    read_release,
)
from cowrite.storage.backend import FileInfo, LocalStorage

log = logging.getLogger(__name__)

_INSERTS = 64  # new names a look inserts one by one into the sorted list of known names; more: sorted anew
_CHANGES = {
    State.REQUESTED: Change.REQUESTED,
    State.INFLIGHT: Change.INFLIGHT,
    State.COMPLETED: Change.COMPLETED,
}


@dataclass(frozen=True)
class LockLook:
    events: list[Event]
    files: LockFiles  # the lock directory as listed: what garbage collection works from


class TimelineFollower:
    """Looks at one table's storage and reports what changed, as events for a :class:`TableState`."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.storage = table.storage
        # Local disk keeps listings current from the kernel's events: comparing whole listings costs
        # nothing there, and reconciles by itself.
        self._kept = isinstance(self.storage, LocalStorage)
        # Local disk: the kept listing last compared (the storage's own object, no copy), and the names in
        # it not reported (archived before they were read, or reported removed by the archive while still
        # listed). What was reported is the one minus the other: the follower keeps no names of its own.
        self._listed: frozenset[str] | None = None
        self._unreported: set[str] = set()
        self._compare = False  # compare the next listing even if it is the same object
        # Object stores: the names reported at or after the last start point, sorted, and as a set.
        self._known: list[str] = []
        self._known_set: set[str] = set()
        self._newest_completed_when_last_look_began: str | None = None  # two looks ago, on the next look
        self.full_look_due = True
        self.archive_due = True  # a commit may have been archived without the follower seeing it
        self._lock_names: frozenset[str] | None = None
        self._beats: dict[str, tuple[float, int]] = {}  # instant -> (modification time, size)

    @property
    def names_held(self) -> int:
        """How many timeline names the follower keeps itself: on local disk only those listed and not
        reported (the storage keeps the listing), on object stores those after its last start point."""
        return len(self._unreported) + len(self._known_set)

    # -- the timeline ----------------------------------------------------------------------------
    def look(self, state: TableState, full: bool = False) -> list[InstantChanged | HistoryFound]:
        """The instant files that appeared or vanished since the last look. On the first (the state is
        not following yet) the completed instants come as one :class:`HistoryFound`, first.

        Every completed data commit the overlay lacks is parsed here: one no reader can parse raises
        :class:`CorruptTimelineError`, and the look reports nothing (the next one tries again). One
        archived between the listing and its read is left out, and the archive is looked at next.
        """
        infos: dict[str, FileInfo] | None = None
        listed: frozenset[str] | None = None
        if self._kept:
            listed = self.storage.watched_names(TIMELINE_DIR)
            if listed is self._listed and not self._compare:  # the same object until the directory changes
                return []
            previous = self._listed or frozenset()
            created = set(listed - previous) | (self._unreported & listed)
            removed = set(previous - listed) - self._unreported
        else:
            floor = self._newest_completed_when_last_look_began
            points = [t for t in (floor, state.oldest_pending) if t is not None]
            after = "" if full or self.full_look_due or floor is None else min(points)
            infos = {info.name: info for info in self.storage.list_after(TIMELINE_DIR, after)}
            known = self._known[bisect_right(self._known, after) :] if after else self._known
            created = set(infos.keys() - self._known_set)
            removed = {name for name in known if name not in infos}
            if not after:  # below the start points the follower keeps no names: the state knows those
                removed |= {i.file_name for i in state.timeline if i.file_name not in infos}
        events, history, gone = self._appeared(state, sorted(created), infos)  # may raise: nothing changes
        self._listed, self._compare = listed, False
        self.full_look_due = False
        self._newest_completed_when_last_look_began = state.newest_completed  # (before this look's events)
        for name in sorted(removed):
            file = _instant(name)
            if file is not None:
                events.append(InstantChanged(Change.REMOVED, file))
                if file.is_completed:
                    self.archive_due = True  # only archival removes a completed instant
        if self._kept:
            self._unreported = gone
        else:
            self._forget(removed)
            self._remember(name for name in created if name not in gone)
            self._forget_below(after)
        # Completions in the order they happened: the state counts a completion as new only when it is
        # later than every one it knew (an archival that stopped half way may show old ones again).
        events.sort(key=_completion_order)
        return ([history] if history else []) + events

    def _appeared(
        self, state: TableState, names: list[str], infos: dict[str, FileInfo] | None
    ) -> tuple[list[InstantChanged], HistoryFound | None, set[str]]:
        # An instant that appears completed needs no events for its earlier files: the state shows the
        # latest, and the first look at a long timeline would otherwise parse and fold three files each.
        earlier = _earlier_files(names)
        files = [(n, file) for n in names if n not in earlier and (file := _instant(n, self.table.uri))]
        logged = state.logged.watermark if state.logged else None
        commits = [
            file
            for _, file in files
            if file.is_completed
            and file.action.writes_data
            and (logged is None or (file.completion_time or "") > logged)
            and file.requested_time not in state.unlogged
        ]
        entries, gone = self._entries(commits)
        done = {(f.requested_time, f.action) for name, f in files if f.is_completed and name not in gone}
        shown = {(time, action.value) for time, action in done}
        if again := [name for name, key in earlier.items() if key not in shown]:
            # their completed file was archived before it was read, or is no instant's: report them as
            # they are listed
            files = sorted([*files, *((n, f) for n in again if (f := _instant(n, self.table.uri)))])
        events, history = [], []
        for name, file in files:
            if name in gone or (not file.is_completed and (file.requested_time, file.action) in done):
                continue
            if file.is_completed and not state.following:
                history.append(file)
                continue
            info = infos.get(name) if infos is not None else None
            events.append(
                InstantChanged(
                    _CHANGES[file.state],
                    file,
                    modified=self._modified(name, file, info),
                    entry=entries.get(file.requested_time) if file.is_completed else None,
                    service_plan=self._plans_a_service(file, info),
                )
            )
        return events, HistoryFound(tuple(history), entries) if history else None, gone

    def _entries(self, commits: list[Instant]) -> tuple[dict[str, CommitEntry], set[str]]:
        """What the overlay needs of each of ``commits`` (read concurrently on object stores), and the
        names of those archived before they could be read."""
        try:
            read = zip(commits, self.table.commit_metadata_of(commits), strict=True)
            return {i.requested_time: CommitEntry.from_metadata(i, m) for i, m in read}, set()
        except InstantGoneError:
            pass
        entries, gone = {}, set()
        for commit in commits:  # the ones read already come from the cache
            try:
                entries[commit.requested_time] = CommitEntry.of(self.table, commit)
            except InstantGoneError as exc:
                log.info("%s was archived before it was read (%s); looking at the archive", commit, exc)
                gone.add(commit.file_name)
                self.archive_due = True
        return entries, gone

    def _modified(self, name: str, file: Instant, info: FileInfo | None) -> float | None:
        """When a pending instant's file was written: its writer's first signs of life."""
        if file.is_completed:
            return None
        if info is not None:
            return info.modified
        try:  # local disk: a system call, no request
            return self.storage.stat(f"{TIMELINE_DIR}/{name}").modified
        except FileNotFoundError:  # removed already: the next look reports it
            return None

    def _plans_a_service(self, file: Instant, info: FileInfo | None) -> bool:
        if file.state is not State.REQUESTED or file.action is not Action.REPLACE_COMMIT:
            return False
        if info is not None and info.size == 0:  # writers leave their claims empty: nothing to read
            return False
        return self.table.service_plan(file) is not None

    def _remember(self, names: Iterable[str]) -> None:
        new = [name for name in names if name not in self._known_set]
        self._known_set.update(new)
        if len(new) > _INSERTS:  # the first looks: one sort, not thousands of inserts into a long list
            self._known = sorted(self._known_set)
        else:
            for name in new:
                insort(self._known, name)

    def _forget_below(self, start: str) -> None:
        """Forget the names listed before ``start``, the start point of a look: later looks start there
        or after, as their start points move forward. One that starts before (an instant claimed below the
        oldest pending one) reports the names between again, and the state knows them already."""
        below = bisect_right(self._known, start) if start else 0
        if below:
            self._known_set.difference_update(self._known[:below])
            del self._known[:below]

    def _forget(self, names: Collection[str]) -> None:
        if names:
            self._known_set.difference_update(names)
            self._known = [name for name in self._known if name not in names]

    # -- the archive -----------------------------------------------------------------------------
    def look_archive(self, state: TableState) -> list[Event]:
        """The instants of archive files written since the last one reported (archive files are named by
        their first and last instant, and each archival run moves out instants after the last run's)."""
        self.archive_due = False
        events: list[Event] = []
        for info in self.storage.list_after(ARCHIVE_DIR, state.archive_seen or ""):
            instants = _archived_in(self.storage.read(info.path), self.storage.full_path(info.path))
            for instant in instants:
                events.append(InstantChanged(Change.REMOVED, instant, archived=True))
            names = {i.file_name for i in instants}
            if self._kept:
                self._unreported |= names & (self._listed or frozenset())
            else:
                self._forget(names & self._known_set)
            events.append(ArchiveRead(info.name))
        self._compare = True  # what was reported removed may still be listed (an archival stopped half way)
        return events

    # -- locks and heartbeats --------------------------------------------------------------------
    def look_locks(self, state: TableState) -> LockLook:
        """The lock files that appeared since the last look. Files of older locks found by the first look
        are history: only the current lock's holder is read then."""
        infos: dict[str, FileInfo] | None = None
        if self._kept:
            names = self.storage.watched_names(LOCK_DIR)
            files = files_named(names)
            if names is self._lock_names:
                return LockLook([], files)
        else:
            listed_at = time.monotonic()
            infos = {info.name: info for info in self.storage.list(LOCK_DIR)}
            names = frozenset(infos)
            files = files_listed(self.storage, list(infos.values()), listed_at)
        new = sorted(
            (parsed, name)
            for name in names - (self._lock_names or frozenset())
            if (parsed := parse_lock_file(name)) is not None
        )
        highest = max((lock_id for (lock_id, _), _ in new), default=0)
        events: list[Event] = []
        for (lock_id, released), name in new:
            if not state.following and lock_id < highest:
                continue
            info = infos.get(name) if infos is not None else None
            try:
                if not released:
                    holder = holder_or_unknown(self.storage, lock_id)
                    events.append(LockAcquired(lock_id, holder, info.modified if info else None))
                elif not name.endswith(".released") or (info is not None and info.size == 0):
                    # a holder's own release, a note or an empty .released file
                    events.append(LockReleased(lock_id, expired=False))
                else:
                    reason = read_release(self.storage, lock_id).get("reason")
                    events.append(LockReleased(lock_id, expired=reason == "expired"))
            except FileNotFoundError:  # collected since the listing: not the current lock
                continue
            except CowriteError as exc:  # an unreadable release reads as released
                log.warning("lock file %s of %s: %s", name, self.table.uri, exc)
                events.append(LockReleased(lock_id, expired=False))
        self._lock_names = names
        return LockLook(events, files)

    def look_heartbeats(self, state: TableState, writers: Collection[str]) -> list[Event]:
        """Heartbeats renewed or gone since the last look. The payload of a pending writer's heartbeat
        (``writers``) is read when it first appears and when its size changes: a renewal rewrites the same
        payload, an aborting writer adds its reason."""
        current = {info.name: info for info in self.storage.list(HEARTBEAT_DIR)}
        events: list[Event] = []
        for name, info in sorted(current.items()):
            known = self._beats.get(name)
            if known == (info.modified, info.size):
                continue
            aborted = None
            if name in writers and (known is None or known[1] != info.size):
                aborted = abort_reason(self.storage, name)
            events.append(HeartbeatRenewed(name, info.modified, aborted))
        for name in sorted(self._beats.keys() - current.keys()):
            events.append(HeartbeatGone(name))
        self._beats = {name: (info.modified, info.size) for name, info in current.items()}
        return events


def _earlier_files(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """The requested and inflight files among ``names`` whose instant's completed file is among them too,
    each with that instant's (requested time, action). Told from the names' shape
    (:attr:`~cowrite.format.instant.Instant.file_name`) without parsing them; the caller parses those
    whose completed file turns out not to count."""
    completed, pending = set(), {}
    for name in names:
        times, _, suffix = name.partition(".")
        requested, underscore, _ = times.partition("_")
        if underscore:
            completed.add((requested, suffix))  # "<requested>_<completed>.<action>"
        elif suffix == "inflight":
            pending[name] = (requested, "commit")  # "<requested>.inflight": a commit's
        else:
            action, _, state = suffix.partition(".")
            if state in ("requested", "inflight"):
                pending[name] = (requested, action)
    return {name: key for name, key in pending.items() if key in completed}


def _completion_order(event: InstantChanged) -> tuple[str, str]:
    return event.file.completion_time or "", event.file.file_name


def _instant(name: str, uri: str | None = None) -> Instant | None:
    """The instant a timeline name names; None (a warning when ``uri`` is given) for other names."""
    try:
        return instant_named(name, remember=False)  # the follower sees each name once
    except InvalidInstantError as exc:
        if uri is not None:
            log.warning("skipping %s in the timeline of %s: %s", name, uri, exc)
        return None


def _archived_in(data: bytes, path: str) -> list[Instant]:
    """The timeline files an archive file holds (see :mod:`cowrite.cleaner.archive`)."""
    try:
        return [Instant.parse(record["file"]) for record in json.loads(data)]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CorruptTimelineError(path, f"not an archive of instants ({exc})") from None
