"""Following a timeline: one listing, then only what changed, reported as events the state folds.

On local disk the storage keeps the listing current from inotify events and never lists again; on object
stores (memory, S3) the follower lists once per look, and only the names after its start point: the
oldest pending instant, or the newest instant two looks ago. Either way it reports only names it has not
seen. One body per scenario runs on every backend; the only difference the tests allow is what each
needed to list.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cowrite import process
from cowrite.cleaner import rollback_failed, service_lock
from cowrite.daemon.events import Change, HistoryFound, InstantChanged
from cowrite.daemon.follow import TimelineFollower
from cowrite.daemon.state import RECENT, TableState
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.overlay import CommitEntry
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.storage.backend import FileInfo, LocalStorage

WAIT = 20.0  # bound of any wait for events; a healthy run needs milliseconds


@pytest.fixture
def table(storage_uri: str, storage_options: dict[str, Any]) -> Table:
    return Table.create(
        storage_uri,
        name="followed",
        record_key_fields=["id"],
        partition_fields=["p"],
        storage_options=storage_options,
    )


class Counted:
    """The follower's own view of the table, through a storage that records what it really listed (on
    local disk a kept listing is no listing): the directory, and the name it listed after."""

    def __init__(self, table: Table, storage_options: dict[str, Any]) -> None:
        self.table = Table.load(table.uri, **storage_options)
        self.listed: list[tuple[str, str]] = []
        storage = self.table.storage
        names, list_after = storage.names, storage.list_after

        def counted_names(directory: str = "") -> list[str]:
            self.listed.append((directory, ""))
            return names(directory)

        def counted_after(directory: str, after: str) -> list[FileInfo]:
            self.listed.append((directory, after))
            return list_after(directory, after)

        storage.names = counted_names  # type: ignore[method-assign]
        storage.list_after = counted_after  # type: ignore[method-assign]

    def timeline_listings(self) -> list[str]:
        """The names the timeline was listed after, one per listing."""
        return [after for directory, after in self.listed if directory == TIMELINE_DIR]


@pytest.fixture
def counted(table: Table, storage_options: dict[str, Any]) -> Counted:
    return Counted(table, storage_options)


def rows(ids: list[int], p: str = "a") -> pa.Table:
    return pa.table({"id": ids, "p": [p] * len(ids)})


def listed(table: Table) -> set[str]:
    return {info.name for info in table.storage.list(TIMELINE_DIR)}


def files_of(commit: Instant) -> list[str]:
    """What a look that finds ``commit`` completed reports of it: its completed file (the earlier ones of
    an instant that appears completed tell the state nothing)."""
    return [commit.file_name]


class Tail:
    """A follower and the state it feeds; counts the looks."""

    def __init__(self, table: Table) -> None:
        self.follower = TimelineFollower(table)
        self.state = TableState()
        self.looks = 0

    def look(self, table: Table) -> tuple[list[str], list[str]]:
        """One look, which must leave the state current (no waiting: what finished before it is seen); the
        names that appeared and vanished."""
        events = self.follower.look(self.state)
        for event in events:
            self.state.apply(event)
        self.state.following = True  # as the daemon's: the first look's completed instants are history
        self.looks += 1
        assert list(self.state.timeline) == list(table.timeline())
        created = sorted(
            [i.file_name for e in events if isinstance(e, HistoryFound) for i in e.instants]
            + [
                e.file.file_name
                for e in events
                if isinstance(e, InstantChanged) and e.change is not Change.REMOVED
            ]
        )
        removed = sorted(
            e.file.file_name for e in events if isinstance(e, InstantChanged) and e.change is Change.REMOVED
        )
        return created, removed

    def check_listings(self, table: Table, counted: Counted) -> None:
        """Local disk: the first look at most (another reader in this process may have made it). Object
        stores: one listing per look."""
        if isinstance(table.storage, LocalStorage):
            assert len(counted.timeline_listings()) <= 1
        else:
            assert len(counted.timeline_listings()) == self.looks


def test_follows_commits_and_a_rollback_without_relisting(table: Table, counted: Counted) -> None:
    writer = LocalWriter(table)
    first = writer.insert(rows([1]))
    tail = Tail(counted.table)
    assert tail.look(table) == (files_of(first), [])
    assert len(listed(table)) == 3  # requested, inflight, completed of the first commit
    assert tail.look(table) == ([], [])

    commits = [writer.insert(rows([n], p=f"p{n}")) for n in range(2, 6)]
    created, deleted = tail.look(table)
    assert created == sorted(name for c in commits for name in files_of(c))
    assert deleted == []

    # a writer that planned its write and died; the rollback deletes its pending files
    options = WriteOptions(config=table.config)
    dead = Transaction.begin(table, "insert", options=options)
    dead.plan(CommitMetadata("insert", ()))
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    created, deleted = tail.look(table)
    assert created == [f"{dead.instant_time}.commit.requested", f"{dead.instant_time}.inflight"]
    [done] = rollback_failed(table, service_lock(table), HeartbeatPolicy(), now=time.time() + 3600)
    created, deleted = tail.look(table)
    assert created == [done.rollback.file_name]
    assert deleted == [f"{dead.instant_time}.commit.requested", f"{dead.instant_time}.inflight"]

    assert [i.requested_time for i in tail.state.timeline.data_commits()] == [
        first.requested_time,
        *(c.requested_time for c in commits),
    ]
    tail.check_listings(table, counted)


def test_hidden_and_foreign_files_are_not_instants(table: Table, counted: Counted) -> None:
    tail = Tail(counted.table)
    assert tail.look(table) == ([], [])
    # temporary files of atomic writes are hidden names; other tools may leave checksums or notes
    table.storage.write(f"{TIMELINE_DIR}/.20260101000000000.commit.requested.tmp", b"")
    table.storage.write(f"{TIMELINE_DIR}/20260101000000000.commit.crc", b"")
    table.storage.write(f"{TIMELINE_DIR}/NOTES.txt", b"not an instant")
    sentinel = LocalWriter(table).insert(rows([1]))
    created, deleted = tail.look(table)
    assert created == files_of(sentinel)
    assert deleted == []
    tail.check_listings(table, counted)


def test_a_look_reports_only_new_names(table: Table, counted: Counted) -> None:
    writer = LocalWriter(table)
    writer.insert(rows([1]))
    tail = Tail(counted.table)
    tail.look(table)
    assert tail.look(table) == ([], [])
    second = writer.insert(rows([2]))
    created, deleted = tail.look(table)
    assert created == files_of(second)
    assert deleted == []
    assert tail.look(table) == ([], [])
    tail.check_listings(table, counted)


@pytest.mark.parametrize("storage_uri", ["memory", "s3"], indirect=True)
def test_a_claim_that_stands_below_a_pending_instant_is_found(table: Table, counted: Counted) -> None:
    """A claim stands below a pending instant claimed meanwhile (only a completed one of a later time makes
    it withdraw): the tail, which starts no later than the newest completed instant two looks ago, shows
    it, though the pending instant is the newest of every look before."""
    done = LocalWriter(table).insert(rows([1]))
    time.sleep(0.01)
    pending = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    tail = Tail(counted.table)
    for _ in range(3):  # whole, whole, then a tail
        tail.look(table)
    below = Instant(from_millis(to_millis(pending.instant_time) - 1), Action.COMMIT, State.REQUESTED)
    assert below.requested_time > done.requested_time
    table.storage.create_if_absent(table.instant_path(below), b"")
    assert tail.look(table) == ([below.file_name], [])
    assert tail.state.oldest_pending == below.requested_time
    assert pending.heartbeat is not None
    pending.heartbeat.stop()
    tail.check_listings(table, counted)


@pytest.mark.parametrize("storage_uri", ["memory", "s3"], indirect=True)
def test_object_stores_list_after_the_oldest_pending_instant_or_the_newest_completed_two_looks_ago(
    table: Table, counted: Counted
) -> None:
    writer = LocalWriter(table)
    history = [writer.insert(rows([n], p=f"p{n}")) for n in range(3)]
    tail = Tail(counted.table)
    tail.look(table)
    tail.look(table)  # the look after the first is whole too: the first may have missed a claim
    tail.look(table)
    newest = history[-1].requested_time
    pending = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    tail.look(table)  # shows the pending write
    later = writer.insert(rows([9], p="p9"))
    tail.look(table)  # shows the later commit
    tail.look(table)  # the newest completed two looks ago is still older than the pending write
    tail.look(table)  # now the later commit is: the pending write starts the tail
    assert counted.timeline_listings() == ["", "", newest, newest, newest, newest, pending.instant_time]
    assert pending.heartbeat is not None
    pending.heartbeat.stop()
    assert tail.state.oldest_pending == pending.instant_time
    assert later.requested_time > pending.instant_time


@pytest.mark.parametrize("storage_uri", ["memory", "s3"], indirect=True)
def test_an_instant_a_listing_missed_is_found_by_the_next_look(
    table: Table, counted: Counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing is no snapshot: one taken while instants land may miss one and show a later one. The
    missed one sorts after everything known two looks ago, where the next look starts."""
    writer = LocalWriter(table)
    writer.insert(rows([1]))
    tail = Tail(counted.table)
    tail.look(table)
    tail.look(table)
    missed, later = writer.insert(rows([2], p="p2")), writer.insert(rows([3], p="p3"))
    list_after = counted.table.storage.list_after

    def torn(directory: str, after: str) -> list[FileInfo]:  # the listing passed ``missed`` too early
        return [i for i in list_after(directory, after) if not i.name.startswith(missed.requested_time)]

    monkeypatch.setattr(counted.table.storage, "list_after", torn)
    events = tail.follower.look(tail.state)
    for event in events:
        tail.state.apply(event)
    assert {e.file.requested_time for e in events} == {later.requested_time}
    monkeypatch.undo()
    created, _ = tail.look(table)
    assert created == files_of(missed)
    assert tail.state.timeline.get(missed.requested_time) == missed


def test_the_state_shows_one_instant_per_time_as_every_process_does(table: Table) -> None:
    """Two actions' claims at one time (a claimant that could not withdraw): the first by name is shown,
    and removing it shows the other."""
    writer = LocalWriter(table)
    writer.insert(rows([1]))
    tail = Tail(table)
    tail.look(table)
    time_ = "20990101000000000"
    clean = Instant(time_, Action.CLEAN, State.REQUESTED)
    commit = Instant(time_, Action.COMMIT, State.REQUESTED)
    for instant in (commit, clean):
        table.storage.write(table.instant_path(instant), b"")
    tail.look(table)
    assert tail.state.timeline.get(time_) == clean  # "….clean.requested" < "….commit.requested"
    table.storage.delete(table.instant_path(clean))
    tail.look(table)
    assert tail.state.timeline.get(time_) == commit
    assert tail.state.oldest_pending == time_


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_long_timeline_is_held_as_counts_and_a_recent_window(where: str, tmp_path: Path) -> None:
    """What the daemon keeps does not grow with the table's history: after thousands of instants the state
    holds the newest RECENT (and the pending ones) as objects and packs the others; the follower keeps no
    names of its own on local disk (the storage's kept listing is the one copy), and on an object store
    only those after its start point."""
    uri = str(tmp_path / "long") if where == "local" else f"memory://long-{uuid.uuid4().hex}"
    table = Table.create(uri, name="long", record_key_fields=["id"], partition_fields=["p"])
    count, start = 3 * RECENT, 1_700_000_000_000
    for n in range(count):
        requested, completed = from_millis(start + 10 * n), from_millis(start + 10 * n + 5)
        stat = WriteStat("f-0", f"p0/f-0_0-0-0_{requested}.parquet", "p0", "null", 1, 1, 0, 0, 100)
        metadata = CommitMetadata("insert", (stat,)).to_bytes(Action.COMMIT)
        table.storage.write(f"{TIMELINE_DIR}/{requested}.commit.requested", b"")
        table.storage.write(f"{TIMELINE_DIR}/{requested}.inflight", metadata)
        table.storage.write(f"{TIMELINE_DIR}/{requested}_{completed}.commit", metadata)
    pending = from_millis(start + 10 * count)
    table.storage.write(f"{TIMELINE_DIR}/{pending}.commit.requested", b"")

    process.forget()
    TimelineFollower(table).look(TableState())  # a look alone: Tail.look parses the timeline to compare
    assert parsed_names() == 0  # the follower sees each name once: its parses are not kept for later
    tail = Tail(table)
    for _ in range(3):  # each checks the whole timeline, unpacked; the third has a start point on S3
        tail.look(table)
    state = tail.state
    assert state.held_in_full <= 2 * RECENT + 1
    assert (state.by_state[State.COMPLETED], state.by_state[State.REQUESTED]) == (count, 1)
    assert tail.follower.names_held <= 4  # the pending instant's, and the newest completed instant's three
    assert list(state.recent_timeline)[-RECENT:] == list(table.timeline())[-RECENT:]

    # a packed instant reported again (a full look, an archival that stopped half way) counts once
    oldest = next(iter(state.timeline))
    state.apply(InstantChanged(Change.COMPLETED, oldest))
    assert state.by_state[State.COMPLETED] == count

    # the oldest instants go (as archival deletes them): a full look takes packed ones out and counts them
    for name in sorted(table.storage.names(TIMELINE_DIR))[: 3 * 100]:
        table.storage.delete(f"{TIMELINE_DIR}/{name}")
    tail.follower.full_look_due = True
    for _ in range(2):
        tail.look(table)
    assert state.by_state[State.COMPLETED] == count - 100
    assert state.held_in_full <= 2 * RECENT + 1
    assert tail.follower.names_held <= 4


def parsed_names() -> int:
    """How many parsed instant names this process keeps."""
    return next(k.size() for k in process.kept() if k.name == "cowrite.format.instant._parse")


def test_history_folds_as_its_instants_one_by_one() -> None:
    """A first look's completed instants, folded at once, leave the state that folding them one by one
    leaves: packed but the newest RECENT, with a time the state knew already and a time two actions
    share folded as changes, and the entries the overlay lacks kept."""
    start = 1_700_000_000_000
    instants = [
        Instant(from_millis(start + 10 * n), Action.COMMIT, State.COMPLETED, from_millis(start + 10 * n + 5))
        for n in range(3 * RECENT)
    ]
    shared = instants[7].requested_time
    instants.append(Instant(shared, Action.CLEAN, State.COMPLETED, from_millis(start + 10**6)))
    known = Instant(instants[9].requested_time, Action.COMMIT, State.INFLIGHT)
    entries = {
        i.requested_time: CommitEntry(i.requested_time, i.completion_time or "", "commit", (), ())
        for i in instants[::5]
        if i.action is Action.COMMIT
    }
    at_once, one_by_one = TableState(), TableState()
    for state in (at_once, one_by_one):
        state.apply(InstantChanged(Change.INFLIGHT, known))
    found = instants[::-1]  # in no particular order
    at_once.apply(HistoryFound(tuple(found), entries))
    for instant in found:
        one_by_one.apply(InstantChanged(Change.COMPLETED, instant, entry=entries.get(instant.requested_time)))

    assert len(at_once.timeline) == 3 * RECENT and at_once.held_in_full <= 2 * RECENT
    for state in (at_once, one_by_one):
        state.following = True
        state.apply(InstantChanged(Change.REMOVED, instants[-2]))  # a rollback among the newest
    assert list(at_once.timeline) == list(one_by_one.timeline)
    assert list(at_once.recent_timeline)[-RECENT:] == list(one_by_one.recent_timeline)[-RECENT:]
    for name in ("by_state", "newest_completed", "latest_completion", "unlogged", "pending_instants"):
        assert getattr(at_once, name) == getattr(one_by_one, name), name
