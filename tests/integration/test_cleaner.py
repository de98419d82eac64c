"""Lazy rollback and cleaning: exact files deleted, exact timeline states, readers unchanged."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from support import hudi_rs
from support.tables import new_table

from cowrite.cleaner import clean, rollback_failed, service_lock
from cowrite.cleaner.rollback import _start
from cowrite.errors import (
    BaseFileGoneError,
    LeaseLostError,
    TimeTravelCleanedError,
    WriteConflictError,
)
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import list_base_files
from cowrite.format.instant import Action, State
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.liveness import pending_writers
from cowrite.protocol.transaction import Transaction, WriteOptions

POLICY = HeartbeatPolicy(interval=1.0, tolerable_misses=2)


@pytest.fixture
def table(tmp_path: Path) -> Table:
    beats = {"hoodie.client.heartbeat.interval_in_ms": "1000"}
    return new_table(tmp_path / "t", partition_fields=["p"], properties=beats)


def rows(ids: list[int], p: str = "a", ts: int = 1) -> pa.Table:
    return pa.table(
        {"id": ids, "p": [p] * len(ids), "ts": [ts] * len(ids), "v": [f"{p}{i}.{ts}" for i in ids]}
    )


def failed_write(table: Table, data: pa.Table) -> Transaction:
    """A writer that wrote its files and died before committing (its heartbeat stops)."""
    transaction: list[Transaction] = []

    def die(self: Transaction, metadata: CommitMetadata, **_: object) -> None:
        transaction.append(self)
        raise SystemExit("killed")

    original_commit, original_abort = Transaction.commit, Transaction.abort
    Transaction.commit, Transaction.abort = die, lambda self: None  # type: ignore[assignment,method-assign]
    try:
        with pytest.raises(SystemExit):
            LocalWriter(table).upsert(data)
    finally:
        Transaction.commit, Transaction.abort = original_commit, original_abort  # type: ignore[method-assign]
    transaction[0].heartbeat.stop(delete=False)  # type: ignore[union-attr]
    return transaction[0]


def snapshot(table: Table) -> list[dict[str, object]]:
    return sorted(read.snapshot(table).to_pylist(), key=lambda r: (r["p"], r["id"]))


def test_rollback_deletes_exactly_the_failed_writes_files_and_evidence(table: Table) -> None:
    LocalWriter(table).insert(rows([1, 2]))
    before = snapshot(table)
    committed_files = {b.path for b in list_base_files(table)}
    dead = failed_write(table, pa.concat_tables([rows([2], ts=2), rows([9], "b")]))
    garbage = {b.path for b in list_base_files(table)} - committed_files
    assert len(garbage) == 2 and all(dead.instant_time in g for g in garbage)

    assert rollback_failed(table, service_lock(table), POLICY, now=time.time()) == []  # heartbeat still fresh
    done = rollback_failed(table, service_lock(table), POLICY, now=time.time() + 3)
    assert [(d.target, set(d.deleted)) for d in done] == [(dead.instant_time, garbage)]
    assert {b.path for b in list_base_files(table)} == committed_files
    assert not table.storage.exists(f".hoodie/.heartbeat/{dead.instant_time}")
    timeline = table.timeline()
    assert timeline.get(dead.instant_time) is None
    assert [(i.action, i.state) for i in timeline] == [
        (Action.COMMIT, State.COMPLETED),
        (Action.ROLLBACK, State.COMPLETED),
    ]
    assert snapshot(table) == before
    assert hudi_rs.snapshot(table.uri) == hudi_rs.rows(read.snapshot(table))
    assert rollback_failed(table, service_lock(table), POLICY, now=time.time() + 3) == []  # idempotent


def test_a_writer_being_rolled_back_cannot_publish(table: Table) -> None:
    writer = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    assert writer.instant is not None
    stalled = table.timeline().get(writer.instant_time)
    assert stalled is not None
    # a judge whose clock says the heartbeat expired records the rollback plan ...
    assert _start(table, service_lock(table), stalled, POLICY, now=time.time() + 3) is not None
    # ... and the writer, re-checking under the lock, refuses to publish
    with pytest.raises(LeaseLostError, match="being rolled back"):
        writer.commit(CommitMetadata("insert", ()))
    assert table.timeline().completed().filter(actions=[Action.COMMIT]).requested_times == frozenset()


def test_rollback_re_checks_after_reload(table: Table) -> None:
    writer = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    judged = table.timeline().get(writer.instant_time)
    writer.commit(CommitMetadata("insert", ()))  # completes after it was judged
    assert judged is not None
    assert _start(table, service_lock(table), judged, POLICY, now=time.time() + 3) is None
    assert table.timeline().filter(actions=[Action.ROLLBACK]).requested_times == frozenset()


def test_interrupted_rollback_resumes(table: Table) -> None:
    LocalWriter(table).insert(rows([1]))
    dead = failed_write(table, rows([5], "c"))
    target = table.timeline().get(dead.instant_time)
    assert target is not None
    rollback = _start(table, service_lock(table), target, POLICY, now=time.time() + 3)  # then "crashed"
    assert rollback is not None
    plan = table.rollback_plan(rollback)
    table.storage.delete(plan.files[0])  # it had deleted one file already
    done = rollback_failed(table, service_lock(table), POLICY, now=time.time() + 3)
    assert [(d.rollback.requested_time, d.target) for d in done] == [
        (rollback.requested_time, dead.instant_time)
    ]
    assert [b.partition for b in list_base_files(table)] == ["a"]
    assert table.timeline().pending().requested_times == frozenset()


def test_a_killed_writer_process_is_rolled_back_by_the_command(table: Table, tmp_path: Path) -> None:
    LocalWriter(table).insert(rows([1]))
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"id": 7, "p": "z", "ts": 1, "v": "z7"}\n')
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cowrite.held",  # held once its files are written, until killed
            "written",
            "/nonexistent/release",
            "write",
            table.uri,
            "--input",
            str(batch),
        ],
    )
    deadline = time.time() + 60
    while not any(b.partition == "z" for b in list_base_files(table)):
        assert time.time() < deadline and writer.poll() is None
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    # The writer kept the default heartbeat, so no lapse can fail it while it is held; the command
    # judges it with a short tolerance (200 ms x 2 misses) instead of waiting two minutes.
    time.sleep(0.6)
    fast = ["-o", "hoodie.client.heartbeat.interval_in_ms=200"]
    result = subprocess.run(
        [sys.executable, "-m", "cowrite", "rollback", table.uri, *fast],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.startswith("rolled back "), result.stderr
    assert [b.partition for b in list_base_files(table)] == ["a"]
    assert snapshot(table) == [{"id": 1, "p": "a", "ts": 1, "v": "a1.1"}]
    assert table.timeline().pending().requested_times == frozenset()


def test_clean_keeps_what_retained_commits_need(table: Table) -> None:
    writer = LocalWriter(table)
    instants = [writer.upsert(rows([1, 2], ts=n)) for n in range(1, 5)]  # four versions of one file group
    writer.insert_overwrite(rows([8], "b"))
    overwrite = writer.insert_overwrite(rows([9], "b"))  # replaces the group of [8]
    files = sorted(b.path for b in list_base_files(table))
    assert len(files) == 6
    latest = snapshot(table)
    done = clean(table, service_lock(table), commits_retained=3)
    assert done is not None
    # retained: upsert 4, overwrite 1, overwrite 2 -> the group's versions 1-3 go; the replaced group stays
    # (replaced by the last overwrite, which a time travel to overwrite 1 still needs)
    assert sorted(done.deleted) == sorted(
        f for f in files if any(i.requested_time in f for i in instants[:3])
    )
    assert snapshot(table) == latest
    assert hudi_rs.snapshot(table.uri) == hudi_rs.rows(read.snapshot(table))
    assert [r["ts"] for r in read.snapshot(table, as_of=instants[3].requested_time).to_pylist()] == [4, 4]
    with pytest.raises(TimeTravelCleanedError, match=f"commits before {instants[3].requested_time}"):
        read.snapshot(table, as_of=instants[2].requested_time)  # would read nothing of group a, silently
    with pytest.raises(BaseFileGoneError, match=f"{instants[1].requested_time}.parquet was deleted"):
        read.incremental(table, until=instants[1].completion_time)  # the version it wrote is gone
    assert clean(table, service_lock(table), commits_retained=3) is None
    done = clean(table, service_lock(table), commits_retained=1)
    assert done is not None and [f.split("/")[0] for f in done.deleted] == ["b"]
    assert snapshot(table) == latest
    kinds = [(i.action, i.state) for i in table.timeline() if i.action is Action.CLEAN]
    assert kinds == [(Action.CLEAN, State.COMPLETED)] * 2
    assert overwrite.is_completed


def test_clean_never_touches_pending_writes(table: Table) -> None:
    writer = LocalWriter(table)
    for n in range(3):
        writer.upsert(rows([1], ts=n))
    dead = failed_write(table, rows([1], ts=9))
    done = clean(table, service_lock(table), commits_retained=1)
    assert done is not None
    assert all(dead.instant_time not in f for f in done.deleted)
    assert any(dead.instant_time in b.path for b in list_base_files(table))


def test_an_aborted_write_is_rolled_back_without_waiting(table: Table) -> None:
    LocalWriter(table).insert(rows([1]))
    slow = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    LocalWriter(table).upsert(rows([1], ts=2))
    [winner] = table.commit_metadata(list(table.timeline())[-1]).write_stats
    mine = replace(
        winner, path=winner.path.replace(winner.path.rsplit("_", 1)[-1], f"{slow.instant_time}.parquet")
    )
    with pytest.raises(WriteConflictError):  # same file group, its own file
        slow.commit(CommitMetadata("upsert", (mine,)))
    [pending] = pending_writers(table, table.timeline(), POLICY)
    assert (pending.instant.requested_time, pending.failed, pending.aborted) == (
        slow.instant_time,
        True,
        "conflict",
    )
    done = rollback_failed(table, service_lock(table), POLICY)  # now, not after the tolerance
    assert [d.target for d in done] == [slow.instant_time]
    assert snapshot(table) == [{"id": 1, "p": "a", "ts": 2, "v": "a1.2"}]
