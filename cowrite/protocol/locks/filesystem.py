"""The filesystem table lock: lock files under ``.hoodie/locks/`` (RFC-22 option 2), described in
:mod:`.lock_files`.

**What happens when the lock is lost.** A holder whose heartbeat went stale (or, holding no instant, whose
lock file is older than the tolerance) is expired by a contender or by the daemon, which creates
``lock<id>.released`` with reason ``expired``. The old holder learns it only when it asks:
:meth:`FileSystemLock.check_held` then raises :class:`~cowrite.errors.LeaseLostError`, and a
writer asks right before it publishes, so it never completes an instant after losing the lock.

**Release.** A writer's turn ends with its note, any other with ``lock<id>.released``; on an object
store in the background (:mod:`.releases`).

**The queue.** On an object store nothing tells a waiter of a release, so waiters queue instead of all
asking at every release (``lock<id>.queued``, :mod:`.lock_files`): a waiter asks a little before its turn
should come, and others leave its id to it for about two holds. A place only paces the asking: who holds
the lock is decided by the ``.acquired`` files alone.

**Turns.** Lock ids number the turns of the lock, and a writer's turn notes what it published: a writer
that noted the last turn before it listed the timeline learns, once it holds the lock, what the turns
since published (:meth:`FileSystemLock.published_since`, :mod:`cowrite.protocol.turns`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import Enum
from functools import partial

from cowrite.errors import CowriteError, LeaseLostError
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.locks.base import LockHolder, RequestPublished, TableLock
from cowrite.protocol.locks.handover import answered, offer, standing_turn
from cowrite.protocol.locks.holders import (
    expire_lock,
    holder_or_unknown,
    lost_error,
    staleness,
    timeout_error,
)
from cowrite.protocol.locks.lock_files import (
    FRESH_VIEW,
    LOCK_DIR,
    NOTHING,
    LockFiles,
    ReleaseReason,
    acquired_path,
    collectable,
    created_at,
    delete_in_order,
    is_release,
    queued_path,
    read_places,
    released_path,
    scan,
    write_release,
)
from cowrite.protocol.locks.releases import begin_note, end_turn, hold_seconds, last_turn, releasing, settle
from cowrite.protocol.retry import RetryPolicy
from cowrite.storage.backend import Storage
from cowrite.storage.together import beside, in_background

log = logging.getLogger(__name__)

# Expiring a stale lock or dropping a bogus one is followed by another try without pausing; this bounds
# how often in a row, so a storage that keeps misbehaving still reaches the retry policy's pauses.
_IMMEDIATE_RETRIES = 3
# Lock files a releasing holder leaves behind it (older ones it deletes, see release): on an object store
# every waiter lists them on every try, and the server's time for a listing grows with the names it returns.
_KEPT_ON_RELEASE = 4
# The longest hold a waiter's pauses on an object store are reckoned from, however long holds have lasted.
_LONGEST_PACE = 1.0
# How long a waiter leaves a free lock to the waiter queued for it: that many holds (the queued waiter,
# once next, asks every quarter hold at most), and at least that many seconds.
_LEAVE_FOR_HOLDS = 2.0
_LEAVE_AT_LEAST = 0.25
# The most requests of queued waiters a holder reads (group commit, cowrite.protocol.group).
_MOST_REQUESTS = 7
# A queued waiter lists again after at most that many holds: places of waiters that died or gave up
# count as turns ahead of it, and must not keep it from looking for long.
_QUEUE_HORIZON = 8


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
        self._held_since = 0.0  # time.monotonic() when this object asked for the lock it holds
        # what turns published, from every listing since the turn was noted
        self._notes: dict[int, tuple[str, ...]] = {}
        self._noted: tuple[str, ...] | None = None  # what the turn this object holds published, once it says
        self._served: list[int] = []  # the places of the waiters whose commits it published
        self._free_after: int | None = None  # the last turn noted, when the lock was free then
        # Since when what this object knows of the lock directory holds (time.monotonic()): when its last
        # listing began, or when its process's create of the last turn began; None on local disk.
        self._view_at: float | None = None
        self._highest = 0  # the highest id of this waiter's last listing
        self._asked = 0.0  # seconds that listing took
        self._place: int | None = None  # the id this waiter queued for (object stores)
        self._behind = False  # whether it took that place behind another waiter's, and has not asked since
        self._left: tuple[int, float] | None = None  # (free id, since when) the next is left to its waiter
        self._last = LockFiles(frozenset(), frozenset())  # this object's last listing
        self._offered_to: int | None = None  # the standing turn it last offered its commit to: not again

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
        settle(self.storage.uri)
        self._seen = self._waited_for = self._first_seen = self._place = self._left = None
        self._waiting_since = time.monotonic()
        # On an object store, where nothing tells of a release and every try is a request, waiters pause
        # until about when their turn comes (_pace), and rather early than late: a waiter that asks in
        # vain costs a request, a lock left free costs every waiter the time.
        if self.storage.round_trips:
            policy = replace(policy, floor=self._pace)
        try:
            self._wait_and_take(policy)
        except RequestPublished:
            raise  # the holder that published it deletes its place
        except BaseException:
            self._leave_queue()  # a place nobody will take would hold up the turn after it
            raise

    def _wait_and_take(self, policy: RetryPolicy) -> None:
        # Watching from before the first try, a release between a try and the wait cannot go unnoticed.
        with self.storage.new_files(LOCK_DIR, wanted=is_release) as releases:
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
        seen = self._seen or self._waited_for  # the holder of a young lock was not read
        raise timeout_error(self.storage, policy.deadline, self.heartbeat.tolerance, seen)

    def _try(self) -> _Outcome:
        outcome = self._try_acquire()
        for _ in range(_IMMEDIATE_RETRIES):
            if outcome is not _Outcome.AGAIN:
                break
            outcome = self._try_acquire()
        return outcome

    def _overtaken(self) -> bool:
        """Whether another waiter already took the lock that follows the one we waited for (a holder
        that just took it cannot be stale: it needs no judging). Asked when a release woke this waiter,
        on local disk, where the lock directory's listing is kept current."""
        if self._waited_for is None:
            return False
        following = self._waited_for + 1
        if scan(self.storage).is_held(following):
            self._waited_for = following
            return True
        return False

    def turn(self) -> int | None:
        """The id of the last lock released: lock ids name the turns. From a listing, on an object store
        one of this process's begun less than half :data:`FRESH_VIEW` ago and after its own last turn (an
        earlier view can only note an earlier turn), or that turn if it began that recently (its create
        showed no later turn, and a later one is not collected that soon) unless the next collects old
        lock files: that one is noted from a listing, which leaves it to a waiter queued for it."""
        self._notes, fresh_for = {}, FRESH_VIEW / 2
        own = last_turn(self.storage.uri) if self.storage.round_trips else None
        stood = answered(self.storage.uri) if self.standing is not None else None
        if stood is not None and time.monotonic() - stood[1] < fresh_for and (own or (0,))[0] < stood[0]:
            self._view_at, self._free_after = stood[1], None
            return stood[0] - 1  # it stood when it published this process's commit: the turn before ended
        if own is not None:
            lock_id, began = own
            if (lock_id + 1) % _KEPT_ON_RELEASE and time.monotonic() - began < fresh_for:
                self._view_at, self._free_after = began, lock_id
                return lock_id
            fresh_for = min(fresh_for, time.monotonic() - began)
        files = self._scan(fresh_for)
        if files.is_held(files.highest) and not releasing(self.storage.uri, files.highest):
            self._free_after = None
            return files.highest - 1  # a lock is taken only after the one before it was released
        # a turn a waiter queued for is left to it: acquire_next would take it with no listing
        self._free_after = None if files.highest + 1 in files.queued else files.highest
        return files.highest

    def acquire_next(self, turn: int | None) -> bool:
        """Take lock ``turn + 1`` with one try and no listing before it: on an object store one round trip
        while the listing that noted ``turn`` is fresh, where :meth:`acquire` lists first."""
        if turn is None or turn != self._free_after:
            return False  # the next turn was taken when ``turn`` was noted: do not ask in vain
        if self._view_at is not None and time.monotonic() - self._view_at >= FRESH_VIEW:
            return False  # a listing first costs what one confirming the create would, and spares a create
        if settle(self.storage.uri) == turn:
            return False  # our own release of ``turn`` failed: it is still held
        self._waiting_since = time.monotonic()
        return self._take(turn + 1) is _Outcome.ACQUIRED

    def published_since(self, turn: int | None) -> list[str] | None:
        """From the notes of every listing this object made since :meth:`turn`: a note, made once and never
        changed, still tells what its turn published after old lock files were collected."""
        notes, held = self._notes, self._id
        if turn is None or held is None:
            return None
        between = range(turn + 1, held)
        if any(lock_id not in notes for lock_id in between):
            return None
        return [name for lock_id in between for name in notes[lock_id] if name != NOTHING]

    def note_published(
        self, published: str | None, grouped: Sequence[str] = (), served: Sequence[int] = ()
    ) -> None:
        """Noted by the release (:mod:`.releases`): made once the completed files exist. The places of the
        waiters served go after it, in one request."""
        if self._id is not None:
            self._noted, self._served = (published or NOTHING, *grouped), list(served)

    def note_grouped(self, grouped: str) -> None:
        if self._id is not None:
            begin_note(self.storage, self._id, grouped)

    def requests(self) -> list[tuple[int, bytes]]:
        """Read at once from the places behind this holder, where its last view showed any or is stale:
        a listing now shows which, and every note of the turn before this one."""
        held, seen = self._id, self._view_at
        if held is None or seen is None:  # (local disk: no queue)
            return []
        if time.monotonic() - seen < FRESH_VIEW and not any(place > held for place in self._last.queued):
            return []
        try:
            queued = self._scan().queued
        except CowriteError as exc:
            log.info("no requests read from the queue of the lock of %s: %s", self.storage.uri, exc)
            return []
        return read_places(self.storage, sorted(place for place in queued if place > held)[:_MOST_REQUESTS])

    def _pace(self) -> float:
        """For a waiter that handed its commit over, a hold (a holder ahead may publish it at the end of any
        turn), but two before its first ask behind another waiter: holders read the queue as their turn
        begins, so that commit is published at the end of the next turn at the earliest. For another waiter
        with a place, about as long as the turns ahead of it will last less most of a hold, and a quarter
        hold once its place is next: a lock left free while its waiter sleeps costs every waiter. Otherwise
        about two holds, less the more turns it has seen go by (down to a quarter), so that who has waited
        longest tends to try first."""
        hold = self._hold()
        if self.requested:
            behind, self._behind = self._behind, False
            return 2 * hold if behind else hold
        if self._place is not None and self._place > self._highest:
            # Counted in holds, not in turns as waiters see them go by: those lengthen with every late
            # waiter, and the pauses with them.
            return hold * min(_QUEUE_HORIZON, max(0.25, self._place - self._highest - 1.25))
        first, last = self._first_seen, self._waited_for
        seen = last - first if first is not None and last is not None else 0
        return hold * max(0.25, 2 - seen / 4)

    def _hold(self) -> float:
        """How long a hold of the lock lasts, from this process's last holds; before it held the lock,
        guessed from its last listing (a hold is four requests, one after another)."""
        return min(_LONGEST_PACE, hold_seconds(self.storage.uri) or 4 * self._asked)

    def _offer(self, lock_id: int | None) -> None:
        """Hand this waiter's commit to standing turn ``lock_id`` (:mod:`.handover`), once a turn."""
        if lock_id is None or self.request is None or self.standing is None or lock_id == self._offered_to:
            return
        sent, noted = offer(self.storage, lock_id, self.request)
        self.requested, self._offered_to = self.requested or sent, lock_id
        if noted is not None:
            self._leave_queue()
            raise RequestPublished(noted)

    def _try_acquire(self) -> _Outcome:
        self._offer(standing_turn(self.storage.uri))  # before a listing: the turn it knows of may stand still
        asked = time.monotonic()
        files = self._scan()
        self._asked = time.monotonic() - asked
        current = self._highest = files.highest
        if self.requested and (noted := files.noting(self.holder.instant)) is not None:
            raise RequestPublished(noted)
        if self._first_seen is None:
            self._first_seen = current
        told = self.on_published if files.published else None
        held = files.is_held(current)
        if held and current in files.serving:
            self._offer(current)
        if held or self._leave_to_queued(files, current):
            # what the last turns published is read beside taking a place: one round trip for both
            read = told and partial(told, files.published, True)
            queue = partial(self._queue, files) if self.storage.round_trips else None
            if queue is not None:
                beside(self.storage, queue, read)
            elif read is not None:
                read()
            if not held:
                return _Outcome.BUSY
            self._waited_for = current
            return self._judge(files, current)
        # what the last turns published is read beside taking the next: one round trip for both
        return beside(
            self.storage, partial(self._take, current + 1), told and partial(told, files.published, False)
        )

    def _leave_to_queued(self, files: LockFiles, free: int) -> bool:
        """Whether to leave lock ``free + 1`` to another waiter that queued for it: for a while from when
        this waiter first saw it so, after which a waiter that died in the queue holds up nobody."""
        following = free + 1
        if following not in files.queued or following == self._place or not self.storage.round_trips:
            return False
        now = time.monotonic()
        if self._left is None or self._left[0] != free:
            self._left = (free, now)
        return now - self._left[1] < max(_LEAVE_AT_LEAST, _LEAVE_FOR_HOLDS * self._hold())

    def _queue(self, files: LockFiles) -> None:
        """Take a place at the end of the queue, unless this waiter's place is still ahead. A place is
        only a pace: one that cannot be taken costs nothing but more asking."""
        highest = files.highest
        if self._place is None or self._place <= highest:
            self._place = self._queue_at(max(files.queued | {highest}) + 1)
            self._behind = self._place is not None and any(place > highest for place in files.queued)

    def _leave_queue(self) -> None:
        """Give up this waiter's place, if it has one, so that others do not leave it free for it."""
        if self._place is not None:
            drop = partial(self.storage.delete, queued_path(self._place))
            in_background(self.storage, drop, "giving up a place in the queue of the lock")
            self._place = None

    def _queue_at(self, place: int) -> int | None:
        try:
            for _ in range(_IMMEDIATE_RETRIES):
                # handed over from the try on: a create whose answer is lost may have been made
                self.requested = self.requested or self.request is not None
                if self.storage.create_if_absent(queued_path(place), self.request or b""):
                    return place
                place += 1  # another waiter took it meanwhile
        except CowriteError as exc:
            log.info("no place in the queue for the lock of %s: %s", self.storage.uri, exc)
        return None

    def _take(self, candidate: int) -> _Outcome:
        """Create ``lock<candidate>.acquired``; the lock is ours if our view, which showed ``candidate - 1``
        as the last lock (a listing, or our process's create of it), was fresh when the create returned, or
        else if a listing after shows no higher id."""
        asked = time.monotonic()
        waited = int((asked - self._waiting_since) * 1000)
        payload = replace(self.holder, waited_ms=waited).to_bytes()
        if not self.storage.create_if_absent(acquired_path(candidate), payload):
            self._waited_for = candidate
            return _Outcome.BUSY
        # Our view may have been stale: after lock files were garbage-collected, an id far below the
        # current one can be created again. A fresh one cannot be (collectors leave young locks alone,
        # lock_files): the create that succeeded took the very next turn.
        if self._view_at is not None and time.monotonic() - self._view_at < FRESH_VIEW:
            return self._taken(candidate, asked)
        try:
            higher = self._scan().highest
        except BaseException:
            # we may hold it, but cannot tell: give it back rather than leave it to expire
            write_release(self.storage, candidate, self.holder.owner, ReleaseReason.RELEASED, self.now())
            raise
        if higher > candidate:  # a race of contenders, handled here: not for a user's log at warning level
            log.info(
                "lock%d on %s was created from a stale view (lock%d exists); releasing it and retrying",
                candidate,
                self.storage.uri,
                higher,
            )
            write_release(self.storage, candidate, self.holder.owner, ReleaseReason.RELEASED, self.now())
            # far below the highest, no holder collects it: its files go now, the .acquired first
            files = [acquired_path(candidate)], [released_path(candidate)]
            collect = partial(delete_in_order, self.storage, *files)
            in_background(self.storage, collect, "collecting a lock taken from a stale view")
            return _Outcome.AGAIN
        return self._taken(candidate, asked)

    def _taken(self, lock_id: int, asked: float) -> _Outcome:
        self._id, self._held_since, self._noted, self._served = lock_id, asked, None, []
        if self._place is not None and self._place > lock_id:
            self._leave_queue()  # taken before its place came (left free by a waiter that died in the queue)
        return _Outcome.ACQUIRED

    def _scan(self, fresh_for: float = 0.0) -> LockFiles:
        """:func:`.lock_files.scan`, keeping the notes it shows for :meth:`published_since`."""
        files = self._last = scan(self.storage, fresh_for)
        self._view_at = files.listed_at
        self._notes.update(files.published)
        return files

    def _judge(self, files: LockFiles, lock_id: int) -> _Outcome:
        # A holder found alive cannot turn stale before its age reaches the tolerance: until then a waiter
        # asks nothing more than its listing (on an object store, two requests less per try).
        if self._alive_until is not None and self._alive_until[0] == lock_id:
            if self.now() < self._alive_until[1]:
                return _Outcome.BUSY
        # Lock files are never rewritten: the holder read on an earlier try is still the holder of that
        # file, which saves a read per try while waiting.
        try:
            file = (lock_id, files.acquired_at.get(lock_id) or created_at(self.storage, lock_id))
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
        reason, age = staleness(self.storage, file[1], lock_id, holder, self.heartbeat, at)
        if reason is None:
            self._alive_until = (lock_id, at + self.heartbeat.tolerance - age)
            return _Outcome.BUSY
        expire_lock(self.storage, lock_id, holder, reason, self.holder.owner, at)
        return _Outcome.AGAIN

    def release(self) -> None:
        """Create this turn's note, or ``lock<id>.released`` when it noted nothing; a lock already expired
        by someone else is only logged.

        On local disk a storage failure leaves the lock held (and ``release`` may be called again). On an
        object store the release is made in the background, and a failure there is only logged. A lock
        never released expires after the heartbeat tolerance.
        """
        lock_id = self._id
        if lock_id is None:
            return
        end_turn(self.storage, lock_id, self.holder.owner, self._held_since, self._noted, self.now)
        self._id = None
        if self._served:  # after the release: the waiters see their notes first
            served = [queued_path(place) for place in self._served]
            in_background(self.storage, partial(self.storage.delete_all, served), "deleting served places")
            self._served = []
        # Every contender lists the lock directory on every try: keep it short. Only ids far below ours
        # go, so the stale-view check above (our id must be the highest) still holds. Every
        # _KEPT_ON_RELEASE turns, what our last listing showed of older turns goes at once (one request a
        # kind on an object store, made in the background), rather than two deletes on the way of every
        # commit; what a process leaves undone, a later one or the daemon collects.
        if lock_id % _KEPT_ON_RELEASE == 0:
            acquired, others = collectable(self.storage, self._last, lock_id - _KEPT_ON_RELEASE + 1)
            if acquired or others:
                collect = partial(delete_in_order, self.storage, acquired, others)
                in_background(self.storage, collect, "collecting old lock files")
        self._notes = {}

    def check_held(self) -> None:
        lock_id = self._id
        if lock_id is None:
            raise LeaseLostError(f"table lock on {self.storage.uri} is not held by {self.holder.owner}")
        files = scan(self.storage)
        if not files.is_held(lock_id) or files.highest != lock_id:
            raise lost_error(self.storage, files, lock_id, self.holder)
