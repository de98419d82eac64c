"""The timeline: an immutable snapshot of a table's instants, and the views readers and writers need.

A loaded :class:`Timeline` holds one :class:`Instant` per requested time, in its latest state. Loading
lists ``.hoodie/timeline/`` once; every view is computed from that snapshot, so a caller that needs to see
newer instants loads again (writers do, under the lock, before they commit).

**Tails.** On an object store a listing costs a request per thousand names, and the server's time and the
client's grow with every name it returns, though a writer needs only the names that changed. So a writer's
look after its claim (:meth:`Timeline.load` with ``tail``) lists only the names after a *start point* and
keeps from the last load those before it. The start point is the older of

- the oldest requested time pending in the last load: an instant's later files (inflight, completed, or
  its removal by a rollback) sort with its requested time, at or after it;
- the newest completed requested time of the load before the last. A claim stands only if the listing its
  claimant made right after it shows no later completed instant (:func:`~cowrite.format.claims.claim`),
  and archival keeps the newest completed instant. A listing is no snapshot: one may miss an instant
  claimed while it ran, and show a later one; but that claim was listed by its claimant after the load
  before had ended, so it sorts after the newest completed instant that load showed.

Below the start point only completed instants remain, and only archival removes those: a tail keeps them
until the next full listing (every :data:`TAILS_BETWEEN_FULL` tails, and after a file a listing showed was
found gone, :meth:`Timeline.forget`). A write that meets such an instant lists again in full
(:meth:`~cowrite.format.fs_view.FileSystemView.build`); everything else loads in full. A name the last load
showed at or after the start point that the tail does not show was removed: by a rollback, or by archival,
which removes the oldest instants first and so every one kept below the start point before it. What the
tail keeps would then start the timeline before the active one, and the files of the instants archived
after that start would count as a failed write's: the load lists in full instead.
"""

from __future__ import annotations

import json
import logging
import weakref
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from itertools import compress
from operator import attrgetter, is_, itemgetter

from cowrite.errors import CorruptTimelineError
from cowrite.format.instant import DATA_ACTIONS, Action, Instant, InvalidInstantError, State, check_time
from cowrite.process import keep_mapping, memo
from cowrite.storage.backend import Storage

log = logging.getLogger(__name__)

TIMELINE_DIR = ".hoodie/timeline"
# Archival moves old instants' timeline files into JSON files here (see cowrite.cleaner.archive).
ARCHIVE_DIR = ".hoodie/.cowrite/archive"
# Tails (see above) between full listings: what keeps archived instants from piling up in a writer's view.
TAILS_BETWEEN_FULL = 32


@dataclass(frozen=True)
class InstantRange:
    """Times ``t`` with ``start < t <= end``; an open side is None."""

    start: str | None = None
    end: str | None = None

    @classmethod
    def all(cls) -> InstantRange:
        return cls()

    @classmethod
    def since(cls, start: str) -> InstantRange:
        """Strictly after ``start`` (a checkpoint already consumed)."""
        return cls(check_time(start), None)

    @classmethod
    def until(cls, end: str) -> InstantRange:
        return cls(None, check_time(end))

    @classmethod
    def within(cls, start: str | None, end: str | None) -> InstantRange:
        return cls(start and check_time(start), end and check_time(end))

    def __contains__(self, time: object) -> bool:
        if not isinstance(time, str):
            return False
        return (self.start is None or time > self.start) and (self.end is None or time <= self.end)


def _keep_latest(latest: dict[str, Instant], instant: Instant, shared: set[str] | None = None) -> None:
    """Keep ``instant`` if it is its time's latest state; note in ``shared`` a time two actions claimed.

    Of two actions' files in one state at one time, the first by name is kept, so that every process
    shows the same one (names arrive in a set's order, which differs from process to process).
    """
    known = latest.get(instant.requested_time)
    if (
        known is None
        or instant.state > known.state
        or (instant.state == known.state and instant.file_name < known.file_name)
    ):
        latest[instant.requested_time] = instant
    if shared is not None and known is not None and known.action is not instant.action:
        shared.add(instant.requested_time)


def left_behind(instants: Iterable[Instant]) -> list[Instant]:
    """Of the instant files at one time, the claims left behind: every file of another action than the
    one completed there, or, while none is, those still requested while another action's instant went on
    (inflight). Only the claim that stands proceeds, so each was withdrawn by a claimant that could not
    delete it, or was killed first (:func:`~cowrite.format.claims.claim`). A writer's plan (``.inflight``)
    is written beside the listing that tells whether its claim stands, so a withdrawn claim may have one:
    only a completed instant then tells which of two inflight ones stood."""
    instants = list(instants)
    went_on = {i.action for i in instants if i.is_completed}
    went_on = went_on or {i.action for i in instants if i.state is not State.REQUESTED}
    return [i for i in instants if went_on and i.action not in went_on]


def _in_order(latest: dict[str, Instant]) -> tuple[Instant, ...]:
    # One instant per time: sorting the times alone orders them, without comparing Instant objects.
    if len(latest) < 2:
        return tuple(latest.values())
    return itemgetter(*sorted(latest))(latest)


# Writers look at timelines of thousands of instants under the table lock: the views below iterate in C.
_requested_time = attrgetter("requested_time")
_completion_time = attrgetter("completion_time")
_is_none = partial(is_, None)
_action = attrgetter("action")


class Timeline:
    """Instants of one table, ordered by requested time."""

    def __init__(self, instants: Iterable[Instant]) -> None:
        latest: dict[str, Instant] = {}
        for instant in instants:
            _keep_latest(latest, instant)
        self._instants = _in_order(latest)

    def adding(self, instants: Iterable[Instant]) -> Timeline:
        """``Timeline([*self, *instants])``, built from this timeline's index rather than from each of its
        instants again: writers add their own claim or the few commits they learnt of to a timeline of
        thousands, several times a commit."""
        latest = dict(self._by_time)
        for instant in instants:
            _keep_latest(latest, instant)
        return Timeline._of_sorted(_in_order(latest))

    @classmethod
    def _of_sorted(cls, instants: Iterable[Instant]) -> Timeline:
        """A timeline of instants already unique and in order (a view of another timeline)."""
        timeline = cls.__new__(cls)
        timeline._instants = tuple(instants)
        return timeline

    @classmethod
    def load(cls, storage: Storage, tail: bool = False) -> Timeline:
        """List the timeline directory. Files that are not instants are skipped with a warning. With
        ``tail``, on an object store, only the names after the start point are listed (*Tails* above):
        what it shows may still hold completed instants archived since the last full listing.

        Writers load the timeline several times per commit, mostly under the table lock, and timeline
        files are only ever added until a rollback or archival removes some: so only names the previous
        load of the same storage did not see are parsed, and a removal starts afresh.
        """
        previous = _loads.get(storage)
        after = previous.start if tail and previous is not None and storage.lists_tails else None
        names = None
        if after is not None and previous is not None and previous.tails < TAILS_BETWEEN_FULL:
            kept = frozenset(name for name in previous.names if name < after)
            listed = frozenset(info.name for info in storage.list_after(TIMELINE_DIR, after))
            if previous.names - kept <= listed:  # else archival may have passed the start point (*Tails*)
                names, tails = kept | listed, previous.tails + 1
        if names is None:
            names, tails = storage.watched_names(TIMELINE_DIR), 0
        if previous is not None and (previous.names is names or previous.names == names):
            if tails != previous.tails:
                _loads[storage] = replace(previous, tails=tails)
            return previous.timeline
        if previous is not None and previous.names <= names:
            latest, shared, new = dict(previous.latest), set(previous.shared), names - previous.names
        else:
            latest, shared, new = {}, set(), names
        for name in new:
            try:
                instant = instant_named(name)
            except InvalidInstantError as exc:
                log.warning("skipping %s/%s/%s: %s", storage.uri, TIMELINE_DIR, name, exc)
                continue
            if instant is not None:
                _keep_latest(latest, instant, shared)
        timeline = cls._of_sorted(_in_order(latest))
        newest = timeline.completed().last
        newest_completed = newest.requested_time if newest is not None else None
        start = _start_point(timeline, previous)  # of the next tail
        _loads[storage] = _Load(names, latest, frozenset(shared), timeline, newest_completed, start, tails)
        return timeline

    @classmethod
    def forget(cls, storage: Storage) -> None:
        """Make the next :meth:`load` of ``storage`` list in full: a file a listing showed is gone."""
        previous = _loads.get(storage)
        if previous is not None:
            _loads[storage] = replace(previous, start=None)

    @classmethod
    def last_listed(cls, storage: Storage) -> Timeline:
        """What :meth:`load` last returned for ``storage`` in this process, without listing (empty if
        nothing was listed yet): a floor for picking a new instant's time, never a view to act on."""
        previous = _loads.get(storage)
        return previous.timeline if previous is not None else cls(())

    @classmethod
    def shared_times(cls, storage: Storage) -> frozenset[str]:
        """The times at which the last :meth:`load` of ``storage`` listed instants of two actions, which a
        timeline (one instant per time) does not show: claimants that picked one time at once."""
        previous = _loads.get(storage)
        return previous.shared if previous is not None else frozenset()

    @classmethod
    def listed_at_shared_times(cls, storage: Storage) -> list[Instant]:
        """Each instant file the last :meth:`load` of ``storage`` listed at a :meth:`shared_times` time,
        in every state listed: where a claim withdrawn by its claimant but not deleted hides."""
        previous = _loads.get(storage)
        if previous is None or not previous.shared:
            return []
        found = []
        for name in previous.names:
            try:
                instant = instant_named(name)
            except InvalidInstantError:  # skipped, with a warning, when it was listed
                continue
            if instant is not None and instant.requested_time in previous.shared:
                found.append(instant)
        return found

    # -- access ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Instant]:
        return iter(self._instants)

    def __len__(self) -> int:
        return len(self._instants)

    def __bool__(self) -> bool:
        return bool(self._instants)

    def __repr__(self) -> str:
        return f"Timeline({', '.join(i.file_name for i in self._instants)})"

    def get(self, requested_time: str) -> Instant | None:
        return self._by_time.get(requested_time)

    @cached_property
    def _by_time(self) -> dict[str, Instant]:
        return dict(zip(self._times, self._instants, strict=True))

    @cached_property
    def _times(self) -> tuple[str, ...]:
        return tuple(map(_requested_time, self._instants))

    @cached_property
    def requested_times(self) -> frozenset[str]:
        return frozenset(self._times)

    @property
    def first(self) -> Instant | None:
        return self._instants[0] if self._instants else None

    @property
    def last(self) -> Instant | None:
        """The instant with the newest requested time."""
        return self._instants[-1] if self._instants else None

    @cached_property
    def first_past_claim(self) -> str | None:
        """The requested time of the oldest instant past its claim (inflight or completed), if any."""
        past_claim = (i for i in self._instants if i.state is not State.REQUESTED)
        return next((i.requested_time for i in past_claim), None)

    # -- views -----------------------------------------------------------------------------------
    def filter(
        self, *, actions: Iterable[Action] | None = None, states: Iterable[State] | None = None
    ) -> Timeline:
        wanted_actions = set(actions) if actions is not None else None
        wanted_states = set(states) if states is not None else None
        return Timeline._of_sorted(
            i
            for i in self._instants
            if (wanted_actions is None or i.action in wanted_actions)
            and (wanted_states is None or i.state in wanted_states)
        )

    def completed(self) -> Timeline:
        return self._completed

    @cached_property
    def _completed(self) -> Timeline:  # asked of every timeline loaded, for its newest completed instant
        return Timeline._of_sorted(compress(self._instants, map(_completion_time, self._instants)))

    def pending(self) -> Timeline:
        return self._pending

    @cached_property
    def _pending(self) -> Timeline:  # looked at under the table lock on every commit
        pending = map(_is_none, map(_completion_time, self._instants))
        return Timeline._of_sorted(compress(self._instants, pending))

    def data_commits(self) -> Timeline:
        """Completed instants that make base files visible (commit, replacecommit)."""
        return self._data_commits

    @cached_property
    def _data_commits(self) -> Timeline:  # asked for several times a commit, under the lock among them
        completed = self._completed._instants
        writes_data = map(DATA_ACTIONS.__contains__, map(_action, completed))  # in C: no property called
        return Timeline._of_sorted(compress(completed, writes_data))

    def after(self, requested_time: str) -> Timeline:
        """The instants requested after ``requested_time`` (found by bisection: often a few of many)."""
        return Timeline._of_sorted(self._instants[bisect_right(self._times, requested_time) :])

    def requested_in(self, window: InstantRange) -> Timeline:
        return Timeline._of_sorted(i for i in self._instants if i.requested_time in window)

    def completed_in(self, window: InstantRange) -> list[Instant]:
        """Completed instants whose completion time is in ``window``, in completion order."""
        return [i for i in self._in_completion_order if i.completion_time in window]

    def in_completion_order(self) -> Sequence[Instant]:
        """The completed instants in completion order."""
        return self._in_completion_order

    @cached_property
    def _in_completion_order(self) -> tuple[Instant, ...]:  # the newest schema is looked for in it each time
        # in requested order, so nearly sorted already
        return tuple(sorted(self._completed._instants, key=_completion_time))

    @cached_property
    def latest_completion_time(self) -> str | None:
        return max(filter(None, map(_completion_time, self._instants)), default=None)

    def completed_since(self, seen: frozenset[str]) -> list[Instant]:
        """Completed instants whose requested time is not in ``seen`` (identity, not clocks)."""
        return [self._by_time[t] for t in sorted(self.completed_times - seen)]

    @cached_property
    def completed_times(self) -> frozenset[str]:
        """Requested times of the completed instants."""
        return frozenset(self._completed._times)


def instant_named(name: str, remember: bool = True) -> Instant | None:
    """The instant an entry of the timeline directory names, or None for an entry that is not an instant
    by design: a checksum (``.crc``) or Hudi's ``history`` archive directory. Raises
    :class:`InvalidInstantError` for any other name. (Listings never show cowrite's own temporary files.)
    ``remember``: as :meth:`Instant.parse` takes it."""
    if name.endswith(".crc") or name == "history":
        return None
    return Instant.parse(name, remember)


@dataclass(frozen=True)
class _Load:
    """What the last :meth:`Timeline.load` of one storage listed, and the instants the names gave."""

    names: frozenset[str]
    latest: dict[str, Instant]  # requested time -> the instant in its latest state
    shared: frozenset[str]  # times listed with two actions
    timeline: Timeline
    newest_completed: str | None  # the requested time of the newest completed instant
    start: str | None  # where the next tail starts (None: it lists in full)
    tails: int  # tails since the last full listing


def _start_point(timeline: Timeline, previous: _Load | None) -> str | None:
    """The start point of the tail after a load of ``timeline`` that came after ``previous`` (*Tails*)."""
    if previous is None or previous.newest_completed is None:
        return None
    oldest_pending = timeline.pending().first
    if oldest_pending is None:
        return previous.newest_completed
    return min(previous.newest_completed, oldest_pending.requested_time)


_loads: weakref.WeakKeyDictionary[Storage, _Load] = weakref.WeakKeyDictionary()
keep_mapping(
    f"{__name__}._loads",
    _loads,
    "the last load of each live Storage (weakly held)",
    "the next load of a timeline parses only the names it had not listed before",
)


def archived(storage: Storage) -> Timeline:
    """The instants archival moved out of the active timeline (from the names of their files)."""
    return Timeline(i for info in storage.list(ARCHIVE_DIR) for i in _archived_in(storage, info.path))


@memo(1024, "archive files are written once and never changed")
def _archived_in(storage: Storage, path: str) -> tuple[Instant, ...]:
    try:
        records = json.loads(storage.read(path))
        return tuple(Instant.parse(record["file"]) for record in records)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CorruptTimelineError(storage.full_path(path), f"not an archive of instants ({exc})") from None
