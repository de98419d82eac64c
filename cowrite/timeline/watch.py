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
import time
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


class NewFiles:
    """``with NewFiles(directory, wanted) as new_files: ... new_files.wait(seconds)``.

    ``wait`` returns once a file whose name ``wanted`` accepts was created in (or renamed into)
    ``directory`` since the watch began or since the last ``wait``, or after ``seconds``. Files created
    before the watch began are not seen: look at the directory after entering, then wait. Without a
    directory (a storage that cannot tell), ``wait`` sleeps.
    """

    def __init__(self, directory: str | None, wanted: Callable[[str], bool] = lambda name: True) -> None:
        self.directory = directory
        self.wanted = wanted
        self.woken = False
        self._fd: int | None = None
        self._directory_fd: int | None = None  # flocked for a turn

    def __enter__(self) -> NewFiles:
        if _libc is None or self.directory is None:
            return self
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.debug("no inotify for %s (%s): polling", self.directory, os.strerror(ctypes.get_errno()))
            return self
        if _libc.inotify_add_watch(fd, os.fsencode(self.directory), _IN_CREATE | _IN_MOVED_TO) < 0:
            log.debug("cannot watch %s (%s): polling", self.directory, os.strerror(ctypes.get_errno()))
            os.close(fd)
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
        for fd in (self._fd, self._directory_fd):
            if fd is not None:
                os.close(fd)
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
        try:
            data = os.read(self._fd, 64 * 1024) if self._fd is not None else b""
        except BlockingIOError:
            return False
        found, offset = False, 0
        while offset + _EVENT.size <= len(data):
            _, mask, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            name = data[offset : offset + length].rstrip(b"\0")
            offset += length
            found = found or bool(mask & _IN_Q_OVERFLOW) or self.wanted(os.fsdecode(name))
        return found
