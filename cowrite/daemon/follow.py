"""Following a timeline as an append-only event log.

The follower lists the timeline once, then learns only what changed: on local disk from inotify events
(watchdog) naming the files created or deleted, on object stores (no events) from one listing per poll
compared with the names it knows. Only new names are parsed; commit files are read only by those who
need a new commit's content (the overlay). A rollback deletes the failed instant's files: deletions are
followed too.
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Iterable

from ..timeline.instant import Instant, InvalidInstantError
from ..timeline.storage import LocalStorage
from ..timeline.table import Table
from ..timeline.timeline import TIMELINE_DIR, Timeline

log = logging.getLogger(__name__)


class TimelineFollower:
    """The current timeline of one table, kept up to date cheaply. Not thread-safe: one poller."""

    def __init__(self, table: Table, use_events: bool = True) -> None:
        self.table = table
        self._names: dict[str, Instant] = {}
        self._timeline: Timeline | None = None  # built from _names when asked, kept until they change
        self._events: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._observer = None
        self._use_events = use_events and isinstance(table.storage, LocalStorage)
        self.listings = 0  # how many full listings were needed (tests and metrics read it)

    def start(self) -> list[Instant]:
        """Load the timeline; returns its instants (the events so far)."""
        if self._use_events:
            self._watch()
        return self._sync_by_listing()

    def resync(self) -> tuple[list[Instant], list[Instant]]:
        """One listing, now: after changes of our own whose events may not have arrived yet."""
        self.poll()
        return self._diff(self._list())

    def poll(self) -> tuple[list[Instant], list[Instant]]:
        """(instant files that appeared, instant files that vanished) since the last poll."""
        if self._observer is None:
            return self._diff(self._list())
        created, deleted = [], []
        while True:
            try:
                kind, name = self._events.get_nowait()
            except queue.Empty:
                break
            if kind == "created":
                created += self._add([name])
            else:
                deleted += self._remove([name])
        return created, deleted

    @property
    def timeline(self) -> Timeline:
        if self._timeline is None:  # sorting tens of thousands of instants every poll would dominate it
            self._timeline = Timeline(self._names.values())
        return self._timeline

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None

    # -- internals -------------------------------------------------------------------------------
    def _list(self) -> set[str]:
        self.listings += 1
        return {f.name for f in self.table.storage.list(TIMELINE_DIR)}

    def _sync_by_listing(self) -> list[Instant]:
        created, _ = self._diff(self._list())
        return created

    def _diff(self, names: set[str]) -> tuple[list[Instant], list[Instant]]:
        return self._add(sorted(names - self._names.keys())), self._remove(self._names.keys() - names)

    def _add(self, names: Iterable[str]) -> list[Instant]:
        added = []
        for name in names:
            if name in self._names or name.endswith(".crc") or name.startswith("."):
                continue  # hidden names are temporary files of atomic local writes
            try:
                instant = Instant.parse(name)
            except InvalidInstantError as exc:
                log.warning("skipping %s in the timeline of %s: %s", name, self.table.uri, exc)
                continue
            self._names[name] = instant
            added.append(instant)
        if added:
            self._timeline = None
        return added

    def _remove(self, names: Iterable[str]) -> list[Instant]:
        removed = [self._names.pop(name) for name in list(names) if name in self._names]
        if removed:
            self._timeline = None
        return removed

    def _watch(self) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        directory = self.table.storage.full_path(TIMELINE_DIR)
        os.makedirs(directory, exist_ok=True)
        events = self._events

        class Handler(FileSystemEventHandler):
            def on_created(self, event: FileSystemEvent) -> None:
                if not event.is_directory:
                    events.put(("created", os.path.basename(str(event.src_path))))

            def on_deleted(self, event: FileSystemEvent) -> None:
                if not event.is_directory:
                    events.put(("deleted", os.path.basename(str(event.src_path))))

            def on_moved(self, event: FileSystemEvent) -> None:
                if not event.is_directory:
                    events.put(("deleted", os.path.basename(str(event.src_path))))
                    events.put(("created", os.path.basename(str(event.dest_path))))

        observer = Observer()
        observer.schedule(Handler(), directory, recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer  # type: ignore[assignment]
