"""Table locks: one small interface, several providers.

**What happens when the lock is lost.** A holder loses its lock when its heartbeat goes stale (it paused or
died) and a contender or the daemon expires it, or when its ZooKeeper session ends. Losing the lock never
corrupts the table by itself: the holder checks :meth:`TableLock.check_held` as the last step before it
publishes a completed instant and raises :class:`~cowrite.errors.LeaseLostError` instead — or, where
only local work came after the listing that showed the lock taken (a writer that need not list the
timeline again, see :meth:`TableLock.published_since`), that listing is the check. The remaining window
(a pause between that check and the atomic create of the completed file) is bounded by the safety
margin the writer keeps on its lease (``cowrite.lease.safety.margin.ms``).

Providers: :class:`~cowrite.protocol.locks.filesystem.FileSystemLock` (lock files under
``.hoodie/locks/``, RFC-22 option 2, any storage with atomic create), ZooKeeper
(:class:`~cowrite.protocol.locks.zookeeper.ZooKeeperLock`, through kazoo), and
:class:`~cowrite.protocol.locks.base.InProcessLock` for threads of one process.
"""

from cowrite.protocol.locks.base import InProcessLock, LockHolder, RequestPublished, TableLock
from cowrite.protocol.locks.factory import lock_for

__all__ = ["InProcessLock", "LockHolder", "RequestPublished", "TableLock", "lock_for"]
