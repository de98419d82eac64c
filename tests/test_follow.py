"""Following a timeline: one listing, then only what changed.

On local disk the follower learns from inotify events (watchdog) and never lists again; on object stores
(memory, S3) it lists once per poll and reports only names it has not seen. One body per scenario runs on
every backend; the only difference the tests allow is how many listings each needed.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

from cowrite.cleaner import rollback_failed, service_lock
from cowrite.daemon.follow import TimelineFollower
from cowrite.timeline.commit_metadata import CommitMetadata
from cowrite.timeline.heartbeat import HeartbeatPolicy
from cowrite.timeline.instant import Instant
from cowrite.timeline.storage import LocalStorage
from cowrite.timeline.table import Table
from cowrite.timeline.timeline import TIMELINE_DIR
from cowrite.timeline.transaction import Transaction, WriteOptions
from cowrite.writer.local import LocalWriter

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


def rows(ids: list[int], p: str = "a") -> pa.Table:
    return pa.table({"id": ids, "p": [p] * len(ids)})


def listed(table: Table) -> set[str]:
    return {info.name for info in table.storage.list(TIMELINE_DIR)}


def names(instants: list[Instant]) -> list[str]:
    return sorted(i.file_name for i in instants)


class Tail:
    """Polls a follower and keeps what each poll reported, until the follower agrees with the storage."""

    def __init__(self, follower: TimelineFollower) -> None:
        self.follower = follower
        self.polls = 0

    def until_current(self, table: Table) -> tuple[list[str], list[str]]:
        """Poll until the follower's timeline equals a fresh load; the names created and deleted meanwhile.

        Events of one directory arrive in order and an instant's files are created (and deleted) in a fixed
        order, so equal timelines mean every event up to the load has been seen.
        """
        created: list[Instant] = []
        deleted: list[Instant] = []
        want = list(table.timeline())
        deadline = time.monotonic() + WAIT
        while True:
            new, gone = self.follower.poll()
            self.polls += 1
            created += new
            deleted += gone
            if list(self.follower.timeline) == want:
                return names(created), names(deleted)
            assert time.monotonic() < deadline, f"follower never caught up with {want}"
            time.sleep(0.01)

    def expected_listings(self, table: Table) -> int:
        """Local disk: the first listing only. Object stores: one more per poll."""
        return 1 if isinstance(table.storage, LocalStorage) else 1 + self.polls


def test_follows_commits_and_a_rollback_without_relisting(table: Table) -> None:
    writer = LocalWriter(table)
    first = writer.insert(rows([1]))
    follower = TimelineFollower(table)
    try:
        assert names(follower.start()) == sorted(listed(table))
        assert len(listed(table)) == 3  # requested, inflight, completed of the first commit
        tail = Tail(follower)
        assert tail.until_current(table) == ([], [])

        commits = [writer.insert(rows([n], p=f"p{n}")) for n in range(2, 6)]
        created, deleted = tail.until_current(table)
        assert created == sorted(
            name
            for c in commits
            for name in (f"{c.requested_time}.commit.requested", f"{c.requested_time}.inflight", c.file_name)
        )
        assert deleted == []

        # a writer that planned its write and died; the rollback deletes its pending files
        options = WriteOptions(config=table.config)
        dead = Transaction.begin(table, "insert", options=options)
        dead.plan(CommitMetadata("insert", ()))
        assert dead.heartbeat is not None
        dead.heartbeat.stop(delete=False)
        created, deleted = tail.until_current(table)
        assert created == [f"{dead.instant_time}.commit.requested", f"{dead.instant_time}.inflight"]
        [done] = rollback_failed(table, service_lock(table), HeartbeatPolicy(), now=time.time() + 3600)
        created, deleted = tail.until_current(table)
        assert created == sorted(
            [f"{done.rollback.requested_time}.rollback.requested", done.rollback.file_name]
        )
        assert deleted == [f"{dead.instant_time}.commit.requested", f"{dead.instant_time}.inflight"]

        assert list(follower.timeline) == list(table.timeline())
        assert [i.requested_time for i in follower.timeline.data_commits()] == [
            first.requested_time,
            *(c.requested_time for c in commits),
        ]
        assert follower.listings == tail.expected_listings(table)
    finally:
        follower.stop()


def test_hidden_and_foreign_files_are_not_instants(table: Table) -> None:
    follower = TimelineFollower(table)
    try:
        assert follower.start() == []
        tail = Tail(follower)
        # temporary files of atomic writes are hidden names; other tools may leave checksums or notes
        table.storage.write(f"{TIMELINE_DIR}/.20260101000000000.commit.requested.tmp", b"")
        table.storage.write(f"{TIMELINE_DIR}/20260101000000000.commit.crc", b"")
        table.storage.write(f"{TIMELINE_DIR}/NOTES.txt", b"not an instant")
        sentinel = LocalWriter(table).insert(rows([1]))
        deadline = time.monotonic() + WAIT
        created: list[Instant] = []
        while sentinel not in created:
            created += follower.poll()[0]
            tail.polls += 1
            assert time.monotonic() < deadline, "the sentinel commit never arrived"
            time.sleep(0.01)
        assert names(created) == sorted(
            [
                f"{sentinel.requested_time}.commit.requested",
                f"{sentinel.requested_time}.inflight",
                sentinel.file_name,
            ]
        )
        assert list(follower.timeline) == list(table.timeline())
        assert follower.listings == tail.expected_listings(table)
    finally:
        follower.stop()


def test_a_follower_without_events_lists_per_poll_and_reports_only_new_names(table: Table) -> None:
    writer = LocalWriter(table)
    writer.insert(rows([1]))
    follower = TimelineFollower(table, use_events=False)
    try:
        follower.start()
        assert follower.poll() == ([], [])
        second = writer.insert(rows([2]))
        created, deleted = follower.poll()
        assert names(created) == sorted(
            [
                f"{second.requested_time}.commit.requested",
                f"{second.requested_time}.inflight",
                second.file_name,
            ]
        )
        assert deleted == []
        assert follower.poll() == ([], [])
        assert follower.listings == 4
    finally:
        follower.stop()
