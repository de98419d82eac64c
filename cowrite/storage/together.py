"""Requests made at once: on an object store several independent requests cost one round trip together
rather than one each; on local disk they run one after the other, where threads would only add work."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from cowrite.process import keep
from cowrite.storage.backend import Storage

T = TypeVar("T")

log = logging.getLogger(__name__)

THREADS = "cowrite-requests"  # the name of the threads the requests are made in (and its prefix)
_pool: ThreadPoolExecutor | None = None
_underway: set[Future[bool]] = set()


def together(storage: Storage, calls: Sequence[Callable[[], T]]) -> list[T]:
    """The results of ``calls`` (requests to ``storage``), made concurrently where each is a round trip.
    Every call runs to its end; then the first exception, in the order of ``calls``, is raised."""
    if len(calls) < 2 or not storage.round_trips:
        return [call() for call in calls]
    futures = [_requests().submit(call) for call in calls]
    return [future.result() for future in futures]


def beside(storage: Storage, call: Callable[[], T], also: Callable[[], object] | None) -> T:
    """What ``call`` returns, with ``also`` (if any) made at once beside it: :func:`together` of a main
    request and a side one, whose result is not wanted; ``call``'s failure is raised first.

    ``call`` runs in a thread of the pool and ``also`` in the caller's, so that a side that makes
    requests at once itself (reading several commits) never waits for the pool from inside it: every
    task of the pool is a request that waits for nothing else."""
    if also is None or not storage.round_trips:
        result = call()
        if also is not None:
            also()
        return result
    main = _requests().submit(call)
    try:
        also()
    except BaseException:
        main.result()
        raise
    return main.result()


def ahead(storage: Storage, call: Callable[[], T]) -> Callable[[], T]:
    """``call``'s requests made now, in a thread of the pool where each is a round trip, before those the
    caller makes next: the function returned waits for what it returns (or raises). On local disk it is
    made now."""
    if not storage.round_trips:
        result = call()
        return lambda: result
    return _requests().submit(call).result


def in_background(storage: Storage, call: Callable[[], object], what: str) -> Future[bool] | None:
    """Make the requests of ``call`` without waiting for them where each is a round trip, and return
    the future of whether it succeeded (a failure is logged as ``what`` failing); on local disk, make
    them now and return None. A process that exits finishes the work first (the pool's threads are joined
    at exit, after :func:`finish_background`, and :func:`cowrite.shutdown.exit_now` calls it too); one
    that ends with a bare ``os._exit`` or is killed leaves the work undone."""
    if not storage.round_trips:
        call()
        return None

    def logged() -> bool:
        try:
            call()
        except Exception as exc:  # nobody is there to be told
            log.warning("%s on %s failed: %s", what, storage.uri, exc)
            return False
        return True

    underway = _requests().submit(logged)
    _underway.add(underway)
    underway.add_done_callback(_underway.discard)
    return underway


_BEFORE_FINISHING: list[Callable[[], None]] = []


def before_finishing(end: Callable[[], None]) -> None:
    """Have :func:`finish_background` call ``end`` first: work that goes on by itself and makes more
    requests in the background as it ends."""
    _BEFORE_FINISHING.append(end)


def finish_background() -> None:
    """End what :func:`before_finishing` named, then wait for the requests :func:`in_background` has made
    so far to be answered."""
    for end in _BEFORE_FINISHING:
        end()
    for underway in list(_underway):
        underway.result()


def _requests() -> ThreadPoolExecutor:
    """Threads that make requests at once (started on first use, again after a fork)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=THREADS)
    return _pool


def _anew_after_fork() -> None:
    global _pool
    _pool = None  # a forked child has none of its parent's threads
    _underway.clear()


os.register_at_fork(after_in_child=_anew_after_fork)
# At exit, the work in the background is waited for before the interpreter stops every thread pool
# (``concurrent.futures``' own hook, registered at its import, before this one: the hooks run newest
# first). After that, a request that needs a pool of a library's (aiobotocore opens its first
# connection through one) fails, and a lock's release or its served places would be left undone.
threading._register_atexit(finish_background)  # type: ignore[attr-defined]  # concurrent.futures' hook
keep(
    f"{__name__}._pool",
    "8 threads, started on first use",
    "a committer reads the commits it must check, and publishes beside its lock's note, in one round trip",
    size=lambda: 0 if _pool is None else 1,
    clear=None,
)
