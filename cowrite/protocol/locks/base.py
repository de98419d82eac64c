"""The lock interface every provider implements, and the in-process provider."""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import TracebackType

from cowrite.errors import CorruptTimelineError, LeaseLostError, LockTimeoutError
from cowrite.process import keep
from cowrite.protocol.retry import RetryPolicy


class RequestPublished(Exception):  # noqa: N818 (an outcome, not an error)
    """Ends a wait for the lock: the holder of a turn published the waiter's :attr:`TableLock.request`
    (group commit, :mod:`cowrite.protocol.group`). ``noted``: the note that names its completed file."""

    def __init__(self, noted: str) -> None:
        super().__init__(f"the commit this waiter handed over was published: {noted}")
        self.noted = noted


@dataclass(frozen=True)
class Standing:
    """How a writer's turn of the lock may stand once its commit is published, taking the commits other
    writers hand it over a connection (:mod:`cowrite.protocol.standing`)."""

    most: float  # seconds a turn stands at most
    idle: float  # seconds it stands with no commit handed to it
    address: str  # the address of this host where a standing turn listens


def _new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock, written into the lock's payload so operators and expiry can see it.

    ``instant`` is the instant the holder works for; its heartbeat proves the holder alive. A holder
    without an instant (taking a new instant time) is judged by the age of the lock itself.
    """

    owner: str = field(default_factory=_new_owner)
    instant: str | None = None
    waited_ms: int = 0  # how long the holder waited for the lock (what the daemon reports as lock waits)

    def for_instant(self, instant: str) -> LockHolder:
        return replace(self, instant=instant)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> LockHolder:
        try:
            payload = json.loads(data)
            owner, instant, waited = payload["owner"], payload.get("instant"), payload.get("waited_ms", 0)
            if not isinstance(owner, str) or not (instant is None or isinstance(instant, str)):
                raise TypeError("owner and instant must be strings")
            if not isinstance(waited, int):
                raise TypeError("waited_ms must be an integer")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CorruptTimelineError(path, f"not a lock payload ({exc})") from None
        return cls(owner=owner, instant=instant, waited_ms=waited)


class TableLock(ABC):
    """A mutual-exclusion lock on one table, held by one :class:`LockHolder` at a time.

    ``acquire`` raises :class:`LockTimeoutError` when ``timeout`` (seconds; None = the retry policy's
    deadline) passes; ``release`` is safe to call twice and when not held; ``check_held`` raises
    :class:`LeaseLostError` if the lock was lost while held.
    """

    def __init__(self, holder: LockHolder, retry: RetryPolicy | None = None) -> None:
        self.holder = holder
        self.retry = retry or RetryPolicy(deadline=60.0)
        # Told, while this object asks for the lock, what the turns so far published (completed file
        # names by turn), where the provider can tell, and whether the lock is another's (True) or is
        # being taken beside (False): a writer reads those commits then, rather than once it holds the
        # lock. While the lock is another's, what it raises ends the wait; beside a take it must not
        # raise, as the lock may be this object's by then.
        self.on_published: Callable[[Mapping[int, tuple[str, ...]], bool], None] | None = None
        # A waiter's commit, for a holder ahead of it to publish with its own where the provider queues
        # waiters (group commit, :mod:`cowrite.protocol.group`); :attr:`requested` tells whether it was
        # handed over.
        self.request: bytes | None = None
        self.requested = False
        # Where the provider lets a turn stand after its holder's commit (:mod:`cowrite.protocol.standing`)
        # and this writer hands its commit to a standing turn it finds; None where it does neither.
        self.standing: Standing | None = None

    @abstractmethod
    def acquire(self, timeout: float | None = None) -> None: ...

    @abstractmethod
    def release(self) -> None: ...

    @abstractmethod
    def check_held(self) -> None: ...

    @property
    @abstractmethod
    def is_held(self) -> bool: ...

    @property
    def lock_id(self) -> int | None:
        """The id of the turn this object holds, where the provider numbers turns; else None."""
        return None

    # -- turns: for providers that can tell whether anybody held the lock between two moments ---------
    def turn(self) -> int | None:
        """A name for the last turn of the lock that has ended, None when the provider cannot tell. A
        writer notes it before listing the timeline; see :meth:`published_since`."""
        return None

    def acquire_next(self, turn: int | None) -> bool:
        """Take the lock if its next turn is the one right after ``turn``, with one try and no waiting;
        False (not held) when another turn came in between, the lock was held when ``turn`` was noted,
        or the provider cannot tell."""
        return False

    def published_since(self, turn: int | None) -> list[str] | None:
        """What the turns between ``turn`` and the one this object holds published — the completed
        instants' file names, in turn order; empty when this is the very next turn — if every one of
        them was a writer's turn that noted it (:meth:`note_published`); else None, also when the
        provider cannot tell.

        Everything that changes the completed part of the timeline — a commit, a rollback, a clean, an
        archival — happens in a turn of the lock; so a timeline listed after ``turn`` was noted, with
        these instants completed, is the timeline now.
        """
        return None

    def note_published(
        self, published: str | None, grouped: Sequence[str] = (), served: Sequence[int] = ()
    ) -> None:
        """Note, for later holders, that this turn published the completed file ``published`` (None:
        nothing), then those of waiters ``grouped`` (in completion order; ``served``: their places, from
        :meth:`requests`), and changed nothing else: call once those files exist, before :meth:`release`,
        at most once a turn. The release tells them; a turn released without a note makes them list the
        timeline."""
        return None  # a provider without turns has nobody to tell

    def note_grouped(self, grouped: str) -> None:
        """Begin the note of a waiter's commit ``grouped`` now, beside the create of its completed file:
        the turn's release, made once both exist, is what makes either count."""
        return None

    def requests(self) -> list[tuple[int, bytes]]:
        """The :attr:`request` of every waiter queued behind the holder, with its place, in the order of
        the queue; empty where the provider does not queue waiters."""
        return []

    def _policy(self, timeout: float | None) -> RetryPolicy:
        return self.retry if timeout is None else replace(self.retry, deadline=timeout)

    def __enter__(self) -> TableLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class InProcessLock(TableLock):
    """A lock shared by the threads of one process, keyed by table URI."""

    _registry_lock = threading.Lock()
    _locks: dict[str, threading.Lock] = {}
    _holders: dict[str, LockHolder] = {}  # who holds each key, for timeout errors

    def __init__(self, key: str, holder: LockHolder, retry: RetryPolicy | None = None) -> None:
        super().__init__(holder, retry)
        with self._registry_lock:
            self._lock = self._locks.setdefault(key, threading.Lock())
        self.key = key
        self._held = False

    def acquire(self, timeout: float | None = None) -> None:
        deadline = self._policy(timeout).deadline
        if not self._lock.acquire(timeout=-1 if deadline is None else deadline):
            holder = self._holders.get(self.key)
            held_by = f"{holder.owner} (instant {holder.instant or 'none'})" if holder else "another thread"
            raise LockTimeoutError(
                f"in-process lock on {self.key} not acquired within {deadline} s: held by {held_by}. "
                "Wait and retry; that thread releases it when its lock section ends"
            )
        self._holders[self.key] = self.holder
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._holders.pop(self.key, None)
            self._lock.release()

    def check_held(self) -> None:
        if not self._held:
            raise LeaseLostError(f"in-process lock on {self.key} is not held by {self.holder.owner}")

    @property
    def is_held(self) -> bool:
        return self._held


keep(
    f"{__name__}.InProcessLock",
    "one lock per table this process locked in-process",
    "threads of one process share the lock of a table",
    size=lambda: len(InProcessLock._locks),
    clear=None,
)
