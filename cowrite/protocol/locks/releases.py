"""A holder's release of the filesystem lock, and what this process remembers of its releases.

A writer's turn that noted what it published (:meth:`~.filesystem.FileSystemLock.note_published`) ends
with that note, ``lock<id>.published.<...>``, created once the completed file it names exists: one file
both tells later holders what the turn published and releases the lock, and a note that exists names a
commit that does. A turn that also published waiters' commits made their notes before it, each beside the
create of the completed file it names. Any other turn ends with ``lock<id>.released`` (:mod:`.lock_files`).

On an object store the release is made in the background: what it ends (a commit) is complete, and
nobody in the process needs its answer. The process's next try for the same table's lock waits for it
first (:func:`settle`), so its turns never overlap, and a listing that raced it counts that lock as free
(:func:`releasing`). How long the process's holds lasted paces its waiters (:func:`hold_seconds`), and
its last turn lets its next one be taken without listing the lock directory (:func:`last_turn`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial

from cowrite.process import keep_mapping
from cowrite.protocol.locks.lock_files import (
    ReleaseReason,
    describe_release,
    grouped_path,
    note_path,
    write_release,
)
from cowrite.storage.backend import Storage
from cowrite.storage.together import in_background

log = logging.getLogger(__name__)

_HOLD_SECONDS: dict[str, float] = keep_mapping(
    "cowrite.protocol.locks.releases._HOLD_SECONDS",
    {},
    "a number per table whose lock this process held",
    "how long this process held each table's lock lately: on an object store, where every try is a "
    "request, a waiter pauses about that long between tries",
)

_LAST_TURN: dict[str, tuple[int, float]] = keep_mapping(
    "cowrite.protocol.locks.releases._LAST_TURN",
    {},
    "one turn per table whose lock this process released",
    "the id of this process's last turn of each table's lock and when its create began: on an object store "
    "the next turn is taken from it, without a listing, while that is fresh",
)

_NOTING: dict[str, dict[str, Future[bool] | None]] = keep_mapping(
    "cowrite.protocol.locks.releases._NOTING",
    {},
    "the waiters' notes of one turn per table whose lock this process holds",
    "on an object store a holder begins each waiter's note beside the create of its commit: the turn's "
    "release waits for them",
)

_RELEASING: dict[str, tuple[int, Future[bool]]] = keep_mapping(
    "cowrite.protocol.locks.releases._RELEASING",
    {},
    "one release per table whose lock this process released",
    "on an object store a release is made in the background: the process's next try for that table's "
    "lock waits for it",
)


def begin_note(storage: Storage, lock_id: int, grouped: str) -> None:
    """Begin the note ``lock<id>.grouped.<grouped>`` of a waiter's commit that turn ``lock_id`` publishes,
    for :func:`end_turn` to wait for (in the background on an object store)."""
    _NOTING.setdefault(storage.uri, {})[grouped] = _note(storage, lock_id, grouped)


def _note(storage: Storage, lock_id: int, grouped: str) -> Future[bool] | None:
    create = partial(storage.create_if_absent, grouped_path(lock_id, grouped), b"")
    return in_background(storage, create, "noting")


def end_turn(
    storage: Storage,
    lock_id: int,
    owner: str,
    held_since: float,
    noted: tuple[str, ...] | None,
    now: Callable[[], float],
) -> None:
    """End the turn ``lock_id`` that ``owner`` has held since ``held_since`` (``time.monotonic()``): with
    the notes ``noted`` (the completed file a writer's turn published, or :data:`~.lock_files.NOTHING`,
    then those it published for waiters), else with ``lock<id>.released``. On local disk now, raising
    what the storage raises; on an object store in the background, where a failure is only logged (the
    lock then expires)."""
    _LAST_TURN[storage.uri] = (lock_id, held_since)
    # The notes of the waiters' commits first (begun beside their completed files, any other now), then
    # the release: a listing that shows the release shows them all, and their waiters learn from it that
    # their commits are in.
    begun = _NOTING.pop(storage.uri, {})
    grouped = [begun[n] if n in begun else _note(storage, lock_id, n) for n in (noted or ())[1:]]
    give_back = partial(_give_back, storage, lock_id, owner, held_since, noted, now, grouped)
    releasing = in_background(storage, give_back, f"releasing table lock {lock_id}")
    if releasing is not None:
        _RELEASING[storage.uri] = (lock_id, releasing)


def _give_back(
    storage: Storage,
    lock_id: int,
    owner: str,
    held_since: float,
    noted: tuple[str, ...] | None,
    now: Callable[[], float],
    grouped: list[Future[bool] | None],
) -> None:
    if not all(note is None or note.result() for note in grouped):
        noted = None  # a waiter's note is missing: the turn ends unnoted, and its waiter lists the timeline
    if noted is not None:
        storage.create_if_absent(note_path(lock_id, noted[0], len(noted) - 1), b"")
    elif not write_release(storage, lock_id, owner, ReleaseReason.RELEASED, now()):
        log.warning(
            "table lock %d on %s of %s was already released: %s",
            lock_id,
            storage.uri,
            owner,
            describe_release(storage, lock_id),
        )
    held = time.monotonic() - held_since  # as waiters see it: from the create to the release
    before = _HOLD_SECONDS.get(storage.uri)
    _HOLD_SECONDS[storage.uri] = held if before is None else (before + held) / 2


def hold_seconds(uri: str) -> float | None:
    """How long this process's holds of the lock of the table at ``uri`` lasted lately; None before one."""
    return _HOLD_SECONDS.get(uri)


def last_turn(uri: str) -> tuple[int, float] | None:
    """The id of the last turn of the lock of the table at ``uri`` this process ended (its release may be
    underway), and when the create that took it began (``time.monotonic()``); None before one."""
    return _LAST_TURN.get(uri)


def releasing(uri: str, lock_id: int) -> bool:
    """Whether this process's release of ``lock_id`` on ``uri`` is underway or done."""
    pending = _RELEASING.get(uri)
    return pending is not None and pending[0] == lock_id


def settle(uri: str) -> int | None:
    """Wait for this process's release of the lock of the table at ``uri``, if one is underway; return
    the lock's id if that release failed (the lock is then held until it expires), else None."""
    pending = _RELEASING.pop(uri, None)
    if pending is None:
        return None
    lock_id, released = pending
    return None if released.result() else lock_id
