"""Judging the holder of the filesystem table lock (:mod:`.lock_files`): whether it is stale, expiring
it, what a waiter that ran out of time is told, and which lock is current (for services and tools).

A holder is alive while its instant's heartbeat is younger than the tolerance, or, holding no instant or
no heartbeat, while its ``lock<id>.acquired`` file is; a stale holder's lock is expired with
``lock<id>.released`` (reason ``expired``) by whoever finds it so first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from cowrite.errors import CorruptTimelineError, CowriteError, LeaseLostError, LockTimeoutError
from cowrite.protocol.heartbeat import HeartbeatPolicy, heartbeat_age
from cowrite.protocol.locks.base import LockHolder
from cowrite.protocol.locks.lock_files import (
    LOCK_DIR,
    LockFiles,
    ReleaseReason,
    acquired_path,
    created_at,
    describe_release,
    read_holder,
    scan,
    write_release,
)
from cowrite.storage.backend import Storage

log = logging.getLogger(__name__)


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


def staleness(
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
    """:func:`staleness` from the age of the holder's heartbeat (None: it has none), known already."""
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
    if not write_release(storage, lock_id, reaper, ReleaseReason.EXPIRED, at):
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


def lost_error(storage: Storage, files: LockFiles, lock_id: int, holder: LockHolder) -> LeaseLostError:
    """What :meth:`~.filesystem.FileSystemLock.check_held` raises when ``files`` (a listing made since
    the lock was taken) show that ``holder`` lost lock ``lock_id``: how, from the files."""
    if lock_id in files.published:
        how = f"its holder released it, noting that its turn published {', '.join(files.published[lock_id])}"
    elif lock_id in files.released:
        how = describe_release(storage, lock_id)
    elif lock_id not in files.acquired:
        how = "its lock file was deleted (expired, then garbage-collected)"
    else:
        how = f"lock{files.highest} was taken after it"
    return LeaseLostError(
        f"table lock {lock_id} on {storage.uri} of {holder.owner} (instant {holder.instant or 'none'}) was "
        f"lost: {how}. Whatever it was doing must not be published; a writer that lost its lock aborts its "
        "instant"
    )


def describe_holder(holder: LockHolder, lock_id: int) -> str:
    return f"{holder.owner} (instant {holder.instant or 'none'}, lock{lock_id})"


def timeout_error(
    storage: Storage, deadline: float | None, tolerance: float, seen: tuple[int, LockHolder] | int | None
) -> LockTimeoutError:
    """What a wait for the lock that ran out of time raises, naming the holder ``seen`` (its id, and the
    holder read then, else read now) if any."""
    waited = f"within {deadline} s" if deadline is not None else "in the allowed number of tries"
    held_by = "other writers kept taking it first"
    if isinstance(seen, int):
        try:
            seen = (seen, holder_or_unknown(storage, seen))
        except (FileNotFoundError, CowriteError):
            seen = None
    if seen is not None:
        held_by = f"it is held by {describe_holder(seen[1], seen[0])}"
    return LockTimeoutError(
        f"table lock on {storage.uri} not acquired {waited}: {held_by}. Wait and retry; if that holder is "
        f"dead, its lock expires {tolerance} s after its last heartbeat (or, without an instant, after it "
        "took the lock) and the next contender or the cowrite daemon releases it then (files in "
        f"{storage.full_path(LOCK_DIR)})"
    )


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
    files = scan(storage)
    lock_id = files.highest
    if not files.is_held(lock_id):
        return None
    try:
        acquired_at = created_at(storage, lock_id)
        holder = holder_or_unknown(storage, lock_id)
    except FileNotFoundError:
        return None  # garbage-collected after our listing: not the current lock any more
    at = now()
    reason, _ = staleness(storage, acquired_at, lock_id, holder, policy, at)
    if reason is None or not expire_lock(storage, lock_id, holder, reason, reaper, at):
        return None
    return lock_id


@dataclass(frozen=True)
class CurrentLock:
    lock_id: int
    holder: LockHolder | None  # None when released
    acquired_at: float | None  # modification time of the .acquired file


def current_lock(storage: Storage) -> CurrentLock | None:
    """The lock with the highest id, None if the table never had one.

    Raises :class:`CorruptTimelineError` naming the file if the holder's payload is garbage.
    """
    files = scan(storage)
    lock_id = files.highest
    if not lock_id:
        return None
    try:
        at = created_at(storage, lock_id) if lock_id in files.acquired else None
        if not files.is_held(lock_id):
            return CurrentLock(lock_id, None, at)
        return CurrentLock(lock_id, read_holder(storage, lock_id), at)
    except FileNotFoundError:  # garbage-collected after our listing
        return CurrentLock(lock_id, None, None)
