"""A turn of the lock that stands: once its holder's commit and those queued behind it are published
(:mod:`.group`), the holder keeps the lock for as long as commits come, and publishes each commit a
waiter hands it over a connection (:mod:`.locks.handover`) as it comes.

On an object store a turn of the lock costs several round trips one after another (a create, a listing,
the note), so turns bound a table's commits per second however many writers there are. A standing turn
publishes a commit handed to it with one create: it needs no listing, since nobody else publishes while
it holds the lock, and the timeline it knew at its commit, with what it published since, is the timeline.

- **Where.** Only where the lock lets turns stand (:attr:`~.locks.base.TableLock.standing`: the filesystem
  lock on an object store, ``cowrite.lock.standing.ms`` above 0). The holder listens on
  ``cowrite.lock.standing.address`` and names the address in ``lock<id>.serves``.
- **What it publishes.** A commit handed to it is checked as one queued behind the turn is
  (:func:`.group.publish_one`): refused commits are left to their writers, who go on through the store.
- **How long.** Until ``cowrite.lock.standing.idle.ms`` pass with no commit, or until
  ``cowrite.lock.standing.ms`` after it began to stand; a process that exits waits for that. Its writer's
  heartbeat goes on meanwhile, and each create is made only while the writer's lease holds with the safety
  margin to spare, as the holder's own commit was: waiters judge the holder by that heartbeat, so no
  commit is published after the lock may have expired.
- **How it ends.** It stops taking commits and refuses those not yet published, notes every commit it
  published, releases the lock and stops its writer's heartbeat. A create that failed midway ends it at
  once, unnoted: later holders list the timeline. A holder killed while its turn stands leaves the lock to
  expire as any dead holder does; its waiters find the connection broken and learn from the timeline
  whether their commits were published.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial

from cowrite.errors import CowriteError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol import group
from cowrite.protocol.heartbeat import Heartbeat
from cowrite.protocol.locks import TableLock
from cowrite.protocol.locks.handover import (
    COMMIT,
    NOTES,
    PUBLISHED,
    REFUSED,
    UNKNOWN,
    Answer,
    Listener,
    forget,
    learn,
)
from cowrite.protocol.locks.lock_files import serves_path
from cowrite.storage.together import before_finishing, in_background

log = logging.getLogger(__name__)

_STANDING: set[threading.Thread] = set()  # this process's standing turns
_ENDING = threading.Event()  # set when the process exits: no turn begins to stand any more


def publish_waiting(
    table: Table,
    lock: TableLock,
    timeline: Timeline,
    own: tuple[Instant, CommitMetadata],
    waiting: list[tuple[int, bytes]],
    clock: Callable[[], float],
    heartbeat: Heartbeat,
) -> bool:
    """:func:`.group.publish_waiting`, then let the turn stand where the lock allows it: True when it
    stands, and then its own thread notes the turn, releases the lock and stops ``heartbeat``; False when
    the turn was noted here (or ended unnoted) and its holder releases the lock and stops the heartbeat."""
    turn = group.publish_waiting(table, lock, timeline, own, waiting, clock, heartbeat.check)
    if turn is None:
        return False
    if lock.standing is not None and lock.lock_id is not None and not _ENDING.is_set():
        try:
            _StandingTurn(table, lock, timeline, turn, clock, heartbeat)
            return True
        except OSError as exc:  # the address cannot be listened on: the commit stands all the same
            log.warning("the turn of lock%d on %s cannot stand: %s", lock.lock_id, table, exc)
    turn.note(lock)
    return False


class _StandingTurn:
    def __init__(
        self,
        table: Table,
        lock: TableLock,
        timeline: Timeline,
        turn: group.Turn,
        clock: Callable[[], float],
        heartbeat: Heartbeat,
    ) -> None:
        assert lock.standing is not None and lock.lock_id is not None
        self.table, self.lock, self.turn, self.heartbeat = table, lock, turn, heartbeat
        self.publish = partial(
            group.publish_one, table, lock, timeline, turn, clock=clock, check=heartbeat.check
        )
        self.lock_id, self.until = lock.lock_id, time.monotonic() + lock.standing.most
        self.idle = lock.standing.idle
        self._inbox: queue.Queue[tuple[bytes, Answer]] = queue.Queue()
        self._taking = threading.Lock()  # a commit is queued only while the turn takes commits
        self._ended = False
        self.listener = Listener(lock.standing.address, self.lock_id, self._take)
        learn(table.storage.uri, self.lock_id, self.listener.address)
        serves = partial(
            table.storage.create_if_absent, serves_path(self.lock_id), self.listener.address.to_bytes()
        )
        in_background(table.storage, serves, "naming the address of a standing turn")
        self.thread = threading.Thread(target=self._stand, name=f"cowrite-standing-lock{self.lock_id}")
        _STANDING.add(self.thread)
        self.thread.start()

    def _take(self, kind: str, payload: bytes, answer: Answer) -> None:
        """A waiter's message (on its connection's thread): notes are told at once, commits queued."""
        if kind == NOTES:
            wanted = set(payload.decode(errors="replace").split())
            known = [note for note in self.turn.notes if note.partition("_")[0] in wanted]
            answer("\t".join([NOTES, *known]))
            return
        with self._taking:
            if kind == COMMIT and not self._ended:
                self._inbox.put((payload, answer))
                return
        answer(f"{REFUSED}\tthe turn ended")

    def _stand(self) -> None:
        noted = False  # a turn is noted only once every create it made is known to have acted, or not
        try:
            while (taken := self._next()) is not None:
                data, answer = taken
                try:
                    why = self.publish(data)
                except Exception as exc:  # its create may have acted: its writer and later holders look
                    answer(f"{UNKNOWN}\t{exc}")
                    return
                if why is None:  # the note naming it first, then all the turn's
                    notes = self.turn.notes
                    answer("\t".join([PUBLISHED, notes[-1], *notes]))
                else:
                    answer(f"{REFUSED}\t{why}")
            noted = True
        finally:
            self._end(noted)

    def _next(self) -> tuple[bytes, Answer] | None:
        """The next commit handed over; None once the turn is to end."""
        left = self.until - time.monotonic()
        if left <= 0:
            return None
        try:
            return self._inbox.get(timeout=min(self.idle, left))
        except queue.Empty:
            return None

    def _end(self, noted: bool) -> None:
        with self._taking:
            self._ended = True
        self.listener.close()
        forget(self.table.storage.uri, self.lock_id)
        while True:
            try:
                _, answer = self._inbox.get_nowait()
            except queue.Empty:
                break
            answer(f"{REFUSED}\tthe turn ended")
        if noted:
            self.turn.note(self.lock)
        try:
            self.lock.release()
        except CowriteError as exc:
            log.warning("could not release the lock of %s (it expires by itself): %s", self.table, exc)
        try:
            self.heartbeat.stop(delete=True)
        except CowriteError as exc:  # the cleaner collects a stray heartbeat
            log.warning("could not delete the heartbeat of %s: %s", self.heartbeat.instant, exc)
        _STANDING.discard(self.thread)


def end_standing_turns() -> None:
    """Let no more turns stand, and wait until every standing turn of this process has ended and released
    its lock: at exit, before the work made in the background is waited for. A turn goes on while commits
    come, so that its waiters are not sent back to the store all at once, within its length."""
    _ENDING.set()
    for thread in list(_STANDING):
        thread.join()


before_finishing(end_standing_turns)
