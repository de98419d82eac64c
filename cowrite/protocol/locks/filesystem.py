"""The filesystem table lock: lock files under ``.hoodie/locks/`` (RFC-22 option 2).

**What happens when the lock is lost.** A holder whose heartbeat went stale (or, holding no instant, whose
lock file is older than the tolerance) is expired by a contender or by the daemon, which creates
``lock<id>.released`` with reason ``expired``. The old holder learns it only when it asks:
:meth:`FileSystemLock.check_held` then raises :class:`~cowrite.errors.LeaseLostError`, and a
writer asks right before it publishes, so it never completes an instant after losing the lock.

Files, each created once with create-if-absent and never rewritten:

- ``lock<id>.acquired``: :meth:`LockHolder.to_bytes` of whoever took lock ``id``;
- ``lock<id>.released``: JSON ``{"owner", "reason", "time"}`` — who released it, ``released`` by the holder
  or ``expired`` by someone else, and when (seconds since the epoch);
- ``lock<id>.published.<completed instant file>`` (empty): what the holder of a writer's turn published,
  created beside the completed file and before the release (:meth:`FileSystemLock.note_published`).
  A turn without one changed what nobody can tell from the lock directory (a table service, an expired
  holder). A later holder who saw the timeline before some turn, and finds a note for every turn since,
  knows the timeline's completed part without listing it (:meth:`FileSystemLock.published_since`).
  Readers of the lock that do not know the notes ignore them: they are not lock files.

The lock is held by the holder of the highest id while no ``lock<id>.released`` exists for it. Ids are
positive integers compared as numbers and only grow: acquiring means creating ``lock<N+1>.acquired`` when
``lock<N>`` is released. Works on every storage whose ``create_if_absent`` is atomic.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum

from cowrite.errors import CorruptTimelineError, CowriteError, LeaseLostError, LockTimeoutError
from cowrite.process import keep_mapping, memo
from cowrite.protocol.heartbeat import HeartbeatPolicy, heartbeat_age
from cowrite.protocol.locks.base import LockHolder, TableLock
from cowrite.protocol.retry import RetryPolicy
from cowrite.storage.backend import Storage
from cowrite.storage.together import in_background

log = logging.getLogger(__name__)

LOCK_DIR = ".hoodie/locks"

# Leading zeros are not ours: "lock07" would be a second name for id 7.
_LOCK_FILE = re.compile(r"lock([1-9][0-9]*)\.(acquired|released)")
_NOTE = re.compile(r"lock([1-9][0-9]*)\.published\.(.+)")

# Expiring a stale lock or dropping a bogus one is followed by another try without pausing; this bounds
# how often in a row, so a storage that keeps misbehaving still reaches the retry policy's pauses.
_IMMEDIATE_RETRIES = 3
# Lock files a releasing holder leaves behind it (older ones it deletes, see release).
_KEPT_ON_RELEASE = 16
# The longest pause a waiter takes on an object store, however long holds have lasted.
_LONGEST_PACE = 1.0

_HOLD_SECONDS: dict[str, float] = keep_mapping(
    "cowrite.protocol.locks.filesystem._HOLD_SECONDS",
    {},
    "a number per table whose lock this process held",
    "how long this process held each table's lock lately: on an object store, where every try is a "
    "request, a waiter pauses about that long between tries",
)


def acquired_path(lock_id: int) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.acquired"


def released_path(lock_id: int) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.released"


def note_path(lock_id: int, published: str) -> str:
    return f"{LOCK_DIR}/lock{lock_id}.published.{published}"


class ReleaseReason(StrEnum):
    RELEASED = "released"
    EXPIRED = "expired"


@dataclass(frozen=True)
class _LockFiles:
    """The ids one listing of ``.hoodie/locks/`` showed, and when each ``.acquired`` file was created where
    the listing told it (object stores list modification times with names; local disk's kept listing
    has names only)."""

    acquired: frozenset[int]
    released: frozenset[int]
    published: Mapping[int, str] = field(default_factory=dict)  # the notes: id -> completed file name
    acquired_at: Mapping[int, float] = field(default_factory=dict)

    @property
    def highest(self) -> int:
        """The highest id present, 0 when there is none."""
        return max((*self.acquired, *self.released), default=0)

    def is_held(self, lock_id: int) -> bool:
        return lock_id in self.acquired and lock_id not in self.released


def _scan(storage: Storage) -> _LockFiles:
    if not storage.round_trips:
        return _lock_files(storage.watched_names(LOCK_DIR))
    infos = storage.list(LOCK_DIR)
    files = _lock_files(frozenset(info.name for info in infos))
    created = {parse_lock_file(info.name): info.modified for info in infos}
    return replace(files, acquired_at={i: at for i in files.acquired if (at := created.get((i, False)))})


@memo(16, "pure; a kept listing is the same object until the lock directory changes")
def _lock_files(names: frozenset[str]) -> _LockFiles:
    acquired: set[int] = set()
    released: set[int] = set()
    published: dict[int, str] = {}
    for name in names:
        parsed = parse_lock_file(name)
        if parsed is not None:
            (released if parsed[1] else acquired).add(parsed[0])
        elif (note := _NOTE.fullmatch(name)) is not None:
            published[int(note.group(1))] = note.group(2)
    return _LockFiles(frozenset(acquired), frozenset(released), published)


@memo(1024, "pure; contenders list the same few names on every try")
def parse_lock_file(name: str) -> tuple[int, bool] | None:
    """(id, whether it is a release) of a lock file's name, None for any other name."""
    match = _LOCK_FILE.fullmatch(name)
    return (int(match.group(1)), match.group(2) == "released") if match else None


def _acquired_at(storage: Storage, lock_id: int) -> float:
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
    if not data:  # released by its holder (see _write_release)
        owner = read_holder(storage, lock_id).owner
        return {"owner": owner, "reason": ReleaseReason.RELEASED.value, "time": storage.stat(path).modified}
    try:
        payload = json.loads(data)
        if not isinstance(payload, dict) or not isinstance(payload.get("owner"), str):
            raise ValueError("no owner")
    except (ValueError, RecursionError) as exc:  # deep nesting exhausts the JSON decoder's recursion
        raise CorruptTimelineError(storage.full_path(path), f"not a lock release ({exc})") from None
    return payload


def _write_release(storage: Storage, lock_id: int, owner: str, reason: ReleaseReason, at: float) -> bool:
    """Create ``lock<id>.released``; False if it exists. A holder's own release is empty: its owner is
    the lock file's and its time the file's own, and an empty file is created at once (on local disk, no
    temporary file written, linked and removed) on the way from one holder to the next."""
    if reason is ReleaseReason.RELEASED:
        return storage.create_if_absent(released_path(lock_id), b"")
    payload = {"owner": owner, "reason": reason.value, "time": at}
    return storage.create_if_absent(released_path(lock_id), json.dumps(payload, sort_keys=True).encode())


def _describe_release(storage: Storage, lock_id: int) -> str:
    try:
        payload = read_release(storage, lock_id)
    except FileNotFoundError:
        return "its lock files were deleted"
    except CorruptTimelineError:
        return f"{released_path(lock_id)} exists (unreadable payload)"
    when = payload.get("time")
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)) if isinstance(when, int | float) else "?"
    return f"{payload.get('reason', 'released')} by {payload['owner']} at {at}"


def holder_or_unknown(storage: Storage, lock_id: int) -> LockHolder:
    """The holder of ``lock_id``; a corrupt payload reads as a holder without an instant.

    A garbage payload must not wedge every writer: such a holder is judged by the age of its file and
    expires like any other.
    """
    try:
        return read_holder(storage, lock_id)
    except CorruptTimelineError as exc:
        log.warning("%s; treating lock%d as held by an unknown holder without an instant", exc, lock_id)
        return LockHolder(owner=f"<unreadable {acquired_path(lock_id)}>", instant=None)


def _staleness(
    storage: Storage,
    acquired_at: float,
    lock_id: int,
    holder: LockHolder,
    policy: HeartbeatPolicy,
    now: float,
) -> tuple[str | None, float]:
    """Why the held lock ``lock_id`` is stale (None while its holder counts as alive), and the age of the
    sign of life it was judged by (seconds)."""
    age = heartbeat_age(storage, holder.instant, now) if holder.instant is not None else None
    return judge_holder(acquired_at, lock_id, holder, age, policy, now)


def judge_holder(
    acquired_at: float,
    lock_id: int,
    holder: LockHolder,
    heartbeat_age: float | None,
    policy: HeartbeatPolicy,
    now: float,
) -> tuple[str | None, float]:
    """:func:`_staleness` from the age of the holder's heartbeat (None: it has none), known already."""
    if holder.instant is not None and (age := heartbeat_age) is not None:
        if age > policy.tolerance:
            why = f"heartbeat of {holder.instant} is {age:.1f} s old (tolerance {policy.tolerance} s)"
            return why, age
        return None, age
    age = max(0.0, now - acquired_at)
    if age > policy.tolerance:
        basis = "has no heartbeat" if holder.instant is not None else "holds no instant"
        return f"holder {basis} and lock{lock_id} is {age:.1f} s old (tolerance {policy.tolerance} s)", age
    return None, age


def expire_lock(
    storage: Storage, lock_id: int, holder: LockHolder, reason: str, reaper: str, at: float
) -> bool:
    """Write ``lock<id>.released`` (reason ``expired``); False if someone released it first."""
    if not _write_release(storage, lock_id, reaper, ReleaseReason.EXPIRED, at):
        return False  # released or expired by someone else meanwhile
    log.warning(
        "expired table lock %d of %s on %s (owner %s, instant %s): %s",
        lock_id,
        storage.uri,
        reaper,
        holder.owner,
        holder.instant,
        reason,
    )
    return True


def _describe_holder(holder: LockHolder, lock_id: int) -> str:
    return f"{holder.owner} (instant {holder.instant or 'none'}, lock{lock_id})"


def expire_stale_lock(
    storage: Storage,
    policy: HeartbeatPolicy,
    now: Callable[[], float] = time.time,
    reaper: str = "cowrite-daemon",
) -> int | None:
    """Expire the current lock of the table at ``storage`` if its holder is stale (the daemon's reaper).

    Returns the id this call expired, None if the lock is free, alive, or was released by someone else
    first. Storage failures raise :class:`~cowrite.errors.StorageError`.
    """
    files = _scan(storage)
    lock_id = files.highest
    if not files.is_held(lock_id):
        return None
    try:
        acquired_at = _acquired_at(storage, lock_id)
        holder = holder_or_unknown(storage, lock_id)
    except FileNotFoundError:
        return None  # garbage-collected after our listing: not the current lock any more
    at = now()
    reason, _ = _staleness(storage, acquired_at, lock_id, holder, policy, at)
    if reason is None or not expire_lock(storage, lock_id, holder, reason, reaper, at):
        return None
    return lock_id


def collect_garbage(storage: Storage, keep: int = 10, names: frozenset[str] | None = None) -> int:
    """Delete the files of released locks whose id is below ``highest id - keep``; return how many.

    The highest ids always stay, so ids keep growing from where they were. A lock without its
    ``.released`` file is left alone whatever its id. The ``.acquired`` file goes first: a crash in
    between leaves a lone ``.released``, which reads as released, never a lone ``.acquired``, which would
    read as held. ``names``: a listing of the lock directory the caller just made (else it is listed).
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, not {keep}")
    files = _scan(storage) if names is None else _lock_files(names)
    below = files.highest - keep
    deleted = 0
    for lock_id in sorted(files.released):
        if lock_id >= below:
            break
        if lock_id in files.acquired:
            storage.delete(acquired_path(lock_id))
            deleted += 1
        storage.delete(released_path(lock_id))
        deleted += 1
        if lock_id in files.published:
            storage.delete(note_path(lock_id, files.published[lock_id]))
            deleted += 1
    return deleted


@dataclass(frozen=True)
class CurrentLock:
    lock_id: int
    holder: LockHolder | None  # None when released
    acquired_at: float | None  # modification time of the .acquired file


def current_lock(storage: Storage) -> CurrentLock | None:
    """The lock with the highest id, None if the table never had one.

    Raises :class:`CorruptTimelineError` naming the file if the holder's payload is garbage.
    """
    files = _scan(storage)
    lock_id = files.highest
    if not lock_id:
        return None
    try:
        at = _acquired_at(storage, lock_id) if lock_id in files.acquired else None
        if not files.is_held(lock_id):
            return CurrentLock(lock_id, None, at)
        return CurrentLock(lock_id, read_holder(storage, lock_id), at)
    except FileNotFoundError:  # garbage-collected after our listing
        return CurrentLock(lock_id, None, None)


class _Outcome(Enum):
    ACQUIRED = "acquired"
    BUSY = "busy"  # held by a live holder, or we lost the race to create: pause before the next try
    AGAIN = "again"  # the view changed (we expired a lock, dropped a bogus one): try again now


class FileSystemLock(TableLock):
    """The table lock as ``.hoodie/locks/lock<id>.*`` files on the table's own storage.

    ``acquire`` raises :class:`LockTimeoutError` naming the current holder; it expires a stale holder on
    the way. ``release`` is safe to call twice and when not held. ``check_held`` raises
    :class:`LeaseLostError` once someone else expired the lock. Storage failures raise
    :class:`~cowrite.errors.StorageError`. Not re-entrant: acquiring again while holding waits
    for (and may in the end expire) this object's own lock.

    ``now`` is the wall clock compared with file modification times; tests inject it.
    """

    def __init__(
        self,
        storage: Storage,
        holder: LockHolder,
        heartbeat: HeartbeatPolicy,
        retry: RetryPolicy | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(holder, retry)
        self.storage = storage
        self.heartbeat = heartbeat
        self.now = now
        self._id: int | None = None
        self._seen: tuple[int, LockHolder] | None = None  # the last holder we waited for, for the error
        self._seen_file: tuple[int, float] | None = None
        self._waited_for: int | None = None  # the id we last found held by someone else
        self._alive_until: tuple[int, float] | None = None  # (id, time on ``now``) its holder is alive until
        self._waiting_since = time.monotonic()
        self._first_seen: int | None = None  # the highest id this waiter's first try saw
        self._held_since = 0.0  # time.monotonic() when this object took the lock
        self._listed: _LockFiles | None = None  # the listing that showed this object's lock held
        self._free_after: int | None = None  # the last turn noted, when the lock was free then

    @property
    def lock_id(self) -> int | None:
        """The id of the lock this object holds, None when it holds none."""
        return self._id

    @property
    def is_held(self) -> bool:
        """Whether this object believes it holds the lock; :meth:`check_held` asks the storage."""
        return self._id is not None

    def acquire(self, timeout: float | None = None) -> None:
        policy = self._policy(timeout)
        self._seen = self._waited_for = self._first_seen = None
        self._waiting_since = time.monotonic()
        # On an object store, where nothing tells of a release and every try is a request, waiters pause
        # about as long as a turn lasts: together they still try several times a turn, each much less.
        if self.storage.round_trips:
            policy = replace(policy, floor=self._pace)
        # Watching from before the first try, a release between a try and the wait cannot go unnoticed.
        with self.storage.new_files(LOCK_DIR, wanted=lambda name: name.endswith(".released")) as releases:
            for _ in replace(policy, sleep=releases.wait).attempts():
                if not releases.woken:
                    if self._try() is _Outcome.ACQUIRED:
                        return
                    continue
                # A release wakes every waiter of this host: one tries, and the others find the lock
                # taken after it with two lookups, instead of all listing and racing to create it.
                if self._overtaken():
                    continue
                with releases.turn() as mine:
                    if mine and self._try() is _Outcome.ACQUIRED:
                        return
        raise self._timeout_error(policy.deadline)

    def _try(self) -> _Outcome:
        outcome = self._try_acquire()
        for _ in range(_IMMEDIATE_RETRIES):
            if outcome is not _Outcome.AGAIN:
                break
            outcome = self._try_acquire()
        return outcome

    def _overtaken(self) -> bool:
        """Whether another waiter already took the lock that follows the one we waited for (a holder
        that just took it cannot be stale: it needs no judging)."""
        if self._waited_for is None:
            return False
        following = self._waited_for + 1
        taken = self.storage.exists(acquired_path(following))
        if taken and not self.storage.exists(released_path(following)):
            self._waited_for = following
            return True
        return False

    def turn(self) -> int | None:
        """The id of the last lock released (one listing): lock ids name the turns."""
        files = _scan(self.storage)
        if files.is_held(files.highest):
            self._free_after = None
            return files.highest - 1  # a lock is taken only after the one before it was released
        self._free_after = files.highest
        return files.highest

    def acquire_next(self, turn: int | None) -> bool:
        """Take lock ``turn + 1`` with one try and no listing before it: on an object store two round
        trips, where :meth:`acquire` lists first."""
        if turn is None or turn != self._free_after:
            return False  # the next turn was taken when ``turn`` was noted: do not ask in vain
        self._waiting_since = time.monotonic()
        return self._take(turn + 1) is _Outcome.ACQUIRED

    def published_since(self, turn: int | None) -> list[str] | None:
        listed, held = self._listed, self._id
        if turn is None or listed is None or held is None:
            return None
        between = range(turn + 1, held)
        if any(lock_id not in listed.published for lock_id in between):
            return None
        return [listed.published[lock_id] for lock_id in between]

    def note_published(self, published: str) -> None:
        if self._id is not None:
            self.storage.create_if_absent(note_path(self._id, published), b"")

    def _pace(self) -> float:
        """About twice as long as a hold of the lock lasts, less the more turns this waiter has seen go
        by (down to a quarter of a hold), so that who has waited longest tends to try first."""
        hold = min(_LONGEST_PACE, _HOLD_SECONDS.get(self.storage.uri, 0.0))
        first, last = self._first_seen, self._waited_for
        seen = last - first if first is not None and last is not None else 0
        return hold * max(0.25, 2 - seen / 4)

    def _try_acquire(self) -> _Outcome:
        files = _scan(self.storage)
        current = files.highest
        if self._first_seen is None:
            self._first_seen = current
        if files.is_held(current):
            self._waited_for = current
            if self.on_published is not None and files.published:
                self.on_published(files.published)
            return self._judge(files, current)
        return self._take(current + 1)

    def _take(self, candidate: int) -> _Outcome:
        """Create ``lock<candidate>.acquired``; the lock is ours if a listing after shows no higher id."""
        waited = int((time.monotonic() - self._waiting_since) * 1000)
        payload = replace(self.holder, waited_ms=waited).to_bytes()
        if not self.storage.create_if_absent(acquired_path(candidate), payload):
            self._waited_for = candidate
            return _Outcome.BUSY
        # Our listing may have been stale: after lock files were garbage-collected, an id far below the
        # current one can be created again. Only an id that is still the highest counts.
        try:
            listed = _scan(self.storage)
            higher = listed.highest
        except BaseException:
            # we may hold it, but cannot tell: give it back rather than leave it to expire
            _write_release(self.storage, candidate, self.holder.owner, ReleaseReason.RELEASED, self.now())
            raise
        if higher > candidate:
            log.warning(
                "lock%d on %s was created from a stale view (lock%d exists); releasing it and retrying",
                candidate,
                self.storage.uri,
                higher,
            )
            _write_release(self.storage, candidate, self.holder.owner, ReleaseReason.RELEASED, self.now())
            return _Outcome.AGAIN
        self._id, self._listed, self._held_since = candidate, listed, time.monotonic()
        return _Outcome.ACQUIRED

    def _judge(self, files: _LockFiles, lock_id: int) -> _Outcome:
        # A holder found alive cannot turn stale before its age reaches the tolerance: until then a waiter
        # asks nothing more than its listing (on an object store, two requests less per try).
        if self._alive_until is not None and self._alive_until[0] == lock_id:
            if self.now() < self._alive_until[1]:
                return _Outcome.BUSY
        # Lock files are never rewritten: the holder read on an earlier try is still the holder of that
        # file, which saves a read per try while waiting.
        try:
            file = (lock_id, files.acquired_at.get(lock_id) or _acquired_at(self.storage, lock_id))
            at = self.now()
            if at - file[1] < self.heartbeat.margin:
                # A holder takes the lock with at least the safety margin left on its lease (a writer
                # checks before it asks): until the lock is that old, it needs no judging, nor reading.
                self._alive_until = (lock_id, file[1] + self.heartbeat.margin)
                return _Outcome.BUSY
            if self._seen is not None and self._seen_file == file:
                holder = self._seen[1]
            else:
                holder = holder_or_unknown(self.storage, lock_id)
                self._seen, self._seen_file = (lock_id, holder), file
        except FileNotFoundError:
            return _Outcome.AGAIN  # deleted since the listing: the listing is out of date
        reason, age = _staleness(self.storage, file[1], lock_id, holder, self.heartbeat, at)
        if reason is None:
            self._alive_until = (lock_id, at + self.heartbeat.tolerance - age)
            return _Outcome.BUSY
        expire_lock(self.storage, lock_id, holder, reason, self.holder.owner, at)
        return _Outcome.AGAIN

    def _timeout_error(self, deadline: float | None) -> LockTimeoutError:
        waited = f"within {deadline} s" if deadline is not None else "in the allowed number of tries"
        if self._seen is None and self._waited_for is not None:  # a young lock's holder was not read
            try:
                self._seen = (self._waited_for, holder_or_unknown(self.storage, self._waited_for))
            except (FileNotFoundError, CowriteError):
                pass
        if self._seen is None:
            held_by = "other writers kept taking it first"
        else:
            held_by = f"it is held by {_describe_holder(self._seen[1], self._seen[0])}"
        return LockTimeoutError(
            f"table lock on {self.storage.uri} not acquired {waited}: {held_by}. Wait and retry; "
            f"if that holder is dead, its lock expires {self.heartbeat.tolerance} s after its last heartbeat "
            "(or, without an instant, after it took the lock) and the next contender or the cowrite daemon "
            f"releases it then (files in {self.storage.full_path(LOCK_DIR)})"
        )

    def release(self) -> None:
        """Create ``lock<id>.released``; a lock already expired by someone else is only logged.

        On a storage failure the lock stays held (and ``release`` may be called again); if it is never
        released it expires after the heartbeat tolerance.
        """
        lock_id = self._id
        if lock_id is None:
            return
        if not _write_release(self.storage, lock_id, self.holder.owner, ReleaseReason.RELEASED, self.now()):
            log.warning(
                "table lock %d on %s of %s was already released: %s",
                lock_id,
                self.storage.uri,
                self.holder.owner,
                _describe_release(self.storage, lock_id),
            )
        self._id = None
        held = time.monotonic() - self._held_since
        before = _HOLD_SECONDS.get(self.storage.uri)
        _HOLD_SECONDS[self.storage.uri] = held if before is None else (before + held) / 2
        # Every contender lists the lock directory on every try: keep it short. Only ids far below ours
        # go, so the stale-view check above (our id must be the highest) still holds. Every
        # _KEPT_ON_RELEASE turns, those of a whole stretch go at once (one request a kind on an object
        # store, made in the background), rather than two deletes on the way of every commit; what a
        # process leaves undone, the daemon collects.
        if lock_id % _KEPT_ON_RELEASE == 0 and lock_id > _KEPT_ON_RELEASE:
            old = range(max(1, lock_id - 2 * _KEPT_ON_RELEASE), lock_id - _KEPT_ON_RELEASE + 1)
            notes = self._listed.published if self._listed is not None else {}
            acquired = [acquired_path(i) for i in old]
            released = [released_path(i) for i in old] + [note_path(i, notes[i]) for i in old if i in notes]

            def collect() -> None:
                self.storage.delete_all(acquired)  # first: a lone .released reads as free
                self.storage.delete_all(released)

            in_background(self.storage, collect, "collecting old lock files")

    def check_held(self) -> None:
        lock_id = self._id
        if lock_id is None:
            raise LeaseLostError(f"table lock on {self.storage.uri} is not held by {self.holder.owner}")
        files = _scan(self.storage)
        if files.is_held(lock_id) and files.highest == lock_id:
            return
        if lock_id in files.released:
            how = _describe_release(self.storage, lock_id)
        elif lock_id not in files.acquired:
            how = "its lock file was deleted (expired, then garbage-collected)"
        else:
            how = f"lock{files.highest} was taken after it"
        raise LeaseLostError(
            f"table lock {lock_id} on {self.storage.uri} of {self.holder.owner} (instant "
            f"{self.holder.instant or 'none'}) was lost: {how}. Whatever it was doing must not be published; "
            "a writer that lost its lock aborts its instant"
        )
