"""The END_COMMIT_TIME overlay: completed data commits in the order they completed (RFC-22 option 3).

With several writers, commits complete out of requested-time order; a consumer that checkpoints by
requested time would skip a slow commit that completes after its checkpoint moved past it. Completion
times are taken under the table lock, strictly increasing, so a consumer that checkpoints by completion
time and reads up to a *watermark* — the latest completion time of one consistent look at the timeline —
sees every commit exactly once.

The daemon keeps the overlay as an append-only log in :data:`OVERLAY_DIR`; every file is created once
(create-if-absent) and never rewritten:

- a **segment** holds the entries (commits with the base files they wrote and the file groups they
  replaced) that completed after the previous file's watermark and at or before its own, plus the fence
  at that time: the requested time of the oldest pending write (RFC-22 option 2), for the record;
- a **snapshot**, written every so many segments, holds every entry up to its watermark; the files
  before it are deleted after it is written.

A file's name says what a reader must know to choose it: ``<watermark>-<sequence>-<archived
through>.<segment|snapshot>.json`` (times of 17 digits, all zeros for none; a sequence of 12 digits).
Watermarks never go back and sequence numbers grow by one per segment, so names sort in append order; a
snapshot carries the sequence number of the last segment it took in and sorts right after it. A
consumer with checkpoint ``c`` reads the segments after the newest snapshot whose watermark is above
``c`` — and the snapshot only when ``c`` is below the snapshot's watermark.

*Archived through* is the latest completion time of a data commit that archival took off the active
timeline: its entry may be gone from the log, so a consumer whose checkpoint is older is told
(:class:`CheckpointArchivedError`) instead of pulling on past the gap — without reading the archive.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from cowrite.errors import CheckpointArchivedError, CorruptTimelineError, InstantGoneError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Instant, check_time
from cowrite.format.table import Table
from cowrite.storage.backend import Storage

OVERLAY_DIR = ".hoodie/.cowrite/overlay"
# Where versions before the log kept the whole overlay in one file, rewritten on every change. A daemon
# that finds no log builds one from the timeline and deletes this file.
LEGACY_OVERLAY_PATH = ".hoodie/.cowrite/end_commit_time.json"

_NO_TIME = "0" * 17
_NAME = re.compile(r"([0-9]{17})-([0-9]{12})-([0-9]{17})\.(segment|snapshot)\.json")
_TRIES = 3  # listings of the log a reader makes when compaction deletes files it listed


@dataclass(frozen=True)
class CommitEntry:
    """One completed data commit, as incremental readers need it."""

    requested_time: str
    completion_time: str
    action: str
    written: tuple[tuple[str, str, str], ...]  # (partition, file id, base file path)
    replaced: tuple[tuple[str, str], ...]  # (partition, file id)

    @cached_property
    def encoded(self) -> str:
        """The entry as JSON, as a log file holds it (encoded once: snapshots re-write old entries). Its
        fields by hand: :func:`dataclasses.asdict` deep-copies every tuple, which cost most of encoding."""
        return json.dumps(
            {
                "requested_time": self.requested_time,
                "completion_time": self.completion_time,
                "action": self.action,
                "written": self.written,
                "replaced": self.replaced,
            }
        )

    @classmethod
    def of(cls, table: Table, instant: Instant) -> CommitEntry:
        return cls.from_metadata(instant, table.commit_metadata(instant))

    @classmethod
    def from_metadata(cls, instant: Instant, metadata: CommitMetadata) -> CommitEntry:
        return cls(
            instant.requested_time,
            instant.completion_time or "",
            instant.action.value,
            tuple((s.partition_path, s.file_id, s.path) for s in metadata.write_stats),
            tuple(sorted((p, f) for p, ids in metadata.replaced_file_ids.items() for f in ids)),
        )


class Kind(StrEnum):
    SEGMENT = "segment"
    SNAPSHOT = "snapshot"


@dataclass(frozen=True)
class LogFile:
    """One file of the log, as its name describes it."""

    watermark: str | None  # every data commit completed at or before it is in the log up to this file
    sequence: int
    archived_through: str | None
    kind: Kind

    @property
    def name(self) -> str:
        return (
            f"{self.watermark or _NO_TIME}-{self.sequence:012d}-{self.archived_through or _NO_TIME}"
            f".{self.kind.value}.json"
        )

    @property
    def path(self) -> str:
        return f"{OVERLAY_DIR}/{self.name}"

    @classmethod
    def parse(cls, name: str) -> LogFile | None:
        """The file ``name`` names, None for a name that is not one of the log's."""
        match = _NAME.fullmatch(name)
        if match is None:
            return None
        watermark, sequence, archived, kind = match.groups()
        return cls(
            None if watermark == _NO_TIME else watermark,
            int(sequence),
            None if archived == _NO_TIME else archived,
            Kind(kind),
        )


@dataclass(frozen=True)
class LogRecord:
    """What one file of the log holds."""

    file: LogFile
    fence: str | None  # requested time of the oldest pending data write when the file was written
    archive_seen: str | None  # the newest archive file whose commits ``archived_through`` accounts for
    entries: tuple[CommitEntry, ...]  # in completion order

    def to_bytes(self) -> bytes:
        head = json.dumps(
            {
                "watermark": self.file.watermark,
                "sequence": self.file.sequence,
                "archived_through": self.file.archived_through,
                "archive_seen": self.archive_seen,
                "fence": self.fence,
            }
        )
        return head[:-1].encode() + _ENTRIES + ", ".join(e.encoded for e in self.entries).encode() + b"]}"

    @classmethod
    def from_bytes(cls, data: bytes, file: LogFile, path: str, entries: bool = True) -> LogRecord:
        """Parse a file of the log; :class:`CorruptTimelineError` naming ``path`` if it is not one, or not
        the one its name says. Without ``entries``, only what it says besides them is read and checked."""
        try:
            payload = json.loads(data if entries else _head(data))
            found = tuple(
                CommitEntry(
                    check_time(e["requested_time"]),
                    check_time(e["completion_time"]),
                    str(e["action"]),
                    tuple((str(p), str(f), str(x)) for p, f, x in e["written"]),
                    tuple((str(p), str(f)) for p, f in e["replaced"]),
                )
                for e in (payload["entries"] if entries else ())
            )
            if not isinstance(payload["entries"], list):
                raise TypeError("entries is not a list")
            fence, seen = payload["fence"], payload["archive_seen"]
            if fence is not None:
                check_time(fence)
            if seen is not None and not isinstance(seen, str):
                raise ValueError(f"archive_seen {seen!r} is not a file name")
            named = (file.watermark, file.sequence, file.archived_through)
            if (payload["watermark"], payload["sequence"], payload["archived_through"]) != named:
                raise ValueError("its content is not what its name says")
            if any(file.watermark is None or e.completion_time > file.watermark for e in found):
                raise ValueError("an entry completed after its watermark")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CorruptTimelineError(path, f"not a file of the END_COMMIT_TIME overlay ({exc})") from None
        return cls(file, fence, seen, found)


_ENTRIES = b', "entries": ['


def _head(data: bytes) -> bytes:
    """A file of the log without its entries, as JSON: what :meth:`LogRecord.to_bytes` writes before them
    (a restart reads a snapshot for it, and decoding ten thousand entries would be most of the restart)."""
    at = data.find(_ENTRIES)
    return data[:at] + b', "entries": []}' if at >= 0 else data


@dataclass(frozen=True)
class LogFiles:
    """The files of the log a listing showed: the newest snapshot, the segments after it, and what
    compaction left behind (older files it is deleting)."""

    snapshot: LogFile
    segments: tuple[LogFile, ...]  # consecutive sequence numbers after the snapshot's
    older: tuple[LogFile, ...]

    @property
    def head(self) -> LogFile:
        """The newest file: its watermark and *archived through* are the log's."""
        return self.segments[-1] if self.segments else self.snapshot


def log_files(storage: Storage, names: Iterable[str]) -> LogFiles | None:
    """The log in ``names`` (a listing of :data:`OVERLAY_DIR`); None if it holds no file of the log.

    Raises :class:`CorruptTimelineError` when segments are there without a snapshot before them, or a
    sequence number is missing after the newest snapshot: files are created in sequence and deleted only
    once a snapshot took them in, so neither happens unless files were lost (the daemon rebuilds the log).
    """
    files = sorted((f for f in map(LogFile.parse, names) if f is not None), key=_order)
    if not files:
        return None
    snapshots = [f for f in files if f.kind is Kind.SNAPSHOT]
    where = storage.full_path(OVERLAY_DIR)
    if not snapshots:
        raise CorruptTimelineError(where, "segments of the END_COMMIT_TIME overlay without a snapshot")
    snapshot = snapshots[-1]
    segments = tuple(f for f in files if f.kind is Kind.SEGMENT and f.sequence > snapshot.sequence)
    expected = range(snapshot.sequence + 1, snapshot.sequence + 1 + len(segments))
    missing = sorted(set(expected) - {s.sequence for s in segments})
    if missing or len({s.sequence for s in segments}) != len(segments):
        problem = f"segment {missing[0]} is missing" if missing else "two segments share a sequence number"
        raise CorruptTimelineError(where, f"the END_COMMIT_TIME overlay is not whole: {problem}")
    older = tuple(f for f in files if f is not snapshot and f not in segments)
    return LogFiles(snapshot, segments, older)


def _order(file: LogFile) -> tuple[int, bool]:
    return file.sequence, file.kind is Kind.SNAPSHOT


def read_record(storage: Storage, file: LogFile, entries: bool = True) -> LogRecord:
    """One file of the log (``entries``: with them); :class:`FileNotFoundError` if it was deleted since
    it was listed."""
    return LogRecord.from_bytes(storage.read(file.path), file, storage.full_path(file.path), entries)


def read_records(storage: Storage, files: Sequence[LogFile]) -> list[LogRecord]:
    """:func:`read_record` of each of ``files``, concurrently where each read is a round trip."""
    if len(files) > 1 and storage.round_trips:
        with ThreadPoolExecutor(min(8, len(files)), thread_name_prefix="cowrite-overlay") as pool:
            return list(pool.map(lambda f: read_record(storage, f), files))
    return [read_record(storage, f) for f in files]


@dataclass(frozen=True)
class Overlay:
    """What a consumer reads of the log: the entries after its checkpoint, up to the watermark."""

    entries: tuple[CommitEntry, ...]  # in completion order
    watermark: str | None  # every data commit completed at or before it is in the log
    archived_through: str | None
    read: tuple[str, ...]  # names of the log files read for it


@dataclass(frozen=True)
class Head:
    """What the newest file of the log says, and when it was written."""

    watermark: str | None
    archived_through: str | None
    written: float  # its modification time (the storage's clock)


def head(storage: Storage) -> Head | None:
    """The log's watermark from one listing (with modification times), reading no file; None without a
    log. For a reader that wants only how far the daemon has looked, and how long ago."""
    infos = {info.name: info for info in storage.list(OVERLAY_DIR)}
    files = log_files(storage, infos)
    if files is None:
        return None
    newest = files.head
    return Head(newest.watermark, newest.archived_through, infos[newest.name].modified)


def read_since(storage: Storage, checkpoint: str | None) -> Overlay | None:
    """The data commits completed after ``checkpoint`` (a completion time; None: from the start) and at or
    before the log's watermark, each once, in completion order; None if the daemon wrote no log yet.

    Reads one listing of :data:`OVERLAY_DIR` and only the files that can hold such commits. A file listed
    and then deleted (compaction meanwhile) makes it list again; should that keep happening,
    :class:`InstantGoneError`. Raises :class:`CheckpointArchivedError` when archival took commits after
    ``checkpoint`` off the timeline, :class:`CorruptTimelineError` naming a damaged file or the directory
    when files are missing.
    """
    if checkpoint is not None:
        check_time(checkpoint)
    for _ in range(_TRIES):
        files = log_files(storage, storage.names(OVERLAY_DIR))
        if files is None:
            return None
        head = files.head
        archived = head.archived_through
        if archived is not None and (checkpoint is None or checkpoint < archived):
            raise CheckpointArchivedError(
                f"commits of {storage.uri} completed after checkpoint {checkpoint} and up to {archived} were "
                "archived before this consumer pulled them: pulling on would skip them. Start over from a "
                "snapshot, or keep more commits on the active timeline "
                "(hoodie.keep.min.commits / hoodie.keep.max.commits)"
            )
        wanted = [
            f
            for f in (files.snapshot, *files.segments)
            if f.watermark is not None and (checkpoint is None or f.watermark > checkpoint)
        ]
        try:
            records = read_records(storage, wanted)
        except FileNotFoundError:
            continue  # compacted meanwhile: the newer snapshot has it
        watermark = head.watermark or ""
        entries = [
            e
            for r in records
            for e in r.entries
            if (checkpoint is None or e.completion_time > checkpoint) and e.completion_time <= watermark
        ]
        entries.sort(key=_completion)
        return Overlay(tuple(entries), head.watermark, archived, tuple(f.name for f in wanted))
    raise InstantGoneError(storage.full_path(OVERLAY_DIR))


def _completion(entry: CommitEntry) -> str:
    return entry.completion_time


def entries_of(table: Table, instants: Iterable[Instant]) -> list[CommitEntry]:
    return [CommitEntry.of(table, i) for i in instants if i.action.writes_data]


def newest_files(entries: Sequence[CommitEntry]) -> list[str]:
    """The newest base file each file group got from ``entries``, minus groups replaced among them."""
    newest: dict[tuple[str, str], tuple[str, str]] = {}
    for entry in entries:
        for partition, file_id, path in entry.written:
            key = (partition, file_id)
            if key not in newest or newest[key][0] < entry.requested_time:
                newest[key] = (entry.requested_time, path)
    for entry in entries:
        for group in entry.replaced:
            newest.pop(group, None)
    return sorted(path for _, path in newest.values())
