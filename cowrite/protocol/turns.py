"""What a writer knows of the timeline once it holds the table lock, without listing it again.

Everything that changes the completed part of the timeline — a commit, a rollback, a clean, an archival —
happens in a turn of the table lock. Where the lock can tell what its turns published
(:meth:`~.locks.base.TableLock.published_since`; the filesystem lock's ids number its turns, and a
writer's turn leaves a note of its completed file), a listing taken before the lock is as good as one
taken under it. A writer notes the lock's turn right before it lists the timeline at begin; at commit it
takes the very next turn with one try (an engine that makes the write's last request itself tries beside
it, :meth:`Turns.take_next`), and when that works nothing completed since begin. Otherwise it
waits for the lock, reading the commits the turns so far noted meanwhile (and failing at once on one it
conflicts with), and once it holds the lock it knows the timeline — the one it began on, with the noted
commits completed — if every turn in between left a usable note. When one did not (a table service's
turn, an expired holder's, a note whose commit cannot be read), the timeline is listed under the lock as
always. On an object store that keeps the lock's critical section to three round trips (``README.md``,
*What a commit costs*). A writer reads only the noted commits whose sketch (:mod:`.sketch`) does not rule
out every check it makes against them; the others are :attr:`Turns.cleared`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from cowrite.errors import CowriteError
from cowrite.format.instant import Instant, InvalidInstantError
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline, instant_named
from cowrite.protocol.conflict import Candidate
from cowrite.protocol.locks import TableLock
from cowrite.protocol.sketch import Clears, Sketch, noted_sketch, parse

log = logging.getLogger(__name__)

# Told the commits a writer's rivals published since its begin; raises to give up (a certain conflict).
Conflicts = Callable[[list[Candidate]], None]


class Turns:
    """One writer's view of the lock's turns, from its begin (:meth:`note`) to its commit (:meth:`take`)."""

    def __init__(self, table: Table, lock: TableLock) -> None:
        self.table = table
        self.lock = lock
        self.noted: int | None = None  # the last turn of the lock before the begin timeline was listed
        self._begun = Timeline(())
        self._check: Conflicts | None = None
        self._checked: set[str] = set()  # times of the commits ``_check`` was told of: each only once
        self._clears: Clears | None = None
        self.cleared: frozenset[str] = frozenset()  # times of the noted commits their sketches ruled out
        self._next: bool | None = None  # whether :meth:`take_next` took the lock (None: not asked)

    def note(self) -> None:
        """Note the lock's last turn; call right before the begin timeline is listed. A failure only
        costs the commit a listing under the lock."""
        try:
            self.noted = self.lock.turn()
        except CowriteError as exc:
            log.info("could not note the lock's turn of %s: %s", self.table, exc)

    def take_next(self) -> None:
        """Try once, ahead of :meth:`take`, for the turn right after the noted one; :meth:`take` then
        neither tries for it again nor, when this took it, waits. Raises what the lock's ``acquire_next``
        raises."""
        if self._next is None:  # tried ahead of the listing after the claim: not asked for again
            self._next = self.lock.acquire_next(self.noted)

    def give_back(self) -> None:
        """Release, unused, the turn :meth:`take_next` took (for a claim withdrawn since)."""
        took, self._next = self._next, None
        if took:
            self.lock.release()

    def take(
        self, begun: Timeline, check: Conflicts | None = None, clears: Clears | None = None
    ) -> Timeline | None:
        """Take the lock; return the timeline as it is under it — ``begun``, listed after the note, with
        what the turns since published — when the lock can tell, else None (list it under the lock).
        Raises what the lock's ``acquire`` raises.

        ``check`` is told, while the writer waits for another holder, the data commits the turns so far
        published that completed since ``begun``, each once; what it raises ends the wait (a conflict the
        check under the lock would find all the same). Noted commits whose sketch ``clears`` are neither
        read nor told; they make up :attr:`cleared`."""
        self._clears, self.cleared = clears, frozenset()
        tried, self._next = self._next, None
        if not (self.lock.acquire_next(self.noted) if tried is None else tried):
            self._begun, self._check, self._checked = begun, check, set()
            self.lock.on_published = self._read_published
            self.lock.acquire()
        published = self.lock.published_since(self.noted)
        if published is None:
            return None
        instants = [noted_instant(name) for name in published]
        completed = [i for i in instants if i is not None]
        if len(completed) < len(instants):
            return None
        cleared = {
            i.requested_time for i, noted in zip(completed, published, strict=True) if self._ruled_out(noted)
        }
        try:
            self.table.commit_metadata_of(
                [i for i in completed if i.action.writes_data and i.requested_time not in cleared]
            )
        except CowriteError as exc:
            log.info("listing the timeline under the lock: a noted commit cannot be read (%s)", exc)
            return None
        self.cleared = frozenset(cleared)
        return begun.adding(completed)

    def clear_listed(self, commits: list[Instant]) -> None:
        """Where the timeline was listed under the lock (:meth:`take` returned None): of the ``commits``
        it shows completed since the begin, those a note this process's lock listings showed sketches,
        and the sketch rules out, make up :attr:`cleared`."""
        if self._clears is not None:
            sketches = ((i, noted_sketch(self.table.storage, i)) for i in commits)
            self.cleared = frozenset(i.requested_time for i, s in sketches if s and self._clears(s))

    def _ruled_out(self, noted: str) -> bool:
        """Whether the sketch in the note ``noted`` rules out every check of its commit."""
        sketch: Sketch | None = parse(noted)[1]
        return self._clears is not None and sketch is not None and self._clears(sketch)

    def _read_published(self, notes: Mapping[int, tuple[str, ...]], waiting: bool) -> None:
        """Before this writer holds the lock: read the commits the turns since the note published (reads
        are kept), so that once it holds the lock it has them at hand; while ``waiting`` for another
        holder, also check them for a conflict. Raises only what that check raises."""
        if self.noted is None:
            return
        after = self.noted
        instants = [
            i
            for lock_id, names in notes.items()
            if lock_id > after
            for name in names
            if (i := noted_instant(name)) and not self._ruled_out(name)
        ]
        written = [i for i in instants if i.action.writes_data]
        try:
            metadata = self.table.commit_metadata_of(written)
        except CowriteError:  # (archived, or a failed read) read again under the lock, or the timeline listed
            return
        if waiting and self._check is not None:
            seen = self._begun.completed_times | self._checked
            published = zip(written, metadata, strict=True)
            fresh = [Candidate(i, m) for i, m in published if i.requested_time not in seen]
            if fresh:
                self._check(fresh)
                self._checked.update(c.instant.requested_time for c in fresh)


def noted_instant(noted: str) -> Instant | None:
    """The completed instant a lock's note names; None for any other name."""
    try:
        instant = instant_named(parse(noted)[0])
    except InvalidInstantError:
        return None
    return instant if instant is not None and instant.is_completed else None


def completed_between(
    table: Table, begun: Timeline, timeline: Timeline, cleared: frozenset[str] = frozenset()
) -> list[Candidate]:
    """The data commits ``timeline`` shows completed since ``begun``, but for ``cleared`` ones, with their
    metadata (read at once: concurrently on an object store)."""
    completed = [
        i
        for i in timeline.completed_since(begun.completed_times)
        if i.action.writes_data and i.requested_time not in cleared
    ]
    return [Candidate(i, m) for i, m in zip(completed, table.commit_metadata_of(completed), strict=True)]
