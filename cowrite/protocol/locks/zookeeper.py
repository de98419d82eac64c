"""The ZooKeeper table lock, through kazoo's lock recipe (an ephemeral sequential node per contender).

**What happens when the lock is lost.** The lock lives as long as the holder's ZooKeeper session: when the
connection is suspended or the session is lost (expired, closed), the node may be gone or about to be, and
another contender may take the lock. A connection-state listener marks the lock lost on SUSPENDED or LOST;
from then on :meth:`ZooKeeperLock.check_held` raises :class:`~cowrite.errors.LeaseLostError`, even
if the connection comes back, so a writer never publishes on a lock it may have lost.

Nodes are named like Apache Curator's ``InterProcessMutex`` (``<uuid>-lock-<sequence>``) and Curator's
contenders are recognised, so writers using Hudi's ``ZookeeperBasedLockProvider`` on the same
``base_path/lock_key`` and these locks should exclude each other (not tested against Java writers). Each node
holds the holder's payload (:meth:`LockHolder.to_bytes`), which names it in timeout errors.
"""

from __future__ import annotations

import logging
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, LockTimeout
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.recipe.lock import Lock

from cowrite.errors import CorruptTimelineError, LeaseLostError, LockTimeoutError
from cowrite.protocol.locks.base import LockHolder, TableLock
from cowrite.protocol.retry import RetryPolicy

log = logging.getLogger(__name__)


class _CuratorCompatibleLock(Lock):
    # Curator's InterProcessMutex orders children by what follows "lock-"; kazoo by what follows its node
    # name. With this name both see the same sequence numbers and the same order.
    _NODE_NAME = "-lock-"
    _EXCLUDE_NAMES = ["-lock-"]


class ZooKeeperLock(TableLock):
    """The table lock as a kazoo lock on node ``path`` of the ZooKeeper ensemble ``hosts``.

    ``acquire`` connects (a new session per acquisition) and raises :class:`LockTimeoutError` naming the
    holder when the lock is not taken in time, or naming the hosts when ZooKeeper cannot be reached within
    ``connection_timeout``. ``release`` deletes the node and closes the session; it is safe to call twice
    and when not held. Timeouts are in seconds.
    """

    def __init__(
        self,
        hosts: str,
        path: str,
        holder: LockHolder,
        retry: RetryPolicy | None = None,
        session_timeout: float = 60.0,
        connection_timeout: float = 15.0,
    ) -> None:
        super().__init__(holder, retry)
        self.hosts = hosts
        self.path = path
        self.session_timeout = session_timeout
        self.connection_timeout = connection_timeout
        self._client: KazooClient | None = None
        self._lock: _CuratorCompatibleLock | None = None
        self._held = False
        self._lost: str | None = None
        self._state_lock = threading.Lock()

    @property
    def client(self) -> KazooClient | None:
        """The session of the current acquisition, None when not held."""
        return self._client

    @property
    def is_held(self) -> bool:
        return self._held and self._lost is None

    def acquire(self, timeout: float | None = None) -> None:
        deadline = self._policy(timeout).deadline
        started = time.monotonic()
        client = KazooClient(hosts=self.hosts, timeout=self.session_timeout)
        client.add_listener(self._on_state)
        try:
            client.start(timeout=self.connection_timeout)
        except KazooTimeoutError:
            self._close(client)
            raise LockTimeoutError(
                f"ZooKeeper at {self.hosts} not reachable within {self.connection_timeout} s, so the table "
                f"lock {self.path} was not acquired. Check that the hosts (hoodie.write.lock.zookeeper.url/"
                "port) are right and the ensemble is up"
            ) from None
        lock = _CuratorCompatibleLock(client, self.path, identifier=self.holder.to_bytes().decode())
        with self._state_lock:
            self._lost = None
        remaining = None if deadline is None else max(0.0, deadline - (time.monotonic() - started))
        try:
            acquired = lock.acquire(timeout=remaining)
        except LockTimeout:
            acquired = False
        except KazooException as exc:
            self._close(client)
            raise LockTimeoutError(
                f"table lock {self.path} on ZooKeeper {self.hosts} not acquired: {exc!r}. Retry the write"
            ) from exc
        if not acquired:
            holder = self._describe_holder(lock)
            self._close(client)
            raise LockTimeoutError(
                f"table lock {self.path} on ZooKeeper {self.hosts} not acquired within {deadline} s: held by "
                f"{holder}. Wait and retry; if that holder is dead, its node goes when its session expires "
                f"(after its session timeout)"
            )
        with self._state_lock:
            previous = self._client
            self._client, self._lock, self._held = client, lock, True
            if client.state != KazooState.CONNECTED and self._lost is None:
                self._lost = f"connection was {client.state} right after the lock was taken"
        if previous is not None:
            # Acquired again after losing the previous session (not re-entrant otherwise: our own node
            # would have blocked us); that session's node is gone or goes with it.
            self._close(previous)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's event thread: record, never block.
        if state in (KazooState.LOST, KazooState.SUSPENDED):
            with self._state_lock:
                if self._lost is None:
                    self._lost = f"ZooKeeper session was {state.lower()}"
            log.warning("ZooKeeper lock %s of %s: session %s", self.path, self.holder.owner, state)

    @staticmethod
    def _describe_holder(lock: Lock) -> str:
        try:
            contenders = lock.contenders()
        except KazooException as exc:
            return f"an unknown holder ({exc!r})"
        if not contenders:
            return "nobody any more (it was just released)"
        try:
            holder = LockHolder.from_bytes(contenders[0].encode(), lock.path)
        except CorruptTimelineError:
            return f"a holder with payload {contenders[0]!r} (not a cowrite writer)"
        return f"{holder.owner} (instant {holder.instant or 'none'})"

    def release(self) -> None:
        with self._state_lock:
            client, lock, lost = self._client, self._lock, self._lost
            self._client, self._lock, self._held = None, None, False
        if client is None:
            return
        # Without a live connection a delete would wait for one; closing the session removes the
        # ephemeral node just the same.
        if lock is not None and lost is None and client.connected:
            try:
                lock.release()
            except KazooException as exc:
                # The node is ephemeral: closing the session below removes it anyway.
                log.warning("ZooKeeper lock %s: release failed (%r); closing the session", self.path, exc)
        self._close(client)

    def check_held(self) -> None:
        with self._state_lock:
            held, lost, client, lock = self._held, self._lost, self._client, self._lock
        if not held or client is None or lock is None:
            raise LeaseLostError(f"ZooKeeper lock {self.path} is not held by {self.holder.owner}")
        if lost is None:
            try:
                if client.exists(f"{self.path}/{lock.node}") is None:
                    lost = "its node was deleted"
            except KazooException as exc:
                lost = f"ZooKeeper cannot confirm it ({exc!r})"
        if lost is not None:
            raise LeaseLostError(
                f"ZooKeeper lock {self.path} of {self.holder.owner} (instant "
                f"{self.holder.instant or 'none'}) was lost: {lost}. Whatever it did must not be published"
            )

    def _close(self, client: KazooClient) -> None:
        # Stopping ends the session with LOST; that is not news about a lock this object may hold later.
        client.remove_listener(self._on_state)
        try:
            client.stop()
        finally:
            client.close()
