"""Following a timeline: one listing, then only what changed.

On local disk the storage keeps the listing current from inotify events and never lists again; on object
stores (memory, S3) the follower lists once per poll. Either way it reports only names it has not seen.
One body per scenario runs on every backend; the only difference the tests allow is how many listings
each needed.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

from cowrite.cleaner import rollback_failed, service_lock
from cowrite.daemon.follow import TimelineFollower
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.storage.backend import LocalStorage

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
    local disk a kept listing is no listing)."""

    def __init__(self, table: Table, storage_options: dict[str, Any]) -> None:
        self.table = Table.load(table.uri, **storage_options)
        self.listed: list[str] = []
        names = self.table.storage.names

        def counted(directory: str = "") -> list[str]:
            self.listed.append(directory)
            return names(directory)

        self.table.storage.names = counted  # type: ignore[method-assign]


@pytest.fixture
def counted(table: Table, storage_options: dict[str, Any]) -> Counted:
    return Counted(table, storage_options)


def rows(ids: list[int], p: str = "a") -> pa.Table:
    return pa.table({"id": ids, "p": [p] * len(ids)})


def listed(table: Table) -> set[str]:
    return {info.name for info in table.storage.list(TIMELINE_DIR)}


def names(instants: list[Instant]) -> list[str]:
    return sorted(i.file_name for i in instants)


def files_of(commit: Instant) -> list[str]:
    """The timeline files of a completed commit, sorted."""
    time = commit.requested_time
    return sorted([f"{time}.commit.requested", f"{time}.inflight", commit.file_name])


class Tail:
    """Polls a follower and counts the polls."""

    def __init__(self, follower: TimelineFollower) -> None:
        self.follower = follower
        self.polls = 0

    def poll(self, table: Table) -> tuple[list[str], list[str]]:
        """One poll, which must find the follower current (no waiting: what finished before it is seen);
        the names created and deleted."""
        created, deleted = self.follower.poll()
        self.polls += 1
        assert list(self.follower.timeline) == list(table.timeline())
        return names(created), names(deleted)

    def check_listings(self, table: Table, counted: Counted) -> None:
        """Local disk: the first look at most (another reader in this process may have made it). Object
        stores: one more listing per poll."""
        timeline = [d for d in counted.listed if d == TIMELINE_DIR]
        if isinstance(table.storage, LocalStorage):
            assert len(timeline) <= 1
        else:
            assert len(timeline) == 1 + self.polls


def test_follows_commits_and_a_rollback_without_relisting(table: Table, counted: Counted) -> None:
    writer = LocalWriter(table)
    first = writer.insert(rows([1]))
    follower = TimelineFollower(counted.table)
    assert names(follower.start()) == sorted(listed(table))
    assert len(listed(table)) == 3  # requested, inflight, completed of the first commit
    tail = Tail(follower)
    assert tail.poll(table) == ([], [])

    commits = [writer.insert(rows([n], p=f"p{n}")) for n in range(2, 6)]
    created, deleted = tail.poll(table)
    assert created == sorted(name for c in commits for name in files_of(c))
    assert deleted == []

    # a writer that planned its write and died; the rollback deletes its pending files
    options = WriteOptions(config=table.config)
    dead = Transaction.begin(table, "insert", options=options)
    dead.plan(CommitMetadata("insert", ()))
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    created, deleted = tail.poll(table)
    assert created == [f"{dead.instant_time}.commit.requested", f"{dead.instant_time}.inflight"]
    [done] = rollback_failed(table, service_lock(table), HeartbeatPolicy(), now=time.time() + 3600)
    created, deleted = tail.poll(table)
    assert created == sorted(
        [f"{done.rollback.requested_time}.rollback.requested", done.rollback.file_name]
    )
    assert deleted == [f"{dead.instant_time}.commit.requested", f"{dead.instant_time}.inflight"]

    assert list(follower.timeline) == list(table.timeline())
    assert [i.requested_time for i in follower.timeline.data_commits()] == [
        first.requested_time,
        *(c.requested_time for c in commits),
    ]
    tail.check_listings(table, counted)


def test_hidden_and_foreign_files_are_not_instants(table: Table, counted: Counted) -> None:
    follower = TimelineFollower(counted.table)
    assert follower.start() == []
    tail = Tail(follower)
    # temporary files of atomic writes are hidden names; other tools may leave checksums or notes
    table.storage.write(f"{TIMELINE_DIR}/.20260101000000000.commit.requested.tmp", b"")
    table.storage.write(f"{TIMELINE_DIR}/20260101000000000.commit.crc", b"")
    table.storage.write(f"{TIMELINE_DIR}/NOTES.txt", b"not an instant")
    sentinel = LocalWriter(table).insert(rows([1]))
    created, deleted = tail.poll(table)
    assert created == files_of(sentinel)
    assert deleted == []
    tail.check_listings(table, counted)


def test_a_poll_reports_only_new_names(table: Table, counted: Counted) -> None:
    writer = LocalWriter(table)
    writer.insert(rows([1]))
    follower = TimelineFollower(counted.table)
    follower.start()
    tail = Tail(follower)
    assert tail.poll(table) == ([], [])
    second = writer.insert(rows([2]))
    created, deleted = tail.poll(table)
    assert created == files_of(second)
    assert deleted == []
    assert tail.poll(table) == ([], [])
    tail.check_listings(table, counted)
