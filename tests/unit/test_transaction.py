"""The transaction protocol in one process: instant times, conflicts, leases, retries."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from support.tables import new_table

from cowrite.engine.file_group import FileGroupWrite, write_file_group
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.errors import LeaseLostError, StorageError, WriteConflictError
from cowrite.format import claims
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.conflict import Candidate, Conflict, file_group_overlap
from cowrite.protocol.heartbeat import Heartbeat, HeartbeatPolicy, abort_reason, heartbeat_path
from cowrite.protocol.locks import LockHolder
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.protocol.locks.lock_files import LOCK_DIR, LockFiles
from cowrite.protocol.transaction import Transaction, WriteOptions


def _stat(partition: str, file_id: str, instant: str = "20260101000000000") -> WriteStat:
    name = f"{file_id}_0-0-1_{instant}.parquet"
    return WriteStat(file_id, f"{partition}/{name}", partition, "null", 1, 1, 0, 0, 10)


def _options(table: Table, clock: object = time.time, **settings: str) -> WriteOptions:
    config = table.config.with_values({"hoodie.write.lock.provider": "in-process", **settings})
    return WriteOptions(config=config, clock=clock)  # type: ignore[arg-type]


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return new_table(tmp_path / "t", partition_fields=["p"])


def _rows(ids: list[int], p: str, ts: int = 1) -> pa.Table:
    return pa.table({"id": ids, "p": [p] * len(ids), "ts": [ts] * len(ids), "v": [f"{p}{i}" for i in ids]})


def test_file_group_overlap_is_a_pure_function() -> None:
    mine = CommitMetadata("upsert", (_stat("a", "f1"), _stat("b", "f2")))
    winner = Instant("20260101000000001", Action.COMMIT, State.COMPLETED, "20260101000000002")
    other = Instant("20260101000000003", Action.REPLACE_COMMIT, State.COMPLETED, "20260101000000004")
    candidates = [
        Candidate(winner, CommitMetadata("upsert", (_stat("a", "f1"), _stat("a", "f9")))),
        Candidate(other, CommitMetadata("insert_overwrite", (), {"b": ("f2",)})),
        Candidate(winner, CommitMetadata("upsert", (_stat("c", "f1"),))),  # same id, other partition
    ]
    conflicts = file_group_overlap(mine, candidates)
    assert [(c.winner, c.file_groups) for c in conflicts] == [
        (winner, frozenset({("a", "f1")})),
        (other, frozenset({("b", "f2")})),  # a replaced file group counts as touched
    ]


def test_second_writer_of_a_file_group_conflicts_and_leaves_nothing(table: Table) -> None:
    LocalWriter(table, _options(table)).insert(_rows([1, 2], "a"))
    slow = Transaction.begin(table, "upsert", options=_options(table))
    LocalWriter(table, _options(table)).upsert(_rows([1], "a", ts=2))  # completes first
    group = next(iter(read.snapshot(table, with_meta=True).column("_hoodie_file_name").to_pylist()))
    file_id = group.split("_")[0]
    slow.plan(CommitMetadata("upsert", (_stat("a", file_id, slow.instant_time),)))
    with pytest.raises(WriteConflictError) as caught:
        slow.commit(CommitMetadata("upsert", (_stat("a", file_id, slow.instant_time),)))
    winner = table.timeline().completed().filter(actions=[Action.COMMIT])
    assert caught.value.instant == slow.instant_time
    assert caught.value.winner == list(winner)[-1].requested_time
    assert caught.value.file_groups == [f"a/{file_id}"]
    assert table.timeline().get(slow.instant_time) == Instant(
        slow.instant_time, Action.COMMIT, State.INFLIGHT
    )


def test_disjoint_writers_both_commit(table: Table) -> None:
    first = Transaction.begin(table, "insert", options=_options(table))
    second = Transaction.begin(table, "insert", options=_options(table))
    done_second = second.commit(CommitMetadata("insert", (_stat("b", "g2", second.instant_time),)))
    done_first = first.commit(CommitMetadata("insert", (_stat("a", "g1", first.instant_time),)))
    assert done_first.requested_time < done_second.requested_time
    assert done_second.completion_time < done_first.completion_time  # completion order = commit order


@pytest.mark.parametrize(
    ("first", "rival_group"),
    [("writer", ("a", "g1")), ("rival", ("a", "g1")), ("writer", ("b", "g2"))],
    ids=str,
)
def test_a_claim_stands_below_a_pending_instant_claimed_meanwhile(
    table: Table, monkeypatch: pytest.MonkeyPatch, first: str, rival_group: tuple[str, str]
) -> None:
    """A rival claims a later time between a writer's claim and the listing after it. The writer's claim
    stands: only a completed instant of a later time makes a claim withdraw. Of the two, writing one file
    group, the second to complete loses whatever their times; writing elsewhere, both commit."""
    rivals: list[Transaction | None] = []
    listed = Table.timeline

    def the_rival_claims_first(self: Table, tail: bool = False) -> Timeline:
        if tail and not rivals:  # the writer's listing after its claim
            rivals.append(None)
            rivals[0] = Transaction.begin(table, "insert", options=_options(table))
        return listed(self, tail)

    withdrawn: list[Instant] = []
    monkeypatch.setattr(Table, "timeline", the_rival_claims_first)
    monkeypatch.setattr(claims, "withdraw", lambda table, instant, *_, **__: withdrawn.append(instant))
    writer = Transaction.begin(table, "insert", options=_options(table))
    monkeypatch.undo()
    rival = rivals[0]
    assert rival is not None and writer.instant_time < rival.instant_time and withdrawn == []

    groups = {writer: ("a", "g1"), rival: rival_group}
    one, other = (writer, rival) if first == "writer" else (rival, writer)
    for transaction in (one, other):
        stats = (_stat(*groups[transaction], transaction.instant_time),)
        transaction.plan(CommitMetadata("insert", stats))
    done = one.commit(CommitMetadata("insert", (_stat(*groups[one], one.instant_time),)))
    last = CommitMetadata("insert", (_stat(*groups[other], other.instant_time),))
    if rival_group == groups[writer]:
        with pytest.raises(WriteConflictError) as caught:
            other.commit(last)
        assert caught.value.winner == one.instant_time
        second = Instant(other.instant_time, Action.COMMIT, State.INFLIGHT)  # left for the lazy rollback
    else:
        second = other.commit(last)
        assert (done.completion_time or "") < (second.completion_time or "")
    assert list(table.timeline()) == sorted([done, second], key=lambda i: i.requested_time)


def test_instant_times_unique_and_completions_ordered_whatever_the_clocks(table: Table) -> None:
    now = time.time()
    skews = itertools.cycle([-5.0, 0.0, 5.0])
    committed = []
    for n in range(9):
        skew = next(skews)
        options = _options(table, clock=lambda skew=skew: now + skew)
        transaction = Transaction.begin(table, "insert", options=options)
        committed.append(
            transaction.commit(CommitMetadata("insert", (_stat("p", f"g{n}", transaction.instant_time),)))
        )
    requested = [i.requested_time for i in committed]
    completions = [i.completion_time for i in committed]
    assert len(set(requested)) == 9
    assert completions == sorted(completions) and len(set(completions)) == 9
    assert all(i.completion_time > i.requested_time for i in committed)  # type: ignore[operator]


def test_an_instant_time_is_never_reused(table: Table) -> None:
    frozen = _options(table, clock=lambda: 1_700_000_000.0)
    times = [Transaction.begin(table, "insert", options=frozen).instant_time for _ in range(3)]
    assert times == [from_millis(1_700_000_000_000 + n) for n in range(3)]
    # a rollback records itself (at a later time) before it deletes the failed instant's files, so the
    # rolled-back time never becomes free again
    rollback = Instant(from_millis(to_millis(times[-1]) + 1), Action.ROLLBACK, State.REQUESTED)
    table.storage.create_if_absent(table.instant_path(rollback), b"")
    table.storage.delete(f".hoodie/timeline/{times[-1]}.commit.requested")
    later = Transaction.begin(table, "insert", options=frozen).instant_time
    assert later not in times and to_millis(later) == to_millis(rollback.requested_time) + 1


@pytest.mark.parametrize("strategy", ["reject", "allow"])
def test_pending_clustering_plan_and_priority(table: Table, strategy: str) -> None:
    clustering = Instant("20200101000000000", Action.REPLACE_COMMIT, State.REQUESTED)
    plan = CommitMetadata("cluster", (), {"a": ("g1",)})
    table.storage.create_if_absent(table.instant_path(clustering), plan.to_bytes(Action.REPLACE_COMMIT))
    options = _options(table, **{"hoodie.clustering.updates.strategy": strategy})
    writer = Transaction.begin(table, "upsert", options=options)
    ingestion = CommitMetadata("upsert", (_stat("a", "g1", writer.instant_time),))
    if strategy == "reject":  # clustering first: its pending plan counts as touched
        with pytest.raises(WriteConflictError) as caught:
            writer.commit(ingestion)
        assert caught.value.winner == clustering.requested_time
    else:  # ingestion first: the ingestion commits; the clustering will conflict at its own commit
        assert writer.commit(ingestion).is_completed


@pytest.mark.parametrize("case", ["paused past the tolerance", "renewals failing"])
def test_lost_lease_never_publishes(table: Table, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    options = _options(table, **{"hoodie.client.heartbeat.interval_in_ms": "1000"})  # x 2 misses
    transaction = Transaction.begin(table, "insert", options=options)
    assert transaction.heartbeat is not None
    transaction.heartbeat.clock = lambda: clock[0]
    transaction.heartbeat._renewed_at = 0.0
    if case == "paused past the tolerance":
        clock[0] = 2.5  # the renewal at commit comes too late: the lease is gone for good
    else:
        clock[0] = 1.8  # 0.2 s of lease left, less than the 0.5 s margin, and the storage refuses renewals
        write = transaction.table.storage.write

        def refuse_heartbeats(path: str, data: bytes) -> None:
            if path.startswith(".hoodie/.heartbeat/"):
                raise StorageError("storage down")
            write(path, data)

        monkeypatch.setattr(transaction.table.storage, "write", refuse_heartbeats)
    with pytest.raises(LeaseLostError):
        transaction.commit(CommitMetadata("insert", (_stat("a", "g1", transaction.instant_time),)))
    assert table.timeline().completed().requested_times == frozenset()


def test_heartbeats_are_renewed_in_the_background_until_stopped(table: Table) -> None:
    policy = HeartbeatPolicy(interval=0.05, tolerable_misses=100)
    storage = table.storage
    beats = [Heartbeat(storage, f"2026010100000000{i}", policy, owner=f"w{i}").start() for i in range(3)]
    renewals = {b.instant: 0 for b in beats}
    write = storage.write

    def counted(path: str, data: bytes) -> None:
        renewals[path.rsplit("/", 1)[-1]] += 1
        write(path, data)

    storage.write = counted  # type: ignore[method-assign]
    deadline = time.monotonic() + 30
    while min(renewals.values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert min(renewals.values()) >= 3, renewals  # every heartbeat of the process, not only the first

    beats[0].stop(delete=True)
    beats[1].mark_aborted("conflict")
    stopped = dict(renewals)
    time.sleep(0.3)  # six intervals
    assert renewals[beats[0].instant] == stopped[beats[0].instant]
    assert not storage.exists(heartbeat_path(beats[0].instant))
    assert abort_reason(storage, beats[1].instant) == "conflict"  # not overwritten by a late renewal
    assert renewals[beats[2].instant] > stopped[beats[2].instant]
    beats[2].stop()


def test_heartbeats_still_due_when_the_interpreter_exits_end_quietly(tmp_path: Path) -> None:
    # A process may exit while a writer's heartbeat is still due (a thread left writing, a script that
    # ends early). Python shuts the renewal pool down first; the scheduler must then stop, not print a
    # traceback from a background thread.
    script = f"""
import concurrent.futures.thread, time
from cowrite.protocol import heartbeat
from cowrite.storage.backend import Storage
beat = heartbeat.Heartbeat(Storage.for_uri({str(tmp_path)!r}), "20260101000000000",
                           heartbeat.HeartbeatPolicy(interval=0.01, tolerable_misses=100)).start()
concurrent.futures.thread._python_exit()  # what the interpreter does on its way out
heartbeat._renewals._thread.join(30)  # its next renewal comes due after that
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")


def test_retry_on_conflict_uses_a_new_instant(table: Table, monkeypatch: pytest.MonkeyPatch) -> None:
    LocalWriter(table, _options(table)).insert(_rows([1], "a"))
    interloper = LocalWriter(table, _options(table))
    begin = Transaction.begin
    began: list[str] = []

    def begin_then_interfere(*args: object, **kwargs: object) -> Transaction:
        transaction = begin(*args, **kwargs)  # type: ignore[arg-type]
        began.append(transaction.instant_time)
        if len(began) == 1:  # another writer updates the same file group meanwhile
            monkeypatch.setattr(Transaction, "begin", begin)
            interloper.upsert(_rows([1], "a", ts=5))
            monkeypatch.setattr(Transaction, "begin", begin_then_interfere)
        return transaction

    monkeypatch.setattr(Transaction, "begin", begin_then_interfere)
    retrying = LocalWriter(table, _options(table, **{"hoodie.write.num.retries.on.conflict.failures": "1"}))
    committed = retrying.upsert(_rows([1], "a", ts=9))
    assert len(began) == 2 and began[0] != began[1] == committed.requested_time
    assert read.snapshot(table).to_pylist() == [{"id": 1, "p": "a", "ts": 9, "v": "a1"}]


def _early(table: Table) -> WriteOptions:
    return _options(
        table,
        **{
            "hoodie.write.concurrency.early.conflict.detection.enable": "true",
            "hoodie.write.concurrency.async.conflict.detector.period_ms": "0",
        },
    )


def test_early_detection_aborts_the_later_writer_while_it_writes(table: Table) -> None:
    earlier = Transaction.begin(table, "upsert", options=_early(table))
    later = Transaction.begin(table, "upsert", options=_early(table))
    earlier.plan(CommitMetadata("upsert", (_stat("a", "g1", earlier.instant_time),)))
    later.plan(
        CommitMetadata("upsert", (_stat("a", "g1", later.instant_time), _stat("b", "g2", later.instant_time)))
    )
    earlier.check_alive()  # the earlier instant wins by the rule: it goes on
    with pytest.raises(WriteConflictError) as caught:
        later.check_alive()
    assert (caught.value.instant, caught.value.winner, caught.value.file_groups) == (
        later.instant_time,
        earlier.instant_time,
        ["a/g1"],
    )
    earlier.commit(CommitMetadata("upsert", (_stat("a", "g1", earlier.instant_time),)))


def test_early_detection_sees_commits_completed_since_begin(table: Table) -> None:
    late = Transaction.begin(table, "upsert", options=_early(table))
    late.plan(CommitMetadata("upsert", (_stat("a", "g1", late.instant_time),)))
    late.check_alive()
    quick = Transaction.begin(table, "upsert", options=_options(table))
    quick.commit(CommitMetadata("upsert", (_stat("a", "g1", quick.instant_time),)))
    with pytest.raises(WriteConflictError) as caught:
        late.check_alive()
    assert caught.value.winner == quick.instant_time


def test_a_writer_waiting_for_the_lock_gives_up_on_a_conflict_a_turn_published(table: Table) -> None:
    """A waiter reads the commits the lock's turns published since its begin; one that touched its file
    groups is a conflict the check under the lock would find: the write fails at once, without a turn."""
    options = WriteOptions(config=table.config.with_values({"hoodie.write.lock.wait_time_ms": "5000"}))
    slow = Transaction.begin(table, "upsert", options=options)
    slow.plan(CommitMetadata("upsert", (_stat("a", "g1", slow.instant_time),)))
    quick = Transaction.begin(table, "upsert", options=options)
    quick.commit(CommitMetadata("upsert", (_stat("a", "g1", quick.instant_time),)))
    holder = FileSystemLock(table.storage, LockHolder(owner="holder"), HeartbeatPolicy(30.0, 2))
    holder.acquire(timeout=5)
    before = sorted(info.name for info in table.storage.list(LOCK_DIR))
    with pytest.raises(WriteConflictError) as caught:
        slow.commit(CommitMetadata("upsert", (_stat("a", "g1", slow.instant_time),)))
    assert (caught.value.winner, caught.value.file_groups) == (quick.instant_time, ["a/g1"])
    assert sorted(info.name for info in table.storage.list(LOCK_DIR)) == before  # it took no turn
    holder.release()
    left = Instant(slow.instant_time, Action.COMMIT, State.INFLIGHT)  # for the lazy rollback
    assert table.timeline().get(slow.instant_time) == left


# Stats that name files never written: the record-key check, which would read them, is off.
_NO_KEY_CHECK = {"cowrite.write.conflict.record.keys": "false"}


class _Told:
    """The file-group strategy, recording the times of the candidates of each call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, mine: CommitMetadata, candidates: Sequence[Candidate]) -> list[Conflict]:
        self.calls.append([c.instant.requested_time for c in candidates])
        return file_group_overlap(mine, candidates)


def test_a_waiter_checks_each_commit_a_turn_published_once(table: Table) -> None:
    """A waiter lists the lock directory again and again while the lock is another's; each listing shows
    the same published commit, which the waiter checks for a conflict on the first only."""
    told = _Told()
    holder = FileSystemLock(table.storage, LockHolder(owner="holder"), HeartbeatPolicy(30.0, 2))
    lock = FileSystemLock(table.storage, LockHolder(owner="waiter"), HeartbeatPolicy(30.0, 2))
    scans = 0
    scan = lock._scan

    def scan_then_release_on_the_third(fresh_for: float = 0.0) -> LockFiles:
        nonlocal scans
        scans += 1
        if scans == 3:
            holder.release()
        return scan(fresh_for)

    lock._scan = scan_then_release_on_the_third  # type: ignore[method-assign]
    config = table.config.with_values({"hoodie.write.lock.wait_time_ms": "10000", **_NO_KEY_CHECK})
    slow = Transaction.begin(table, "upsert", options=WriteOptions(config, lock=lock, conflict_strategy=told))
    slow.plan(CommitMetadata("upsert", (_stat("a", "g1", slow.instant_time),)))
    quick = Transaction.begin(table, "upsert", options=WriteOptions(config))
    quick.commit(CommitMetadata("upsert", (_stat("a", "g2", quick.instant_time),)))
    holder.acquire(timeout=5)
    slow.commit(CommitMetadata("upsert", (_stat("a", "g1", slow.instant_time),)))
    assert scans >= 3  # two listings while the lock was the holder's
    assert told.calls == [[quick.instant_time], [quick.instant_time]]  # while waiting, and under the lock
    assert slow.instant_time in table.timeline().completed_times


def test_a_writer_that_finds_the_lock_free_checks_what_the_turns_published_once_it_holds_it(
    table: Table,
) -> None:
    """A writer whose commit finds the lock free reads the commits the turns published beside taking it,
    and checks them for a conflict only under the lock: by then the lock may be its own."""
    told = _Told()
    config = table.config.with_values(_NO_KEY_CHECK)
    slow = Transaction.begin(table, "upsert", options=WriteOptions(config, conflict_strategy=told))
    slow.plan(CommitMetadata("upsert", (_stat("a", "g1", slow.instant_time),)))
    quick = Transaction.begin(table, "upsert", options=WriteOptions(config))
    quick.commit(CommitMetadata("upsert", (_stat("a", "g2", quick.instant_time),)))
    slow.commit(CommitMetadata("upsert", (_stat("a", "g1", slow.instant_time),)))
    assert told.calls == [[quick.instant_time]]  # under the lock
    assert slow.instant_time in table.timeline().completed_times


def test_early_detection_is_off_by_default(table: Table) -> None:
    earlier = Transaction.begin(table, "upsert", options=_options(table))
    later = Transaction.begin(table, "upsert", options=_options(table))
    earlier.plan(CommitMetadata("upsert", (_stat("a", "g1", earlier.instant_time),)))
    later.plan(CommitMetadata("upsert", (_stat("a", "g1", later.instant_time),)))
    later.check_alive()


@pytest.mark.parametrize("check_keys", [False, True])
def test_concurrent_upserts_of_one_new_key(table: Table, check_keys: bool) -> None:
    options = _options(table, **{"cowrite.write.conflict.record.keys": str(check_keys).lower()})
    first = LocalWriter(table, options)
    slow = Transaction.begin(table, "upsert", options=options)
    first.upsert(_rows([1, 2], "a"))  # completes while the slow writer is writing
    batch = _rows([2, 3], "a", ts=5)
    incoming = batch.append_column(RECORD_KEY, pa.array(["2", "3"])).append_column(
        PARTITION_PATH, pa.array(["a", "a"])
    )
    work = FileGroupWrite.create("a", "own-group-0", slow.instant_time, "0-0-1", None, merge=False)
    stat = write_file_group(table.storage, work, slow.instant_time, incoming)
    if check_keys:
        with pytest.raises(WriteConflictError, match="records with the same keys") as caught:
            slow.commit(CommitMetadata("upsert", (stat,)))
        assert caught.value.file_groups == ["a/2"]
        assert sorted(r["id"] for r in read.snapshot(table).to_pylist()) == [1, 2]
    else:  # what users of plain OCC get: two records with key 2
        slow.commit(CommitMetadata("upsert", (stat,)))
        assert sorted(r["id"] for r in read.snapshot(table).to_pylist()) == [1, 2, 2, 3]
