"""Timeline archival: a bounded active timeline, and readers that stay exact across it."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from support import hudi_rs
from support.tables import new_table

from cowrite.cleaner import clean, rollback_failed, service_lock
from cowrite.cleaner.archive import ARCHIVE_DIR, archive
from cowrite.format import claims
from cowrite.format.fs_view import BaseFile, list_base_files, timeline_start
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.markers import create_marker
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.transaction import Transaction


@pytest.fixture
def table(tmp_path: Path) -> Table:
    beats = {"hoodie.client.heartbeat.interval_in_ms": "1000"}
    return new_table(tmp_path / "t", partition_fields=["p"], ordering_fields=[], properties=beats)


def rows(ids: range | list[int], p: str, v: int = 0) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "p": [p] * len(ids), "v": [v] * len(ids)})


def exact(table: Table) -> list[dict[str, object]]:
    mine = hudi_rs.rows(read.snapshot(table))
    assert hudi_rs.snapshot(table.uri) == mine
    return mine


def test_active_timeline_stays_bounded_and_readers_agree(table: Table) -> None:
    writer = LocalWriter(table)
    for n in range(12):
        writer.upsert(rows(range(n * 3, n * 3 + 5), f"p{n % 3}", v=n))
    before = exact(table)
    done = archive(table, service_lock(table), keep_min=4, keep_max=6)
    assert done is not None and len(done.instants) == 8
    timeline = table.timeline()
    assert len(timeline.data_commits()) == 4 and timeline.first is not None
    assert timeline.first.requested_time > max(done.instants)
    assert table.storage.exists(done.path) and done.path.startswith(ARCHIVE_DIR)
    assert exact(table) == before  # archived commits' files now count as older than the timeline
    assert archive(table, service_lock(table), keep_min=4, keep_max=6) is None
    writer.upsert(rows([0], "p0", v=99))  # writing after archival still works
    assert [r["v"] for r in exact(table) if r["id"] == 0] == [99]


def test_archival_stops_at_a_failed_write_until_it_is_rolled_back(table: Table) -> None:
    writer = LocalWriter(table)
    before_dead = [writer.upsert(rows([n], "a", v=n)) for n in range(3)][-1]
    assert before_dead is not None
    dead = Transaction.begin(table, "insert")
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)  # its writer died before writing anything
    for n in range(3, 10):
        writer.upsert(rows([n], "a", v=n))
    done = archive(table, service_lock(table), keep_min=2, keep_max=3)
    assert done is not None and max(done.instants) < dead.instant_time  # nothing past the failed instant
    # and the commit right before it stays: a claim alone does not start the timeline, that commit does
    timeline = table.timeline()
    assert [i.requested_time for i in timeline][:2] == [before_dead.requested_time, dead.instant_time]
    assert timeline_start(table, timeline) == before_dead.requested_time
    assert archive(table, service_lock(table), keep_min=2, keep_max=3) is None
    policy = HeartbeatPolicy(interval=1.0, tolerable_misses=2)
    assert [r.target for r in rollback_failed(table, service_lock(table), policy, now=time.time() + 5)] == [
        dead.instant_time
    ]
    done = archive(table, service_lock(table), keep_min=2, keep_max=3)
    assert done is not None and len(table.timeline().data_commits()) == 2
    assert [r["id"] for r in exact(table)] == list(range(10))


def test_a_replacecommit_stays_until_its_replaced_files_are_cleaned(table: Table) -> None:
    writer = LocalWriter(table)
    writer.insert(rows(range(3), "a"))
    writer.insert_overwrite(rows([7], "a"))  # replaces the first file group
    for n in range(5):
        writer.upsert(rows([100 + n], "b", v=n))
    done = archive(table, service_lock(table), keep_min=2, keep_max=3)
    assert done is not None and len(done.instants) == 1  # the insert; the replacecommit must stay
    assert [i.action for i in table.timeline()][0] is Action.REPLACE_COMMIT
    assert [r["id"] for r in exact(table)] == [7, 100, 101, 102, 103, 104]
    assert clean(table, service_lock(table), commits_retained=2) is not None  # deletes the replaced group
    done = archive(table, service_lock(table), keep_min=2, keep_max=3)
    assert done is not None and Action.REPLACE_COMMIT not in {i.action for i in table.timeline()}
    assert [r["id"] for r in exact(table)] == [7, 100, 101, 102, 103, 104]


def test_a_claim_made_from_a_stale_view_hides_no_archived_file(table: Table) -> None:
    """A writer paused between picking its claim's time and creating the claim resumes after archival and
    claims a time older than archived commits, until its listing makes it withdraw. Whoever lists the
    timeline meanwhile still sees the archived commits' files: an upsert updates their keys in place (with
    them hidden, it would write the keys again into a new file group: each key twice), and the cleaner
    deletes nothing of theirs."""
    writer = LocalWriter(table)
    first = writer.insert(rows(range(4), "a"))
    for n in range(5):
        writer.upsert(rows([10 + n], "b", v=n))
    done = archive(table, service_lock(table), keep_min=2, keep_max=3)
    assert done is not None and first is not None and first.requested_time in done.instants
    stale = Instant(from_millis(to_millis(first.requested_time) - 1), Action.COMMIT, State.REQUESTED)
    assert table.storage.create_if_absent(table.instant_path(stale), b"")
    assert table.timeline().first == stale

    writer.upsert(rows([1, 2], "a", v=7))
    assert clean(table, service_lock(table), commits_retained=1) is not None
    expected = [{"id": i, "p": "a", "v": 7 if i in (1, 2) else 0} for i in range(4)] + [
        {"id": 10 + n, "p": "b", "v": n} for n in range(5)
    ]
    assert sorted(hudi_rs.rows(read.snapshot(table)), key=lambda r: (r["p"], r["id"])) == expected
    claims.withdraw(table, stale, "a later instant meanwhile")
    assert sorted(exact(table), key=lambda r: (r["p"], r["id"])) == expected


def test_a_claim_older_than_every_commit_starts_the_timeline_of_a_table_that_archived_nothing(
    table: Table,
) -> None:
    """A Spark data source's tasks write files under a claim alone. When that write is the table's first
    and its driver dies, a commit after it must not make the claim's files count as archived."""
    dead = Transaction.begin(table, "insert")
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    LocalWriter(table).insert(rows([1, 2], "a"))
    [written] = list_base_files(table)
    orphan = BaseFile.file_name("0d0d0d0d-0000-0000-0000-000000000000-0", "0-0-1", dead.instant_time)
    table.storage.write(f"a/{orphan}", table.storage.read(written.path))
    timeline = table.timeline()
    assert timeline.first == dead.instant and timeline_start(table, timeline) == dead.instant_time
    assert [r["id"] for r in exact(table)] == [1, 2]


def test_a_claim_left_behind_at_the_time_of_an_archived_commit_rolls_back_none_of_its_files(
    table: Table,
) -> None:
    """A commit whose writer died before deleting its markers (a Spark driver killed right after
    publishing), archived since; a claim made from a stale view takes its time again and is left behind
    (its claimant killed before withdrawing it). The lazy rollback of that claim deletes the claim, and
    none of the committed files the old markers name."""
    writer = LocalWriter(table)
    marked = writer.insert(rows([1, 2], "a"))
    assert marked is not None
    [base] = list_base_files(table)
    create_marker(table.storage, marked.requested_time, base.path)
    for n in range(5):
        writer.upsert(rows([10 + n], "b", v=n))
    done = archive(table, service_lock(table), keep_min=2, keep_max=3)
    assert done is not None and marked.requested_time in done.instants
    stale = Instant(marked.requested_time, Action.COMMIT, State.REQUESTED)
    assert table.storage.create_if_absent(table.instant_path(stale), b"")

    policy = HeartbeatPolicy(interval=1.0, tolerable_misses=2)
    [rolled] = rollback_failed(table, service_lock(table), policy, now=time.time() + 5)
    assert (rolled.target, rolled.deleted) == (marked.requested_time, ())
    assert table.timeline().get(marked.requested_time) is None
    assert [(r["id"], r["v"]) for r in exact(table)] == [(1, 0), (2, 0)] + [(10 + n, n) for n in range(5)]
