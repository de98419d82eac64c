"""Told by the kernel (Linux inotify) instead of asking again: new files, and the names in a directory.

A writer waiting for the table lock would otherwise list ``.hoodie/locks/`` again and again: with eight
writers on a table, either the lock sits free between their polls or their polls eat the CPU the holder
needs. Elsewhere (no inotify, no more inotify instances left) :class:`NewFiles` simply sleeps, which is
what a poller does.

And a writer lists the timeline and the lock directory several times per commit, mostly while holding the
table lock: :class:`Listings` lists such a directory once and then applies the changes the kernel
reports, so a listing costs what the changes since the last one cost, not what the directory holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import re
import select
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

from cowrite.process import keep

log = logging.getLogger(__name__)

_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000  # events were lost: whatever was wanted may be among them
_IN_IGNORED = 0x8000  # the watch is gone (its directory was deleted, or it was removed)
_IN_ONLYDIR = 0x01000000
_ADDED = _IN_CREATE | _IN_MOVED_TO
_REMOVED = _IN_DELETE | _IN_MOVED_FROM
_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
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
keep(
    f"{__name__}._per_thread",
    "one inotify instance per thread that waited on a local file",
    "closing an instance makes the kernel wait a grace period, which a lock waiter would pay per acquire",
    size=lambda: int(_per_thread.fd is not None),
    clear=None,
)


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
    listings.reset()


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
        while _read_events(fd):  # events of earlier watches of this thread
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
        found = False
        for watch, mask, name in _pending_events(self._fd) if self._fd is not None else ():
            if mask & _IN_Q_OVERFLOW or (watch == self._watch and self.wanted(name)):
                found = True
        return found


def _read_events(fd: int) -> bytes:
    """The pending events of an inotify instance (whole events only), b"" when there are none."""
    try:
        return os.read(fd, 64 * 1024)
    except BlockingIOError:
        return b""


def _pending_events(fd: int) -> Iterator[tuple[int, int, str]]:
    """(watch, mask, name) of every pending event of an inotify instance, in order."""
    while data := _read_events(fd):
        offset = 0
        while offset + _EVENT.size <= len(data):
            watch, mask, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            yield watch, mask, os.fsdecode(data[offset : offset + length].rstrip(b"\0"))
            offset += length


# File systems all of whose changes pass through this kernel. On a network file system (NFS, SMB, FUSE
# mounts of object stores) another host changes a directory without an event here: list those each time.
_LOCAL_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "overlay"})


def _file_system_type(path: str) -> str:
    """The type of the file system ``path`` (resolved) lies on, from the mount table; "" if unknown."""
    best, kind = "", ""
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return ""
    return kind


@dataclass
class _Listing:
    directory: str
    watch: int
    inode: tuple[int, int]  # (device, inode) of the directory the watch is on
    keep: Callable[[str], bool]
    # The names as last returned, and the changes since: one set of the names, not a set and its copy
    # (a daemon keeps the listings of thousands of instants for each of its tables).
    snapshot: frozenset[str]
    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)

    def current(self) -> frozenset[str]:
        if self.added or self.removed:
            self.snapshot = (self.snapshot - self.removed) | self.added
            self.added, self.removed = set(), set()
        return self.snapshot


class Listings:
    """The names in local directories, listed once and then kept current from the kernel's events.

    ``names(directory, list_names, keep)`` returns what ``list_names()`` would return now, or None where
    the kernel cannot tell of every change (no inotify, a network file system): then the caller lists.
    No lock between processes is needed: the kernel queues the event of a change before the call that
    made it returns, so a change another process finished before ``names`` began is among the events
    read here. Events are applied in order onto a listing taken after its watch began, so one seen by
    both the listing and an event comes out the same. A lost event (queue overflow), a directory deleted,
    moved, or no longer at its path makes the next call list afresh.
    """

    # Two directories a table (its timeline and its locks): a daemon serving hundreds of tables keeps them
    # all; beyond that the least recently used goes. (A watch costs the kernel about a kilobyte.)
    MAX_DIRECTORIES = 1024

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every listing (a forked child: its parent's watches and lock are not its own)."""
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._failed = False
        self._by_directory: dict[str, _Listing] = {}  # least recently used first
        self._by_watch: dict[int, _Listing] = {}
        self._local: dict[str, bool] = {}

    def names(
        self, directory: str, list_names: Callable[[], Iterable[str]], keep: Callable[[str], bool]
    ) -> frozenset[str] | None:
        with self._lock:
            fd = self._instance()
            if fd is None or not self._is_local(directory):
                return None
            try:
                status = os.stat(directory)
            except OSError:
                return None  # missing: the caller's listing says so
            self._apply_events(fd)
            listing = self._by_directory.pop(directory, None)
            if listing is not None:
                self._by_directory[directory] = listing  # the most recently used, last
                if listing.inode != (status.st_dev, status.st_ino):
                    self._forget(listing)  # another directory is at this path now
                    listing = None
            if listing is None:
                listing = self._watch(fd, directory, (status.st_dev, status.st_ino), list_names, keep)
                if listing is None:
                    return None
            return listing.current()

    def forget_all(self) -> None:
        """Drop every kept listing (the next call lists afresh); the inotify instance stays."""
        with self._lock:
            for listing in list(self._by_directory.values()):
                self._forget(listing)

    def _instance(self) -> int | None:
        if self._fd is None and not self._failed and _libc is not None:
            fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                log.debug("no inotify instance for listings (%s): listing", os.strerror(ctypes.get_errno()))
                self._failed = True
                return None
            self._fd = fd
        return self._fd

    def _is_local(self, directory: str) -> bool:
        local = self._local.get(directory)
        if local is None:
            local = self._local[directory] = (
                _file_system_type(os.path.realpath(directory)) in _LOCAL_FILE_SYSTEMS
            )
        return local

    def _watch(
        self,
        fd: int,
        directory: str,
        inode: tuple[int, int],
        list_names: Callable[[], Iterable[str]],
        keep: Callable[[str], bool],
    ) -> _Listing | None:
        assert _libc is not None
        if len(self._by_directory) >= self.MAX_DIRECTORIES:
            self._forget(next(iter(self._by_directory.values())))
        mask = _ADDED | _REMOVED | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
        watch = _libc.inotify_add_watch(fd, os.fsencode(directory), mask)
        if watch < 0:
            log.debug("cannot watch %s (%s): listing", directory, os.strerror(ctypes.get_errno()))
            return None
        # listed after the watch began: every change from here on arrives as an event
        listing = _Listing(directory, watch, inode, keep, frozenset(list_names()))
        self._by_directory[directory] = self._by_watch[watch] = listing
        return listing

    def _forget(self, listing: _Listing) -> None:
        assert _libc is not None and self._fd is not None
        self._by_directory.pop(listing.directory, None)
        if self._by_watch.pop(listing.watch, None) is not None:
            _libc.inotify_rm_watch(self._fd, listing.watch)

    def _apply_events(self, fd: int) -> None:
        for watch, mask, name in _pending_events(fd):
            if mask & _IN_Q_OVERFLOW:
                for lost in list(self._by_directory.values()):
                    self._forget(lost)
            elif (listing := self._by_watch.get(watch)) is None:
                continue
            elif mask & _GONE:
                self._forget(listing)
            elif mask & _ADDED and listing.keep(name):
                listing.added.add(name)
                listing.removed.discard(name)
            elif mask & _REMOVED:
                listing.removed.add(name)
                listing.added.discard(name)


listings = Listings()
keep(
    f"{__name__}.listings",
    f"{Listings.MAX_DIRECTORIES:,} directories, least recently used dropped",
    "the kernel reports every change to a watched local directory, so its listing stays current",
    size=lambda: len(listings._by_directory),
    clear=listings.forget_all,
)
