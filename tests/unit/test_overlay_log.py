"""The END_COMMIT_TIME log on storage: names that sort in append order, readers that read only what can
hold commits after their checkpoint, compaction, and what a reader does when the log moves under it."""

from __future__ import annotations

import pytest

from cowrite.daemon.events import OverlayAppended
from cowrite.daemon.overlay import OverlayLog, OverlayLogDamaged
from cowrite.errors import CheckpointArchivedError, CorruptTimelineError, StorageError
from cowrite.format.instant import from_millis
from cowrite.format.overlay import OVERLAY_DIR, CommitEntry, Kind, LogFile, head, read_since
from cowrite.storage.backend import Storage

BASE = 1_800_000_000_000


def at(n: int) -> str:
    return from_millis(BASE + n)


def entry(n: int) -> CommitEntry:
    """A commit requested at ``n`` and completed at ``n + 100``: completion order is not request order
    once the test interleaves them."""
    return CommitEntry(
        at(n), at(n + 100), "commit", (("p", f"f{n}-0", f"p/f{n}-0_0-0-0_{at(n)}.parquet"),), ()
    )


def batch(
    *ns: int, fence: int | None = None, archived: int | None = None, upto: int | None = None
) -> OverlayAppended:
    entries = tuple(entry(n) for n in ns)
    watermark = (
        at(upto + 100) if upto is not None else max((e.completion_time for e in entries), default=None)
    )
    return OverlayAppended(
        watermark,
        at(fence) if fence is not None else None,
        at(archived + 100) if archived else None,
        None,
        entries,
    )


def names(storage: Storage) -> list[str]:
    return sorted(storage.names(OVERLAY_DIR))


@pytest.fixture
def log(storage: Storage) -> OverlayLog:
    started = OverlayLog(storage, snapshot_every=3)
    assert started.load() is None
    started.rebuild(batch(1, 2), [entry(1), entry(2)])
    return started


def test_names_sort_in_append_order_and_say_what_a_reader_needs() -> None:
    files = [
        LogFile(None, 0, None, Kind.SNAPSHOT),
        LogFile(at(5), 1, None, Kind.SEGMENT),
        LogFile(at(5), 2, None, Kind.SEGMENT),  # only the fence moved
        LogFile(at(9), 3, at(4), Kind.SEGMENT),
        LogFile(at(9), 3, at(4), Kind.SNAPSHOT),  # took in segment 3
        LogFile(at(12), 4, at(4), Kind.SEGMENT),
    ]
    assert sorted(f.name for f in files) == [f.name for f in files]
    assert [LogFile.parse(f.name) for f in files] == files
    assert files[3].name == f"{at(9)}-000000000003-{at(4)}.segment.json"
    assert (
        LogFile.parse("end_commit_time.json") is None and LogFile.parse(f"{at(9)}-3-x.segment.json") is None
    )


def test_a_reader_reads_only_the_segments_after_its_checkpoint(storage: Storage, log: OverlayLog) -> None:
    log.append(batch(3))
    log.append(batch(upto=3, fence=7))  # a write began: the fence moves, the watermark stays
    log.append(OverlayAppended(at(105), at(7), None, None, (entry(4), entry(5))))  # 3 segments: a snapshot
    log.append(batch(6))
    log.append(batch(7))
    [snapshot, first, second] = names(storage)
    assert LogFile.parse(snapshot) == LogFile(at(105), 3, None, Kind.SNAPSHOT)  # took in segments 1-3

    everything = read_since(storage, None)
    assert everything is not None
    assert [e.requested_time for e in everything.entries] == [at(n) for n in range(1, 8)]
    assert everything.watermark == at(107) and everything.read == (snapshot, first, second)

    recent = read_since(storage, at(105))  # at the snapshot's watermark: the snapshot holds nothing newer
    assert recent is not None
    assert [e.requested_time for e in recent.entries] == [at(6), at(7)] and recent.read == (first, second)
    latest = read_since(storage, at(106))
    assert (
        latest is not None
        and latest.read == (second,)
        and [e.requested_time for e in latest.entries] == [at(7)]
    )
    nothing = read_since(storage, at(107))
    assert nothing is not None and nothing.entries == () and nothing.read == ()
    found = head(storage)
    assert found is not None and (found.watermark, found.archived_through) == (at(107), None)


def test_entries_are_in_completion_order_and_stop_at_the_watermark(storage: Storage, log: OverlayLog) -> None:
    slow = CommitEntry(at(3), at(300), "commit", (), ())  # requested before 4, completed long after
    log.append(OverlayAppended(at(104), None, None, None, (entry(4),)))
    log.append(OverlayAppended(at(300), None, None, None, (entry(150), slow)))
    read = read_since(storage, at(102))
    assert read is not None
    assert [(e.requested_time, e.completion_time) for e in read.entries] == [
        (at(4), at(104)),
        (at(150), at(250)),
        (at(3), at(300)),
    ]


def test_compaction_keeps_every_entry_once_and_deletes_what_it_took_in(
    storage: Storage, log: OverlayLog
) -> None:
    for n in range(3, 12):
        log.append(batch(n))
    files = [LogFile.parse(name) for name in names(storage)]
    assert [(f.kind, f.sequence) for f in files if f] == [(Kind.SNAPSHOT, 9)]
    read = read_since(storage, None)
    assert read is not None and [e.requested_time for e in read.entries] == [at(n) for n in range(1, 12)]


def test_a_file_deleted_by_compaction_after_the_listing_makes_the_reader_list_again(
    storage: Storage, log: OverlayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.append(batch(3))
    log.append(batch(4))
    original = storage.read
    compacted: list[str] = []

    def meanwhile(path: str) -> bytes:
        if not compacted:  # the daemon compacts between the reader's listing and its first read
            compacted.append(path)
            log.append(batch(5))
        return original(path)

    monkeypatch.setattr(storage, "read", meanwhile)
    read = read_since(storage, None)
    assert compacted and read is not None
    assert [e.requested_time for e in read.entries] == [at(n) for n in range(1, 6)]
    assert len(read.read) == 1  # the new snapshot


def test_archival_is_told_to_readers_behind_it_and_compaction_drops_what_they_cannot_ask_for(
    storage: Storage, log: OverlayLog
) -> None:
    log.append(batch(3))
    log.append(batch(4, archived=2))  # commits through the one completed at 102 were archived
    with pytest.raises(CheckpointArchivedError, match="archived before this consumer pulled them"):
        read_since(storage, None)
    with pytest.raises(CheckpointArchivedError):
        read_since(storage, at(101))
    read = read_since(storage, at(102))
    assert read is not None and [e.requested_time for e in read.entries] == [at(3), at(4)]
    log.append(batch(5, archived=2))  # a snapshot: it keeps only what a reader may still ask for
    [snapshot] = names(storage)
    kept = read_since(storage, at(102))
    assert kept is not None and kept.read == (snapshot,)
    assert [e.requested_time for e in kept.entries] == [at(3), at(4), at(5)]


def test_a_gap_or_segments_without_a_snapshot_are_reported_not_read_past(
    storage: Storage, log: OverlayLog
) -> None:
    log.append(batch(3))
    log.append(batch(4))
    segment = next(f for f in map(LogFile.parse, names(storage)) if f and f.sequence == 1)
    storage.delete(segment.path)
    with pytest.raises(CorruptTimelineError, match="segment 1 is missing"):
        read_since(storage, at(103))
    with pytest.raises(OverlayLogDamaged, match="segment 1 is missing"):
        OverlayLog(storage).load()
    snapshot = next(f for f in map(LogFile.parse, names(storage)) if f and f.kind is Kind.SNAPSHOT)
    storage.delete(snapshot.path)
    with pytest.raises(CorruptTimelineError, match="without a snapshot"):
        read_since(storage, None)


def test_a_restarted_log_continues_where_it_stopped(storage: Storage, log: OverlayLog) -> None:
    log.append(batch(3, fence=9))
    again = OverlayLog(storage, snapshot_every=3)
    assert again.load() == OverlayAppended(at(103), at(9), None, None)
    again.append(batch(4))
    assert [f.sequence for f in map(LogFile.parse, names(storage)) if f] == [0, 1, 2]


def test_after_an_append_whose_answer_was_lost_the_log_is_read_again(
    storage: Storage, log: OverlayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    create = storage.create_if_absent

    def lost(path: str, data: bytes) -> bool:
        create(path, data)
        raise StorageError(f"storage failed on {path}: the connection dropped")

    monkeypatch.setattr(storage, "create_if_absent", lost)
    with pytest.raises(StorageError):
        log.append(batch(3))
    monkeypatch.undo()
    assert not log.whole
    assert log.load() == OverlayAppended(at(103), None, None, None)  # segment 1 was written
    log.append(batch(4))
    read = read_since(storage, None)
    assert read is not None and [e.requested_time for e in read.entries] == [at(1), at(2), at(3), at(4)]


def test_a_damaged_file_is_reported_by_load(storage: Storage, log: OverlayLog) -> None:
    log.append(batch(3))
    [_, segment] = [f for f in map(LogFile.parse, names(storage)) if f]
    storage.write(segment.path, b'{"watermark": "not a time"')
    with pytest.raises(OverlayLogDamaged, match="not a file of the END_COMMIT_TIME overlay"):
        OverlayLog(storage).load()
