"""Waiting for a new file in a local directory, woken by the kernel (Linux inotify) instead of polling.

A writer waiting for the table lock would otherwise list ``.hoodie/locks/`` again and again: with eight
writers on a table, either the lock sits free between their polls or their polls eat the CPU the holder
needs. Elsewhere (no inotify, no more inotify instances left) :class:`NewFiles` simply sleeps, which is
what a poller does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import select
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

log = logging.getLogger(__name__)

_IN_CREATE = 0x100
_IN_MOVED_TO = 0x80
_IN_Q_OVERFLOW = 0x4000  # events were lost: whatever was wanted may be among them
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "inotify_init1") else None  # Linux only


_libc = _load_libc()


class _PerThread(threading.local):
    # One inotify instance per thread, kept for the thread's life: closing one makes the kernel wait for a
    # grace period (milliseconds), which a lock waiter would otherwise pay on every acquire, holding the
    # lock. A watch is added and removed per wait instead, which costs next to nothing.
    fd: int | None = None


_per_thread = _PerThread()


def _inotify() -> int | None:
    fd = _per_thread.fd
    if fd is None and _libc is not None:
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.debug("no inotify instance (%s): polling", os.strerror(ctypes.get_errno()))
            return None
        _per_thread.fd = fd
        weakref.finalize(threading.current_thread(), os.close, fd)
    return fd


def _forget_after_fork() -> None:
    # A forked child shares its parent's instances: it makes its own rather than steal their events.
    global _per_thread
    _per_thread = _PerThread()


os.register_at_fork(after_in_child=_forget_after_fork)


class NewFiles:
    """``with NewFiles(directory, wanted) as new_files: ... new_files.wait(seconds)``.

    ``wait`` returns once a file whose name ``wanted`` accepts was created in (or renamed into)
    ``directory`` since the watch began or since the last ``wait``, or after ``seconds``. Files created
    before the watch began are not seen: look at the directory after entering, then wait. Without a
    directory (a storage that cannot tell), ``wait`` sleeps. A thread watches one directory at a time
    (its watches share the thread's inotify instance).
    """

    def __init__(self, directory: str | None, wanted: Callable[[str], bool] = lambda name: True) -> None:
        self.directory = directory
        self.wanted = wanted
        self.woken = False
        self._fd: int | None = None  # this thread's inotify instance, while watching
        self._watch = -1
        self._directory_fd: int | None = None  # flocked for a turn

    def __enter__(self) -> NewFiles:
        fd = _inotify() if self.directory is not None else None
        if fd is None or self.directory is None or _libc is None:
            return self
        while self._read(fd):  # events of earlier watches of this thread
            pass
        self._watch = _libc.inotify_add_watch(fd, os.fsencode(self.directory), _IN_CREATE | _IN_MOVED_TO)
        if self._watch < 0:
            log.debug("cannot watch %s (%s): polling", self.directory, os.strerror(ctypes.get_errno()))
            return self
        self._fd = fd
        try:
            self._directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            log.debug("cannot open %s (%s): every waiter takes its turn", self.directory, exc)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None and _libc is not None:
            _libc.inotify_rm_watch(self._fd, self._watch)
        if self._directory_fd is not None:
            os.close(self._directory_fd)
        self._fd = self._directory_fd = None

    def wait(self, seconds: float) -> None:
        """Wait; afterwards :attr:`woken` tells whether a wanted file ended it (False: time ran out)."""
        self.woken = False
        if self._fd is None:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready and self._created():
                self.woken = True
                return

    @contextmanager
    def turn(self) -> Iterator[bool]:
        """Of the waiters woken by the same file (in every process of this host), let one act first.

        Yields True to the one holding the turn, False to the others meanwhile: they can wait again
        instead of all doing the same work at once. The turn is an advisory lock on the directory, held
        only while acting, and freed by the kernel if its holder dies.
        """
        if self._directory_fd is None:
            yield True
            return
        try:
            fcntl.flock(self._directory_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(self._directory_fd, fcntl.LOCK_UN)

    def _created(self) -> bool:
        """Whether the pending events name a wanted file (and consume them)."""
        found, offset = False, 0
        data = self._read(self._fd) if self._fd is not None else b""
        while offset + _EVENT.size <= len(data):
            watch, mask, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            name = data[offset : offset + length].rstrip(b"\0")
            offset += length
            if mask & _IN_Q_OVERFLOW or (watch == self._watch and self.wanted(os.fsdecode(name))):
                found = True
        return found

    @staticmethod
    def _read(fd: int) -> bytes:
        try:
            return os.read(fd, 64 * 1024)
        except BlockingIOError:
            return b""
