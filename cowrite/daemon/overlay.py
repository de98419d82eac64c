"""The daemon's end of the END_COMMIT_TIME log (the format: :mod:`cowrite.format.overlay`).

The daemon appends one segment per poll that changed what the log says (new entries, the watermark,
the fence, what was archived), and every ``snapshot_every`` segments writes a snapshot of everything so
far, then deletes the files before it. Each file is created with create-if-absent and never rewritten, so
killing the daemon at any point leaves a log that is whole up to its last file: a restart reads the
newest snapshot and the segments after it, and appends what the timeline shows beyond their watermark.

A log that is not whole — a file that does not parse, a sequence number missing, segments without a
snapshot — is rebuilt from the timeline as a new snapshot (:meth:`OverlayLog.rebuild`); so is a table
without a log, or with the single-file overlay of earlier versions (deleted then).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from cowrite.daemon.events import OverlayAppended
from cowrite.errors import CorruptTimelineError, CowriteError
from cowrite.format.overlay import (
    LEGACY_OVERLAY_PATH,
    OVERLAY_DIR,
    CommitEntry,
    Kind,
    LogFile,
    LogFiles,
    LogRecord,
    log_files,
    read_record,
    read_records,
)
from cowrite.storage.backend import Storage

log = logging.getLogger(__name__)

DEFAULT_SNAPSHOT_EVERY = 100


class OverlayLogDamaged(CowriteError):
    """The log on storage is not what this daemon wrote: rebuild it from the timeline."""


class OverlayLog:
    """Appends to one table's log. Not thread-safe: the table's poller owns it."""

    def __init__(self, storage: Storage, snapshot_every: int = DEFAULT_SNAPSHOT_EVERY) -> None:
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be at least 1, not {snapshot_every}")
        self.storage = storage
        self.snapshot_every = snapshot_every
        self.head: LogFile | None = None  # the newest file; None until the log was loaded or built
        self._snapshot: LogFile | None = None
        self._tail: list[CommitEntry] = []  # entries of the segments after the snapshot
        self._segments = 0  # segments after the snapshot

    @property
    def whole(self) -> bool:
        """Whether appending continues a log this daemon loaded or wrote."""
        return self.head is not None

    def load(self) -> OverlayAppended | None:
        """Read the log: its newest snapshot (to check it parses) and the segments after it. Returns what
        its newest file says, None when there is no log. Raises :class:`OverlayLogDamaged` saying what is
        wrong (the caller rebuilds)."""
        try:
            files = log_files(self.storage, self.storage.names(OVERLAY_DIR))
            if files is None:
                return None
            # The snapshot's entries are checked when compaction reads them (or a reader does): parsing
            # ten thousand of them would be most of a restart.
            snapshot = read_record(self.storage, files.snapshot, entries=False)
            records = [snapshot, *read_records(self.storage, files.segments)]
        except (CorruptTimelineError, FileNotFoundError) as exc:  # deleted since listed: not by this daemon
            raise OverlayLogDamaged(str(exc)) from exc
        self._snapshot, self.head = files.snapshot, files.head
        self._tail = [e for r in records[1:] for e in r.entries]
        self._segments = len(files.segments)
        newest = records[-1]
        return OverlayAppended(
            newest.file.watermark, newest.fence, newest.file.archived_through, newest.archive_seen
        )

    def append(self, batch: OverlayAppended) -> LogFile:
        """Write ``batch`` as the next segment (and a snapshot when one is due).

        Raises :class:`OverlayLogDamaged` when that file exists already (written by an append whose answer
        was lost, or by another daemon) or compaction finds the log not whole; storage errors as they come.
        After any error the log is no longer :attr:`whole`: what was written is unknown, and the caller
        reads it again (:meth:`load`) before it appends.
        """
        assert self.head is not None, "append to a loaded or rebuilt log"
        try:
            file = LogFile(batch.watermark, self.head.sequence + 1, batch.archived_through, Kind.SEGMENT)
            if not self.storage.create_if_absent(file.path, _record(file, batch).to_bytes()):
                raise OverlayLogDamaged(f"{self.storage.full_path(file.path)} exists already")
            self.head = file
            self._tail += batch.entries
            self._segments += 1
            if self._segments >= self.snapshot_every:
                self._compact(batch)
        except BaseException:
            self.head = None
            raise
        return file

    def rebuild(self, batch: OverlayAppended, entries: Sequence[CommitEntry]) -> LogFile:
        """Start the log afresh: a snapshot of ``entries`` (every data commit on the timeline completed at
        or before ``batch``'s watermark, in completion order) after every file there, which are deleted."""
        names = self.storage.names(OVERLAY_DIR)
        parsed = [f for f in map(LogFile.parse, names) if f is not None]
        sequence = max((f.sequence for f in parsed), default=-1) + 1
        kept = tuple(_after(entries, batch.archived_through))
        snapshot = self._write_snapshot(
            LogFile(batch.watermark, sequence, batch.archived_through, Kind.SNAPSHOT), batch, kept
        )
        self._delete(f for f in parsed if f != snapshot)
        self.storage.delete(LEGACY_OVERLAY_PATH)
        return snapshot

    def _compact(self, batch: OverlayAppended) -> None:
        assert self._snapshot is not None and self.head is not None
        files = self._check()
        try:
            base = read_record(self.storage, files.snapshot)
        except (CorruptTimelineError, FileNotFoundError) as exc:
            raise OverlayLogDamaged(str(exc)) from exc
        entries = tuple(_after([*base.entries, *self._tail], batch.archived_through))
        head = self.head
        snapshot = LogFile(head.watermark, head.sequence, head.archived_through, Kind.SNAPSHOT)
        self._write_snapshot(snapshot, batch, entries)
        self._delete([files.snapshot, *files.segments, *files.older])

    def _check(self) -> LogFiles:
        """The log as listed, if it is the one this daemon wrote; else :class:`OverlayLogDamaged`."""
        try:
            files = log_files(self.storage, self.storage.names(OVERLAY_DIR))
        except CorruptTimelineError as exc:
            raise OverlayLogDamaged(str(exc)) from exc
        if files is None or files.snapshot != self._snapshot or files.head != self.head:
            raise OverlayLogDamaged(f"{self.storage.full_path(OVERLAY_DIR)} is not the log this daemon wrote")
        return files

    def _write_snapshot(
        self, file: LogFile, batch: OverlayAppended, entries: tuple[CommitEntry, ...]
    ) -> LogFile:
        record = LogRecord(file, batch.fence, batch.archive_seen, entries)
        if not self.storage.create_if_absent(file.path, record.to_bytes()):
            raise OverlayLogDamaged(f"{self.storage.full_path(file.path)} exists already")
        self._snapshot = self.head = file
        self._tail = []
        self._segments = 0
        return file

    def _delete(self, files: Iterable[LogFile]) -> None:
        """Delete files the snapshot took in, oldest first (a reader that listed them lists again)."""
        for file in sorted(files, key=lambda f: (f.sequence, f.kind is Kind.SNAPSHOT)):
            if file != self._snapshot:
                self.storage.delete(file.path)


def _record(file: LogFile, batch: OverlayAppended) -> LogRecord:
    return LogRecord(file, batch.fence, batch.archive_seen, batch.entries)


def _after(entries: Sequence[CommitEntry], archived_through: str | None) -> list[CommitEntry]:
    """Entries a consumer may still ask for: one whose checkpoint is older than ``archived_through`` is
    refused, so nothing completed at or before it is read again."""
    return [e for e in entries if archived_through is None or e.completion_time > archived_through]
