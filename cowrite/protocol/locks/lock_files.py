"""The files of the filesystem table lock under ``.hoodie/locks/`` (RFC-22 option 2): their names, what a
listing of them shows, reading and writing them, and collecting old ones; judging a holder is
:mod:`.holders`. The lock itself, taken and released by writers and services, is
:class:`~cowrite.protocol.locks.filesystem.FileSystemLock`.

Files, each created once with create-if-absent and never rewritten:

- ``lock<id>.acquired``: :meth:`LockHolder.to_bytes` of whoever took lock ``id``;
- ``lock<id>.released``: JSON ``{"owner", "reason", "time"}`` — who released it, ``released`` by the holder
  or ``expired`` by someone else, and when (seconds since the epoch);
- ``lock<id>.published.<completed instant file>`` (empty): what the holder of a writer's turn published
  (the name may go on with a sketch of the commit, :mod:`cowrite.protocol.sketch`), created once the
  completed file exists, as the holder's release (:mod:`.releases`); ``lock<id>.published.nothing`` for
  a writer's turn that published nothing (it lost a conflict). A turn without one changed what nobody can
  tell from the lock directory (a table service, an expired holder, a writer that could not tell whether
  its completed file was created): it ends with ``lock<id>.released``. A later holder who saw the
  timeline before some turn, and finds a note for every turn since, knows the timeline's completed part
  without listing it.
- ``lock<id>.published+<n>.<...>`` and ``n`` files ``lock<id>.grouped.<...>`` (empty): a writer's turn that
  published, after its own commit, the commits of ``n`` waiters (group commit,
  :mod:`cowrite.protocol.group`). The first ends the turn as a note does, created once every completed
  file and every other note exists; the others name the waiters' completed files, each begun beside the
  create of the file it names, so one may show before that file exists, or stay behind a create that
  failed: they count only beside the first. A listing that shows the first and fewer than ``n`` grouped
  notes counts the turn as ended but not noted.
- ``lock<id>.queued``: a waiter's place in the queue, on an object store: it means to take lock
  ``id`` once lock ``id - 1`` is released, and others leave that id to it for a while
  (:meth:`~cowrite.protocol.locks.filesystem.FileSystemLock.acquire`). A place decides nobody's turn:
  the lock is still whoever created ``lock<id>.acquired``. It only lets waiters ask when their turn
  has come instead of all asking at every release. It may hold the waiter's commit, for a holder ahead
  of it to publish with its own (:mod:`cowrite.protocol.group`); else it is empty.
- ``lock<id>.serves``: the holder of turn ``id`` stands, once its commit is published, and takes commits
  handed to it over a connection; it holds where (:mod:`.handover`). Collected with the lock's files.

The lock is held by the holder of the highest id while no ``lock<id>.released`` and no note exists for
it. Ids are positive integers compared as numbers and only grow: acquiring means creating
``lock<N+1>.acquired`` when ``lock<N>`` is released. Works on every storage whose ``create_if_absent``
is atomic.

**Collecting old files.** Once the files of lock ``N+1`` are gone, ``lock<N+1>.acquired`` can be created
again by a contender whose listing still shows ``lock<N>`` as the last: a stale view, which the taker's
listing after its create catches (:class:`~cowrite.protocol.locks.filesystem.FileSystemLock`). On an
object store a taker whose listing began less than :data:`FRESH_VIEW` before its create returned skips
that listing, and collectors make that safe: a process deletes only locks that a listing of its own first
showed at least :data:`COLLECTABLE_AGE` earlier, so at least that old. A lock created after a taker's
listing began is then still there when the taker's create reaches the storage, which refuses the create.
A taker's own create of lock ``N`` is as good a view as a listing begun when that create began: no later
lock existed when it succeeded, so a process takes ``N+1`` from its own last turn without listing.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial

from cowrite.errors import CorruptTimelineError, CowriteError
from cowrite.process import keep_mapping, memo
from cowrite.protocol.locks.base import LockHolder
from cowrite.storage.backend import FileInfo, Storage
from cowrite.storage.together import together

log = logging.getLogger(__name__)

LOCK_DIR = ".hoodie/locks"

# Leading zeros are not ours: "lock07" would be a second name for id 7.
_LOCK_FILE = re.compile(r"lock([1-9][0-9]*)\.(acquired|released)")
_NOTE = re.compile(r"lock([1-9][0-9]*)\.published(?:\+([1-9][0-9]*))?\.(.+)")
_GROUPED = re.compile(r"lock([1-9][0-9]*)\.grouped\.(.+)")
_QUEUED = re.compile(r"lock([1-9][0-9]*)\.queued")
_SERVES = re.compile(r"lock([1-9][0-9]*)\.serves")

# Seconds on each process's monotonic clock, on object stores (see the module docstring); the age must be
# at least the fresh view, and more leaves a margin.
FRESH_VIEW = 0.5
COLLECTABLE_AGE = 1.0
_NOTED_KEPT = 256  # notes kept per table: many times the commits a write looks back on

_FIRST_SEEN: dict[str, dict[int, float]] = keep_mapping(
    "cowrite.protocol.locks.lock_files._FIRST_SEEN",
    {},
    "the ids of the last listing of each table's lock directory on an object store",
    "when a listing of this process first showed each lock id (time.monotonic()): on an object store it "
    "collects only locks it has known for COLLECTABLE_AGE",
)


def acquired_path(lock_id: int) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.acquired"


def released_path(lock_id: int) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.released"


NOTHING = "nothing"  # what a note names for a turn that published nothing


def note_path(lock_id: int, published: str | None, grouped: int = 0) -> str:
    counted = f"+{grouped}" if grouped else ""
    return f"{LOCK_DIR}/lock{lock_id}.published{counted}.{published or NOTHING}"


def grouped_path(lock_id: int, published: str) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.grouped.{published}"


def serves_path(lock_id: int) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.serves"


def queued_path(lock_id: int) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.queued"


class ReleaseReason(StrEnum):
    RELEASED = "released"
    EXPIRED = "expired"


@dataclass(frozen=True)
class LockFiles:
    """The ids one listing of ``.hoodie/locks/`` showed; on an object store also when each ``.acquired``
    file was created (storage clock) and when the listing began (``time.monotonic()``): local disk's kept
    listing has names only."""

    acquired: frozenset[int]
    released: frozenset[int]  # by a note or a ``.released`` file
    # the notes of every turn whose notes all show: id -> what it published, its own commit first, then the
    # commits it published for waiters in completion order
    published: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    queued: frozenset[int] = frozenset()  # the ids waiters queued for
    release_files: frozenset[int] = frozenset()  # the ids with a ``.released`` file
    acquired_at: Mapping[int, float] = field(default_factory=dict)
    listed_at: float | None = None
    notes: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # every note's file name, by id
    serving: frozenset[int] = frozenset()  # the ids of turns that stand, taking commits (``.serves``)

    @property
    def highest(self) -> int:
        """The highest id present, 0 when there is none."""
        return max((*self.acquired, *self.released), default=0)

    def is_held(self, lock_id: int) -> bool:
        return lock_id in self.acquired and lock_id not in self.released

    def noting(self, instant: str | None) -> str | None:
        """The note that names ``instant``'s completed file, if one shows."""
        completed = f"{instant}_"
        return next((n for notes in self.published.values() for n in notes if n.startswith(completed)), None)


_LAST_LISTED: dict[str, LockFiles] = keep_mapping(
    "cowrite.protocol.locks.lock_files._LAST_LISTED",
    {},
    "one view per table this process listed the lock directory of, on an object store",
    "the newest listing of each table's lock directory: a writer notes its turn from one still fresh",
)


_NOTED: dict[str, dict[str, str]] = keep_mapping(
    "cowrite.protocol.locks.lock_files._NOTED",
    {},
    f"{_NOTED_KEPT} notes per table this process listed the lock directory of, on an object store",
    "what each note this process's listings showed names, by the requested time of the commit it names",
)


def noted(storage: Storage, requested_time: str) -> str | None:
    """What the note of the commit of ``requested_time`` names, if a listing of this process showed it
    (on an object store): its completed file, then maybe a sketch (:mod:`cowrite.protocol.sketch`)."""
    return _NOTED.get(storage.uri, {}).get(requested_time)


def scan(storage: Storage, fresh_for: float = 0.0) -> LockFiles:
    """What the lock directory shows: a listing, or on an object store the newest listing of this process,
    where it began less than ``fresh_for`` seconds ago. On an object store the listing and the notes it
    shows are kept (a daemon's following, which lists for no lock, keeps nothing)."""
    if not storage.round_trips:
        return files_named(storage.watched_names(LOCK_DIR))
    newest = _LAST_LISTED.get(storage.uri)
    if newest is not None and time.monotonic() - (newest.listed_at or 0.0) < fresh_for:
        return newest
    listed_at = time.monotonic()
    files = files_listed(storage, storage.list(LOCK_DIR), listed_at)
    if (newest := _LAST_LISTED.get(storage.uri)) is None or (newest.listed_at or 0.0) < listed_at:
        _LAST_LISTED[storage.uri] = files
    # a grouped note's sketch tells of the commit it names, the turn noted or not (it is matched by name)
    grouped = (m.group(2) for names in files.notes.values() for n in names if (m := _GROUPED.fullmatch(n)))
    remember_notes(storage.uri, [*(n for names in files.published.values() for n in names), *grouped])
    return files


def remember_notes(uri: str, notes: Iterable[str]) -> None:
    """Keep what ``notes`` (completed file names, maybe with sketches) tell of the table at ``uri``'s
    commits, for :func:`noted`."""
    # replaced, not changed in place: listings run on several threads, and a note lost to a race only
    # costs a write a listing of its partitions
    kept = {**_NOTED.get(uri, {})}
    kept.update((note.partition("_")[0], note) for note in notes)
    _NOTED[uri] = dict(list(kept.items())[-_NOTED_KEPT:])


def files_listed(storage: Storage, infos: list[FileInfo], listed_at: float) -> LockFiles:
    """What a listing of an object store's lock directory, begun at ``listed_at``, shows; the ids it shows
    for the first time count from now for :func:`collectable`."""
    files = files_named(frozenset(info.name for info in infos))
    created = {parse_lock_file(info.name): info.modified for info in infos}
    seen, now = _FIRST_SEEN.get(storage.uri, {}), time.monotonic()
    _FIRST_SEEN[storage.uri] = {i: seen.get(i, now) for i in files.acquired | files.released}
    acquired_at = {i: at for i in files.acquired if (at := created.get((i, False)))}
    return replace(files, acquired_at=acquired_at, listed_at=listed_at)


def collectable(storage: Storage, files: LockFiles, below: int) -> tuple[list[str], list[str]]:
    """The files of released locks with ids below ``below`` that may be deleted, the ``.acquired`` files
    apart (they go first: a lone ``.released`` reads as released, a lone ``.acquired`` as held), and the
    places queued for such ids. A lock without its ``.released`` file stays whatever its id; on an object
    store so does one this process has not known for :data:`COLLECTABLE_AGE` (see the module docstring)."""
    ids = sorted(i for i in files.released if i < below)
    if storage.round_trips:
        seen, now = _FIRST_SEEN.get(storage.uri, {}), time.monotonic()
        ids = [i for i in ids if now - seen.get(i, now) >= COLLECTABLE_AGE]
    acquired = [acquired_path(i) for i in ids if i in files.acquired]
    others = [released_path(i) for i in ids if i in files.release_files]
    others += [f"{LOCK_DIR}/{name}" for i in ids for name in files.notes.get(i, ())]
    others += [queued_path(i) for i in sorted(files.queued) if i < below]
    return acquired, others


@memo(16, "pure; a kept listing is the same object until the lock directory changes")
def files_named(names: frozenset[str]) -> LockFiles:
    acquired: set[int] = set()
    release_files: set[int] = set()
    closing: dict[int, tuple[int, str]] = {}  # id -> (how many commits it grouped, its own note)
    grouped: dict[int, list[str]] = {}
    notes: dict[int, list[str]] = {}
    queued: set[int] = set()
    serving: set[int] = set()
    for name in names:
        if (note := _NOTE.fullmatch(name)) is not None:
            lock_id = int(note.group(1))
            closing[lock_id] = (int(note.group(2) or 0), note.group(3))
            notes.setdefault(lock_id, []).append(name)
        elif (member := _GROUPED.fullmatch(name)) is not None:
            lock_id = int(member.group(1))
            grouped.setdefault(lock_id, []).append(member.group(2))
            notes.setdefault(lock_id, []).append(name)
        elif (parsed := parse_lock_file(name)) is not None:
            (release_files if parsed[1] else acquired).add(parsed[0])
        elif (place := _QUEUED.fullmatch(name)) is not None:
            queued.add(int(place.group(1)))
        elif (stands := _SERVES.fullmatch(name)) is not None:
            serving.add(int(stands.group(1)))
            notes.setdefault(int(stands.group(1)), []).append(name)
    published = {
        lock_id: (own, *sorted(members, key=_completion))
        for lock_id, (count, own) in closing.items()
        if len(members := grouped.get(lock_id, ())) == count
    }
    ended = frozenset(release_files | closing.keys())
    kept = {lock_id: tuple(sorted(names)) for lock_id, names in notes.items()}
    return LockFiles(
        frozenset(acquired),
        ended,
        published,
        frozenset(queued),
        frozenset(release_files),
        notes=kept,
        serving=frozenset(serving),
    )


def _completion(noted: str) -> str:
    """What orders the notes of one turn: the completion time, after the requested time in the name."""
    return noted.partition("_")[2]


@memo(1024, "pure; contenders list the same few names on every try")
def parse_lock_file(name: str) -> tuple[int, bool] | None:
    """(id, whether it is a release: a ``.released`` file or a note) of a lock file's name, None for any
    other name."""
    if (match := _LOCK_FILE.fullmatch(name)) is not None:
        return int(match.group(1)), match.group(2) == "released"
    note = _NOTE.fullmatch(name)
    return (int(note.group(1)), True) if note is not None else None


def is_release(name: str) -> bool:
    """Whether ``name`` (in the lock directory) ends a turn."""
    return (parsed := parse_lock_file(name)) is not None and parsed[1]


def read_places(storage: Storage, places: list[int]) -> list[tuple[int, bytes]]:
    """What each of the ``lock<place>.queued`` files holds, read at once: those gone, empty or unreadable
    left out (their waiters commit themselves)."""

    def read(place: int) -> bytes | None:
        try:
            return storage.read(queued_path(place))
        except (FileNotFoundError, CowriteError):
            return None

    held = together(storage, [partial(read, place) for place in places])
    return [(place, request) for place, request in zip(places, held, strict=True) if request]


def created_at(storage: Storage, lock_id: int) -> float:
    """When ``lock<id>.acquired`` was created (storage clock); :class:`FileNotFoundError` if gone."""
    return storage.stat(acquired_path(lock_id)).modified


def read_holder(storage: Storage, lock_id: int) -> LockHolder:
    """The holder written in ``lock<id>.acquired``.

    Raises :class:`FileNotFoundError` if the file is gone, :class:`CorruptTimelineError` naming the file if
    its payload is not a lock holder.
    """
    path = acquired_path(lock_id)
    return LockHolder.from_bytes(storage.read(path), storage.full_path(path))


def read_release(storage: Storage, lock_id: int) -> dict[str, object]:
    """The payload of ``lock<id>.released``; raises as :func:`read_holder` does."""
    path = released_path(lock_id)
    data = storage.read(path)
    if not data:  # released by its holder (see write_release)
        owner = read_holder(storage, lock_id).owner
        return {"owner": owner, "reason": ReleaseReason.RELEASED.value, "time": storage.stat(path).modified}
    try:
        payload = json.loads(data)
        if not isinstance(payload, dict) or not isinstance(payload.get("owner"), str):
            raise ValueError("no owner")
    except (ValueError, RecursionError) as exc:  # deep nesting exhausts the JSON decoder's recursion
        raise CorruptTimelineError(storage.full_path(path), f"not a lock release ({exc})") from None
    return payload


def write_release(storage: Storage, lock_id: int, owner: str, reason: ReleaseReason, at: float) -> bool:
    """Create ``lock<id>.released``; False if it exists. A holder's own release is empty: its owner is
    the lock file's and its time the file's own, and an empty file is created at once (on local disk, no
    temporary file written, linked and removed) on the way from one holder to the next."""
    if reason is ReleaseReason.RELEASED:
        return storage.create_if_absent(released_path(lock_id), b"")
    payload = {"owner": owner, "reason": reason.value, "time": at}
    return storage.create_if_absent(released_path(lock_id), json.dumps(payload, sort_keys=True).encode())


def describe_release(storage: Storage, lock_id: int) -> str:
    try:
        payload = read_release(storage, lock_id)
    except FileNotFoundError:
        return "its lock files were deleted"
    except CorruptTimelineError:
        return f"{released_path(lock_id)} exists (unreadable payload)"
    when = payload.get("time")
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)) if isinstance(when, int | float) else "?"
    return f"{payload.get('reason', 'released')} by {payload['owner']} at {at}"


def collect_garbage(storage: Storage, keep: int = 10, files: LockFiles | None = None) -> int:
    """Delete the files of released locks whose id is below ``highest id - keep``, and the places queued
    for such ids (:func:`collectable`); return how many. ``files``: a listing of the lock directory the
    caller just made (else it is listed).

    The highest ids always stay, so ids keep growing from where they were.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, not {keep}")
    files = scan(storage) if files is None else files
    acquired, others = collectable(storage, files, files.highest - keep)
    delete_in_order(storage, acquired, others)
    return len(acquired) + len(others)


def delete_in_order(storage: Storage, acquired: list[str], others: list[str]) -> None:
    """Delete the ``.acquired`` files of old locks, then their other files (see :func:`collectable`)."""
    storage.delete_all(acquired)
    storage.delete_all(others)
