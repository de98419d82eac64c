"""Writer heartbeats: ``.hoodie/.heartbeat/<instant>``, renewed every interval while the writer lives.

Others judge a writer by the file's modification time (the storage's clock, one clock for everybody):
it has failed once the heartbeat is older than ``interval x tolerable misses``.

The writer judges itself more strictly, by its own monotonic clock: its *lease* runs from the start of
its last successful renewal for the tolerance, and it acts only while at least the safety margin remains.
A renewal that comes later than the tolerance after the previous one (the process was paused, the storage
was down) loses the lease for good: someone may already have judged the writer failed, rolled it back or
expired its lock, and renewing the file now would not undo that.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cowrite.errors import CowriteError, LeaseLostError, TxnAlreadyCommittedError, WriteConflictError
from cowrite.format import config as keys
from cowrite.format.config import Config
from cowrite.process import keep
from cowrite.steps import Step, reached
from cowrite.storage.backend import Storage

log = logging.getLogger(__name__)

HEARTBEAT_DIR = ".hoodie/.heartbeat"


def heartbeat_path(instant: str) -> str:
    return f"{HEARTBEAT_DIR}/{instant}"


@dataclass(frozen=True)
class HeartbeatPolicy:
    interval: float = 60.0  # seconds
    tolerable_misses: int = 2
    safety_margin: float | None = None  # seconds; None = half an interval

    @classmethod
    def from_config(cls, config: Config) -> HeartbeatPolicy:
        margin = config.get(keys.LEASE_SAFETY_MARGIN_MS)
        return cls(
            interval=config.get(keys.HEARTBEAT_INTERVAL_MS) / 1000,
            tolerable_misses=config.get(keys.HEARTBEAT_TOLERABLE_MISSES),
            safety_margin=None if margin < 0 else margin / 1000,
        )

    @property
    def tolerance(self) -> float:
        return self.interval * self.tolerable_misses

    @property
    def margin(self) -> float:
        # Right after a renewal a writer has the whole tolerance (interval x misses) left, and at least
        # tolerance - interval just before the next one: half an interval below that keeps a writer whose
        # renewals are on time from ever failing its own check.
        margin = self.interval / 2 if self.safety_margin is None else self.safety_margin
        return min(margin, self.tolerance / 2)


def heartbeat_age(storage: Storage, instant: str, now: float | None = None) -> float | None:
    """Seconds since the instant's heartbeat was renewed, or None if it has none."""
    try:
        modified = storage.stat(heartbeat_path(instant)).modified
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - modified)


def abort_reason(storage: Storage, instant: str) -> str | None:
    """Why the writer of ``instant`` gave up ("conflict", "lease-lost", "already-committed",
    "error"), or None if it did not.

    An aborting writer rewrites its heartbeat with this reason as its last act, so the instant can be
    rolled back at once instead of after the heartbeat tolerance. An unreadable payload counts as none.
    """
    try:
        payload = json.loads(storage.read(heartbeat_path(instant)))
    except (FileNotFoundError, ValueError, RecursionError):  # RecursionError: absurdly deep JSON
        return None
    reason = payload.get("aborted") if isinstance(payload, dict) else None
    return reason if isinstance(reason, str) else None


class Heartbeat:
    """Keeps one instant's heartbeat alive from a background thread and tracks the writer's lease."""

    def __init__(
        self,
        storage: Storage,
        instant: str,
        policy: HeartbeatPolicy,
        owner: str = "",
        clock: Callable[[], float] = time.monotonic,
        leased_at: float | None = None,
    ) -> None:
        """``leased_at`` (on ``clock``): when the lease began, if before the first renewal. A writer's
        lease runs from its claim, since others judge the instant by its ``.requested`` file until the
        first heartbeat: a writer paused in between past the tolerance must not start afresh."""
        self.storage = storage
        self.instant = instant
        self.policy = policy
        self.owner = owner
        self.clock = clock
        self._renewed_at: float | None = leased_at
        self._lost: str | None = None
        self._failure = "renewals are late"
        self._stopped = False
        self._written = False  # whether a heartbeat file was ever written
        self._guard = threading.Lock()  # renewals (in the background too) and stop() never overlap

    def start(self) -> Heartbeat:
        """Renew from now on, in the background; raise :class:`LeaseLostError` if the lease is gone.

        A lease that began earlier (``leased_at``) is first renewed after at most half the tolerance:
        until then others judge the instant by its timeline files, which are as fresh, so a write that
        ends sooner writes (and deletes) no heartbeat at all. Without ``leased_at`` it is written at once.
        """
        if self._renewed_at is None:
            self.renew()
        elif (late := self.clock() - self._renewed_at) > self.policy.tolerance:
            self._lose(f"heartbeat of {self.instant} was not renewed for {late:.1f} s")
        if self._lost:
            raise LeaseLostError(self._lost)
        _renewals.add(self, first=min(self.policy.interval, self.policy.tolerance / 2))
        return self

    def renew(self) -> None:
        """Write the heartbeat now, unless it was stopped (its last content then stays)."""
        with self._guard:
            if self._stopped:
                return
            started = self.clock()
            if self._renewed_at is not None and started - self._renewed_at > self.policy.tolerance:
                late = started - self._renewed_at
                self._lose(f"heartbeat of {self.instant} was not renewed for {late:.1f} s")
                return
            payload = json.dumps({"owner": self.owner, "instant": self.instant}).encode()
            try:
                self.storage.write(heartbeat_path(self.instant), payload)
            except (CowriteError, OSError) as exc:
                # Not lost yet: the lease runs out by itself if renewals keep failing.
                self._failure = f"cannot renew heartbeat of {self.instant}: {exc}"
                return
            self._renewed_at = started
            self._written = True
        reached(Step.RENEWED, self.instant, storage=self.storage)

    @property
    def written(self) -> bool:
        """Whether the heartbeat file was ever written (a write may end before its first renewal)."""
        return self._written

    def refresh(self) -> None:
        """Renew unless the last renewal is less than half an interval old (the lease is then as good as
        fresh, and a commit saves a write)."""
        if self._renewed_at is None or self.clock() - self._renewed_at >= self.policy.interval / 2:
            self.renew()

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason

    def remaining(self) -> float:
        """Seconds of lease left (negative when gone)."""
        if self._renewed_at is None:
            return -1.0
        return self.policy.tolerance - (self.clock() - self._renewed_at)

    def check(self, margin: float | None = None) -> None:
        """Raise :class:`LeaseLostError` unless the lease is held with ``margin`` seconds to spare."""
        if self._lost:
            raise LeaseLostError(f"{self._lost}; the writer of {self.instant} must not publish")
        needed = self.policy.margin if margin is None else margin
        if self.remaining() < needed:
            self._lose(
                f"lease of {self.instant} has {self.remaining():.1f} s left, less than the safety margin "
                f"of {needed:.1f} s ({self._failure})"
            )
            raise LeaseLostError(f"{self._lost}; the writer of {self.instant} must not publish")

    def mark_aborted(self, reason: str) -> None:
        """Stop renewing and leave the reason in the heartbeat: the instant is failed from now on."""
        reached(Step.GAVE_UP, self.instant, reason=reason)
        self.stop(delete=False)
        payload = json.dumps({"owner": self.owner, "instant": self.instant, "aborted": reason}).encode()
        try:
            self.storage.write(heartbeat_path(self.instant), payload)
        except CowriteError as exc:  # the heartbeat then simply expires
            log.warning("could not record the abort of %s: %s", self.instant, exc)

    def stop(self, delete: bool = True) -> None:
        """Stop renewing; once this returns no renewal is under way or will start."""
        _renewals.remove(self)
        with self._guard:
            self._stopped = True
        if delete and self._written:
            self.storage.delete(heartbeat_path(self.instant))


class _Renewals:
    """Renews the started heartbeats of this process on time, from one scheduling thread.

    A writer may commit many times a second: a thread of its own per instant would cost more than the
    commit (starting and joining one each waits for the scheduler). Renewals run on a small pool, so one
    slow storage does not hold back the heartbeats of writers on others.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: dict[Heartbeat, float] = {}  # heartbeat -> monotonic time of its next renewal
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def add(self, heartbeat: Heartbeat, first: float) -> None:
        """Renew ``heartbeat`` ``first`` seconds from now, then every interval."""
        with self._changed:
            self._due[heartbeat] = time.monotonic() + first
            if self._thread is None:
                self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="heartbeat")
                self._thread = threading.Thread(target=self._schedule, name="heartbeats", daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            self._due.pop(heartbeat, None)

    def _schedule(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for heartbeat, due in list(self._due.items()):
                    if due <= now:
                        self._due[heartbeat] = now + heartbeat.policy.interval
                        assert self._pool is not None
                        try:
                            self._pool.submit(heartbeat.renew)
                        except RuntimeError:  # the interpreter is exiting and has shut the pool down
                            return
                following = min(self._due.values(), default=None)
                self._changed.wait(None if following is None else following - now)


_renewals = _Renewals()
keep(
    f"{__name__}._renewals",
    "one scheduling thread and a pool of 4, started with the first heartbeat",
    "a thread per instant would cost more than a commit",
    size=lambda: len(_renewals._due),
    clear=None,
)


def _renew_anew_after_fork() -> None:
    # A forked child has none of its parent's threads: it starts its own when it first needs them.
    global _renewals
    _renewals = _Renewals()


os.register_at_fork(after_in_child=_renew_anew_after_fork)


def abort_reason_of(cause: BaseException | None) -> str:
    """What :meth:`Heartbeat.mark_aborted` records for a write that gave up because of ``cause``."""
    if isinstance(cause, WriteConflictError):
        return "conflict"
    if isinstance(cause, LeaseLostError):
        return "lease-lost"
    if isinstance(cause, TxnAlreadyCommittedError):
        return "already-committed"
    return "error"
