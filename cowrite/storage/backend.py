"""Storage: the few file operations a table needs, over any fsspec file system.

Paths given to a :class:`Storage` are relative to its root (the table's base path) and use ``/``.

Contract, on every backend:

- :meth:`Storage.create_if_absent` is atomic: among any number of processes creating the same path, exactly
  one gets ``True``, and no reader ever sees the file partly written. It is never check-then-write:
  local disk links a fully written temporary file into place (``link`` fails if the name exists), S3 sends
  a conditional ``PUT`` with ``If-None-Match: *``, memory holds a process-wide lock (memory file systems
  are process-local anyway).
- :meth:`Storage.write` replaces a file whole: readers see the old or the new content, not a mix.
- :meth:`Storage.read` and :meth:`Storage.stat` raise :class:`FileNotFoundError` for a missing file.
- :meth:`Storage.delete` of a missing file is not an error (deletes are retried by cleaners).
- :meth:`Storage.list_after` returns, sorted by name, the files of a directory whose names sort after a
  given name; what it shows of files created or deleted while it lists is what :meth:`Storage.list` shows.
- Any other failure of the backend raises :class:`~cowrite.errors.StorageError` naming the path.
"""

from __future__ import annotations

import builtins
import os
import threading
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from typing import IO, Any, TypeVar

import fsspec
from fsspec import AbstractFileSystem

from cowrite.errors import StorageError
from cowrite.storage import s3
from cowrite.storage.inotify import NewFiles, listings

T = TypeVar("T")

# s3fs passes botocore's own errors (endpoint unreachable, timeouts) through untranslated; they are not
# OSErrors, and without this they would escape the contract as raw botocore exceptions.
_BACKEND_ERRORS: tuple[type[Exception], ...] = (OSError,)
try:
    from botocore.exceptions import BotoCoreError

    _BACKEND_ERRORS += (BotoCoreError,)
except ImportError:
    pass

# Temporary files of atomic local writes start with this prefix; listings skip them.
_TEMP_PREFIX = ".cowrite-tmp-"


@dataclass(frozen=True)
class FileInfo:
    path: str  # relative to the storage root
    size: int
    # Seconds since the epoch: the latest moment the file may have been written. Where the storage keeps
    # coarser times (S3: whole seconds, cut down), the end of that span, so that every age measured from
    # it (a heartbeat's, a lock's) errs young: a judge never finds a lease older than its holder does.
    modified: float

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class Storage:
    """A table's files on one fsspec file system, rooted at the table's base path."""

    # Whether each call is a network round trip, so that reads needed together are worth making at once.
    round_trips = True
    # How coarse the modification times it keeps are, in seconds: FileInfo.modified adds it to the time
    # kept, the start of such a span, to give the span's end.
    clock_resolution = 0.0
    # Whether list_after is one request for a directory's tail (object stores), which a timeline that a
    # writer lists again and again is worth listing that way (cowrite.format.timeline, Tails).
    lists_tails = False

    def __init__(
        self, fs: AbstractFileSystem, root: str, uri: str, options: dict[str, Any] | None = None
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.uri = uri
        self.options = dict(options or {})  # what for_uri was given: enough to open it again elsewhere

    @staticmethod
    def for_uri(uri: str, **options: Any) -> Storage:
        """Storage for ``uri`` (a local path, ``memory://...``, ``s3://bucket/...``).

        For S3, endpoint and credentials come from the usual AWS environment variables
        (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) or from ``options``, passed to s3fs.
        """
        protocol, _, rest = uri.partition("://")
        if not rest:
            protocol, rest = "file", os.path.abspath(uri)
        if protocol in ("s3", "s3a"):
            protocol = "s3"
            # Listing caches would hide instants other writers just created.
            options.setdefault("use_listings_cache", False)
        try:
            fs = s3.filesystem(options) if protocol == "s3" else fsspec.filesystem(protocol, **options)
        except (ImportError, ValueError) as exc:
            raise StorageError(f"cannot open storage for {uri}: {exc}") from exc
        root = fs._strip_protocol(uri if protocol != "file" else rest)
        backend = {"file": LocalStorage, "memory": MemoryStorage, "s3": S3Storage}.get(protocol, Storage)
        return backend(fs, root, uri if protocol != "file" else rest, options)

    def portable_options(self) -> dict[str, Any]:
        """Options that open this storage in another process, on another machine (a Spark executor): what
        this process would otherwise take from its environment is resolved here and written out."""
        return dict(self.options)

    # -- paths -----------------------------------------------------------------------------------
    def full_path(self, path: str) -> str:
        """The absolute location of ``path``; a path that would leave the root is refused.

        Paths come from stored files too (plans, overlays, write stats): a forged ``../`` must never make
        a cleaner delete, or a reader read, anything outside the table.
        """
        if not stays_inside(path):
            raise StorageError(f"refusing path {path!r}: it leaves the table at {self.uri}")
        return f"{self.root}/{path}" if path else self.root

    def relative(self, full_path: str) -> str:
        stripped = self.fs._strip_protocol(full_path).rstrip("/")
        return stripped[len(self.root) + 1 :] if stripped.startswith(self.root + "/") else stripped

    def child(self, path: str) -> Storage:
        """Storage rooted at a sub-directory."""
        return type(self)(self.fs, self.full_path(path), f"{self.uri.rstrip('/')}/{path}", self.options)

    # -- operations ------------------------------------------------------------------------------
    def read(self, path: str) -> bytes:
        return self._call(path, lambda: self.fs.cat_file(self.full_path(path)))

    def write(self, path: str, data: bytes) -> None:
        self._call(path, lambda: self.fs.pipe_file(self.full_path(path), data))

    def names(self, directory: str = "") -> builtins.list[str]:
        """Names of the files directly inside ``directory``, when sizes and times are not needed."""
        return [info.name for info in self.list(directory)]

    def watched_names(self, directory: str) -> frozenset[str]:
        """What :meth:`names` gives, for a directory listed again and again (the timeline, the lock
        directory): a storage that is told of changes (local disk) keeps that listing current instead."""
        return frozenset(self.names(directory))

    def new_files(self, directory: str, wanted: Callable[[str], bool] = lambda name: True) -> NewFiles:
        """A watch whose ``wait`` returns early once a file ``wanted`` accepts appears in ``directory``,
        where the storage can tell (local disk); elsewhere it sleeps."""
        return NewFiles(None)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists. True if this call created it."""
        raise StorageError(f"{type(self.fs).__name__} offers no atomic create; cowrite cannot use {self.uri}")

    def list(self, directory: str = "") -> builtins.list[FileInfo]:
        """Files directly inside ``directory`` (not sub-directories); empty if it does not exist. A file
        deleted while the directory is listed may be left out, and no other is."""
        try:
            entries = self._call(directory, lambda: self.fs.ls(self.full_path(directory), detail=True))
        except FileNotFoundError:
            return []
        return [self._info(e) for e in entries if e["type"] == "file" and not _is_temp(e["name"])]

    def list_after(self, directory: str, after: str) -> builtins.list[FileInfo]:
        """Files directly inside ``directory`` whose names sort after ``after`` (byte order, as object stores
        list), sorted by name; empty if the directory does not exist. For a follower that knows a long
        directory up to some name: on an object store, a request for its tail, not one per 1,000 names."""
        return sorted((info for info in self.list(directory) if info.name > after), key=attrgetter("name"))

    def list_dirs(self, directory: str = "") -> builtins.list[str]:
        """Relative paths of the sub-directories directly inside ``directory``."""
        try:
            entries = self._call(directory, lambda: self.fs.ls(self.full_path(directory), detail=True))
        except FileNotFoundError:
            return []
        return [self.relative(e["name"]) for e in entries if e["type"] == "directory"]

    def walk_files(self, directory: str = "", skip: Collection[str] = ()) -> builtins.list[FileInfo]:
        """All files below ``directory``, recursively, except those below its sub-directories named in
        ``skip``.

        Here one listing of everything, the skipped files filtered out after: an object store lists a
        prefix a page of keys (1,000 on S3) a request, where walking directory by directory would cost
        a request per directory — per partition of a table.
        """
        try:
            found = self._call(directory, lambda: self.fs.find(self.full_path(directory), detail=True))
        except FileNotFoundError:
            return []
        inside = f"{directory}/" if directory else ""
        skipped = tuple(f"{inside}{name}/" for name in skip)
        files = (self._info(e) for e in found.values() if e["type"] == "file" and not _is_temp(e["name"]))
        return [info for info in files if not info.path.startswith(skipped)]

    def stat(self, path: str) -> FileInfo:
        return self._info(self._call(path, lambda: self.fs.info(self.full_path(path))))

    def exists(self, path: str) -> bool:
        return bool(self._call(path, lambda: self.fs.exists(self.full_path(path))))

    def delete(self, path: str) -> None:
        try:
            self._call(path, lambda: self.fs.rm_file(self.full_path(path)))
        except FileNotFoundError:
            pass

    def delete_all(self, paths: Collection[str]) -> None:
        """Delete each of ``paths`` that exists (an object store deletes a thousand in one request)."""
        for path in paths:
            self.delete(path)

    @contextmanager
    def open_output(self, path: str) -> Iterator[IO[bytes]]:
        """A binary stream that writes ``path`` (for parquet writers)."""
        try:
            self.fs.makedirs(self.full_path(path).rsplit("/", 1)[0], exist_ok=True)
            with self.fs.open(self.full_path(path), "wb") as stream:
                yield stream
        except _BACKEND_ERRORS as exc:
            raise StorageError(f"storage failed writing {self.full_path(path)}: {exc}") from exc

    def open_input(self, path: str) -> IO[bytes]:
        return self._call(path, lambda: self.fs.open(self.full_path(path), "rb"))

    # -- helpers ---------------------------------------------------------------------------------
    def _info(self, entry: dict[str, Any]) -> FileInfo:
        modified = entry.get("mtime") or entry.get("LastModified") or entry.get("created") or 0.0
        if hasattr(modified, "timestamp"):
            modified = modified.timestamp()
        return FileInfo(
            self.relative(entry["name"]), int(entry.get("size") or 0), float(modified) + self.clock_resolution
        )

    def _call(self, path: str, operation: Callable[[], T]) -> T:
        try:
            return operation()
        except (FileNotFoundError, FileExistsError):
            raise
        except NotADirectoryError as exc:  # a path through a file: nothing exists there
            raise FileNotFoundError(str(exc)) from exc
        except _BACKEND_ERRORS as exc:
            raise StorageError(f"storage failed on {self.full_path(path)}: {exc}") from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def stays_inside(path: str) -> bool:
    """Whether a relative path names something under the root (no ``..``, not absolute)."""
    return not (path.startswith("/") or "\\" in path or "\0" in path or ".." in path.split("/"))


def _is_temp(name: str) -> bool:
    return name.rsplit("/", 1)[-1].startswith(_TEMP_PREFIX)


def _is_not_temp(name: str) -> bool:
    return not name.startswith(_TEMP_PREFIX)


_EXCLUSIVE = os.O_CREAT | os.O_EXCL | os.O_WRONLY


def _into_place(target: str, place: Callable[[], None]) -> None:
    """``place()``, which creates ``target`` (a link, a rename, a create); when ``target``'s directory is
    missing, it is made and ``place`` runs again. Only then: checking on every write costs a stat and a
    failed mkdir, more than the write."""
    try:
        place()
    except FileNotFoundError:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        place()


class LocalStorage(Storage):
    """Local disk, through the ``os`` module where fsspec's generality costs: a writer lists the timeline
    and the lock directory several times per commit, and ``os.scandir`` does that tens of times faster."""

    round_trips = False

    def _temp_for(self, target: str, data: bytes) -> str:
        """A temporary file holding ``data``, on the same file system as ``target``, to link or move there.

        It is made one directory up where that is still inside the root: writers watch the timeline and
        lock directories (:meth:`watched_names`, :meth:`new_files`), and there a write then shows as
        one change, its final name appearing, instead of three.
        """
        # No fsync: a process that dies loses nothing the kernel has, and an fsync of the file without
        # one of its directory would not make the new name durable anyway. Like Hudi and Delta on a
        # local file system, a crash of the machine itself may lose the last instants written.
        directory = os.path.dirname(target)
        if directory != self.root:
            directory = os.path.dirname(directory)
        temp = os.path.join(directory, f"{_TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            stream = open(temp, "wb")
        except FileNotFoundError:  # the first file of its directories
            os.makedirs(os.path.dirname(target), exist_ok=True)
            stream = open(temp, "wb")
        with stream:
            stream.write(data)
        return temp

    def list(self, directory: str = "") -> builtins.list[FileInfo]:
        def scan() -> builtins.list[FileInfo]:
            prefix = f"{directory}/" if directory else ""
            try:
                with os.scandir(self.full_path(directory)) as entries:
                    found = []
                    for entry in entries:
                        if entry.is_file(follow_symlinks=False) and not entry.name.startswith(_TEMP_PREFIX):
                            try:
                                stat = entry.stat(follow_symlinks=False)
                            except FileNotFoundError:  # deleted since the directory was read: not listed
                                continue
                            found.append(FileInfo(prefix + entry.name, stat.st_size, stat.st_mtime))
                    return found
            except (FileNotFoundError, NotADirectoryError):
                return []

        return self._call(directory, scan)

    def walk_files(self, directory: str = "", skip: Collection[str] = ()) -> builtins.list[FileInfo]:
        """On local disk the walk leaves the skipped directories out (``.hoodie/`` holds thousands of
        files): each directory costs a system call, not a request."""
        walk = super().walk_files
        if not skip:
            return walk(directory)
        kept = [sub for sub in self.list_dirs(directory) if sub.rsplit("/", 1)[-1] not in skip]
        return self.list(directory) + [info for sub in kept for info in walk(sub)]

    def names(self, directory: str = "") -> builtins.list[str]:
        def scan() -> builtins.list[str]:
            try:
                names = os.listdir(self.full_path(directory))
            except (FileNotFoundError, NotADirectoryError):
                return []
            if _TEMP_PREFIX not in "/".join(names):  # the usual case, found without a loop in Python
                return names
            return [n for n in names if not n.startswith(_TEMP_PREFIX)]

        return self._call(directory, scan)

    def watched_names(self, directory: str) -> frozenset[str]:
        kept = listings.names(self.full_path(directory), lambda: self.names(directory), _is_not_temp)
        return kept if kept is not None else frozenset(self.names(directory))

    def new_files(self, directory: str, wanted: Callable[[str], bool] = lambda name: True) -> NewFiles:
        return NewFiles(self.full_path(directory), lambda name: not _is_temp(name) and wanted(name))

    @contextmanager
    def open_output(self, path: str) -> Iterator[IO[bytes]]:
        target = self.full_path(path)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as stream:
                yield stream
        except OSError as exc:
            raise StorageError(f"storage failed writing {target}: {exc}") from exc

    def open_input(self, path: str) -> IO[bytes]:
        return self._call(path, lambda: open(self.full_path(path), "rb"))

    def stat(self, path: str) -> FileInfo:
        result = self._call(path, lambda: os.stat(self.full_path(path)))
        return FileInfo(path, result.st_size, result.st_mtime)

    def exists(self, path: str) -> bool:
        return os.path.exists(self.full_path(path))

    def read(self, path: str) -> bytes:
        def load() -> bytes:
            with open(self.full_path(path), "rb") as stream:
                return stream.read()

        return self._call(path, load)

    def delete(self, path: str) -> None:
        try:
            self._call(path, lambda: os.unlink(self.full_path(path)))
        except FileNotFoundError:
            pass

    def write(self, path: str, data: bytes) -> None:
        target = self.full_path(path)

        def replace() -> None:
            temp = self._temp_for(target, data)
            try:
                _into_place(target, lambda: os.replace(temp, target))
            except BaseException:
                os.unlink(temp)
                raise

        self._call(path, replace)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        target = self.full_path(path)
        if not data:  # nothing to read half-written: an exclusive create is atomic by itself

            def create() -> bool:
                try:
                    _into_place(target, lambda: os.close(os.open(target, _EXCLUSIVE, 0o644)))
                    return True
                except FileExistsError:
                    return False

            return self._call(path, create)

        def link() -> bool:
            if os.path.lexists(target):  # lost already: no temporary file to write (racers for a lock)
                return False
            temp = self._temp_for(target, data)
            try:
                _into_place(target, lambda: os.link(temp, target))
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(temp)

        return self._call(path, link)


class MemoryStorage(Storage):
    round_trips = False
    _lock = threading.Lock()

    def create_if_absent(self, path: str, data: bytes) -> bool:
        with self._lock:
            if self.fs.exists(self.full_path(path)):
                return False
            self.fs.pipe_file(self.full_path(path), data)
            return True


class S3Storage(Storage):
    """S3 (and what speaks its API): a request per call, through obstore where the options allow and s3fs
    otherwise (:func:`.s3.requests_for`), which opens it and makes the rare requests not below. Left out
    are requests s3fs would add: a size lookup before a read (a file opened asks for its end, which tells
    the size), a bucket lookup before a write, a listing of the parent after an empty one."""

    clock_resolution = 1.0  # S3 gives modification times in whole seconds, cut down
    lists_tails = True
    _opened: tuple[int, s3.Requests] | None = None  # (process, its requests): a forked child opens its own

    def portable_options(self) -> dict[str, Any]:
        return s3.portable_options(self.fs, self.options)

    def _requests(self) -> s3.Requests:
        if self._opened is None or self._opened[0] != os.getpid():
            self._opened = (os.getpid(), s3.requests_for(self.fs, self.options, self.root.partition("/")[0]))
        return self._opened[1]

    def list(self, directory: str = "") -> builtins.list[FileInfo]:
        full = self.full_path(directory)
        return self._files(directory, self._call(directory, lambda: self._requests().listed(full)))

    def list_after(self, directory: str, after: str) -> builtins.list[FileInfo]:
        """One request for the tail of a long directory: ListObjectsV2 with ``StartAfter``."""
        full = self.full_path(directory)
        return self._files(
            directory, self._call(directory, lambda: self._requests().listed_after(full, after))
        )

    def _files(self, directory: str, listed: s3.Listed) -> builtins.list[FileInfo]:
        inside, late = f"{directory}/" if directory else "", self.clock_resolution
        return [FileInfo(inside + name, size, at + late) for name, size, at in listed if not _is_temp(name)]

    def delete_all(self, paths: Collection[str]) -> None:
        """A DeleteObjects request a thousand keys (a key S3 refused stays for a later collection)."""
        if len(paths) < 2:  # a single DELETE
            return super().delete_all(paths)
        full = [self.full_path(path) for path in paths]
        self._call(next(iter(paths)), lambda: self._requests().delete_all(full))

    def read(self, path: str) -> bytes:
        return self._call(path, lambda: self._requests().read(self.full_path(path)))

    def write(self, path: str, data: bytes) -> None:
        self._call(path, lambda: self._requests().write(self.full_path(path), data))

    def create_if_absent(self, path: str, data: bytes) -> bool:
        return self._call(path, lambda: self._requests().create(self.full_path(path), data))

    def open_input(self, path: str) -> IO[bytes]:
        return self._call(path, lambda: self._requests().input(self.full_path(path)))

    @contextmanager
    def open_output(self, path: str) -> Iterator[IO[bytes]]:
        try:
            with self._requests().output(self.full_path(path)) as out:
                yield out
        except _BACKEND_ERRORS as exc:
            raise StorageError(f"storage failed writing {self.full_path(path)}: {exc}") from exc
