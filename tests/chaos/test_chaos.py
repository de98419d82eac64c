"""The fault-injection harness in its quick mode, the checker's own teeth, and the bugs the harness found.

``bench/chaos`` runs random multi-writer scenarios under kills, stops, skewed clocks and failing storage,
and checks the nine invariants of DESIGN.md (see its docstrings and the README). Here it runs a few small
scenarios of a fixed seed (``COWRITE_CHAOS_SEED`` picks another; the long mode runs on demand:
``python -m bench.chaos --seed N --scenarios K --long``). Each bug the harness found has a deterministic
test below, so it stays fixed even when no random scenario happens to hit it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ROOT, hudi_rs
from support.tables import new_table, rows

from cowrite.cleaner import Cleaned, archive, clean, rollback_failed, service_lock
from cowrite.cleaner.rollback import RolledBack, _finish, _start, remove_withdrawn_claims
from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.metrics import DaemonMetrics
from cowrite.daemon.service import TableService
from cowrite.engine.operations import Operation
from cowrite.errors import CheckpointArchivedError, LeaseLostError, StorageError, WriteConflictError
from cowrite.format import claims
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR, Timeline
from cowrite.local import read
from cowrite.local.writer import HeldInput, LocalWriter
from cowrite.protocol.heartbeat import HEARTBEAT_DIR, Heartbeat, HeartbeatPolicy, heartbeat_path
from cowrite.protocol.locks.base import LockHolder
from cowrite.protocol.locks.holders import expire_lock
from cowrite.protocol.locks.lock_files import acquired_path
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.steps import Step, observe
from cowrite.storage.backend import Storage

sys.path.insert(0, str(ROOT))  # bench/ lives beside the package

from bench import chaos  # noqa: E402
from bench.chaos.checker import EPSILON, Checker  # noqa: E402
from bench.chaos.plan import QUICK, scenario  # noqa: E402
from bench.chaos.runner import Outcome  # noqa: E402

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("COWRITE_CHAOS_SEED", "20261121"))
QUICK_SCENARIOS = 6  # every daemon mode, every consumer mode, archival in half of them
POLICY = HeartbeatPolicy(0.2, 2)
SETTINGS = {
    keys.HEARTBEAT_INTERVAL_MS.key: "200",
    keys.HEARTBEAT_TOLERABLE_MISSES.key: "2",
    keys.LEASE_SAFETY_MARGIN_MS.key: "100",
}


def test_quick_chaos_run_violates_no_invariant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = chaos.run(SEED, QUICK_SCENARIOS, QUICK, workdir=tmp_path, backends=("local",), progress=print)
    print(report.summary())
    stats = report.stats
    assert report.violations == [], "\n".join(map(str, report.violations)) + (
        f"\nreplay: python -m bench.chaos --seed {SEED} --scenarios {QUICK_SCENARIOS} --keep"
    )
    # the run did what it is for
    assert stats.scenarios == QUICK_SCENARIOS
    assert stats.commits > 0 and stats.kills > 0 and stats.rollbacks > 0 and stats.storage_faults > 0
    assert stats.consumer_pulls > 0
    plans = [scenario(SEED, i, QUICK) for i in range(QUICK_SCENARIOS)]
    assert any(r.column for plan in plans for w in plan.writers for r in w.rounds)  # the schema changes


# -- the checker has teeth ---------------------------------------------------------------------------


def _outcome(uri: str, seed_instant: str) -> Outcome:
    plan = replace(scenario(SEED, 0, QUICK), writers=(), consumers=(), commits_retained=10)
    return Outcome(
        scenario=plan,
        uri=uri,
        storage_options={},
        hudi_options={},
        seed_instant=seed_instant,
        events={},
        commit_log=[],
        harness=[],
        exits={},
        outputs={},
        consumers=[],
        policy=POLICY,
    )


def test_the_checker_reports_planted_violations(tmp_path: Path) -> None:
    """A clean table passes; lost rows, garbage, a stray heartbeat and a held lock are each reported."""
    plan = scenario(SEED, 0, QUICK)
    table = new_table(tmp_path / "t", properties=SETTINGS)
    seeded = LocalWriter(table).insert(
        pa.table(
            {
                "id": [r.id for r in plan.seed_rows],
                "part": [r.part for r in plan.seed_rows],
                "ts": pa.array([r.ts for r in plan.seed_rows], pa.int64()),
                "value": [r.value for r in plan.seed_rows],
            }
        )
    )
    assert Checker(_outcome(table.uri, seeded.requested_time)).check()[0] == []

    (first, *_) = sorted(p for p in (i.path for i in table.storage.walk_files()) if p.endswith(".parquet"))
    data = table.storage.read(first)
    garbage = first.replace(seeded.requested_time, "20991231000000000")
    table.storage.write(garbage, data)  # a base file of an instant that never completed
    table.storage.write(heartbeat_path("20991231000000000"), b"{}")
    held = service_lock(table, "planted")
    held.acquire()
    violations, _ = Checker(_outcome(table.uri, seeded.requested_time)).check()
    found = {v.invariant for v in violations}
    assert {"7", "9"} <= found, violations
    held.release()
    table.storage.delete(garbage)
    table.storage.delete(first)  # committed data lost
    violations, _ = Checker(_outcome(table.uri, seeded.requested_time)).check()
    assert any(v.invariant == "1" for v in violations), violations


# -- bugs the harness found ------------------------------------------------------------------------


@pytest.fixture
def table(tmp_path: Path) -> Table:
    archival = {keys.KEEP_MIN_COMMITS.key: "2", keys.KEEP_MAX_COMMITS.key: "3"}
    return new_table(tmp_path / "t", properties={**SETTINGS, **archival})


def staged(
    table: Table, data: pa.Table, operation: Operation, options: WriteOptions | None = None
) -> tuple[Transaction, object]:
    """A write that began and wrote its files, not committed yet: (transaction, its commit metadata)."""
    writer = LocalWriter(table, options)
    held = HeldInput.of(table, data, operation)
    transaction = Transaction.begin(table, operation.value, operation.action, writer.options)
    metadata, _ = writer._write_files(transaction, held)
    return transaction, metadata


def test_archival_keeps_a_commit_a_pending_writer_has_not_seen(table: Table) -> None:
    """A commit that completed while another writer was pending was archived before that writer committed:
    its conflict check no longer saw it and it overwrote the commit's update (a lost update)."""
    LocalWriter(table).insert(rows(["a", "b"]))
    first, first_plan = staged(table, rows(["b"], value="first"), Operation.UPSERT)
    second, second_plan = staged(table, rows(["a"], value="second"), Operation.UPSERT)  # same file group
    first.commit(first_plan)  # type: ignore[arg-type]
    for i in range(3):
        LocalWriter(table).insert(rows([f"x{i}"], part=f"q{i}"))
    archived = archive(table, service_lock(table))
    assert archived is None or first.instant_time not in archived.instants
    with pytest.raises(WriteConflictError):
        second.commit(second_plan)  # type: ignore[arg-type]
    assert {r["id"]: r["value"] for r in read.snapshot(table).to_pylist() if r["part"] == "p0"} == {
        "a": "v",
        "b": "first",
    }


def test_archival_keeps_the_latest_completion_time(table: Table) -> None:
    """A long write from a clock 30 s ahead completed last; once it was archived, the next commit took a
    completion time below it (completion times went back; a consumer past it skipped the new commit)."""
    LocalWriter(table).insert(rows(["a"]))
    ahead = WriteOptions(config=table.config, clock=lambda: time.time() + 30)
    slow, slow_plan = staged(table, rows(["b"], part="p1"), Operation.INSERT, ahead)
    for i in range(3):
        LocalWriter(table).insert(rows([f"x{i}"], part=f"q{i}"))
    done = slow.commit(slow_plan)  # type: ignore[arg-type]
    archive(table, service_lock(table))
    after = LocalWriter(table).insert(rows(["c"], part="p2"))
    assert (after.completion_time or "") > (done.completion_time or "")


def test_cleaning_keeps_the_file_slice_a_pending_writer_reads(table: Table) -> None:
    """Commits that completed while a writer was pending made the file slice it had seen an old version,
    and the cleaner deleted it before the writer merged into it (FileNotFoundError in the middle of a
    write; Hudi keeps the earliest commit to retain below the earliest pending one)."""
    writer = LocalWriter(table)
    versions = [writer.insert(rows(["a", "b"])), writer.upsert(rows(["a"], ts=2))]
    held = HeldInput.of(table, rows(["b"], ts=5, value="late"), Operation.UPSERT)
    time.sleep(0.02)  # modification times tick by milliseconds, and a tie with the claim counts as unseen
    late = Transaction.begin(table, "upsert", Action.COMMIT, writer.options)
    versions += [writer.upsert(rows(["a"], ts=3)), writer.upsert(rows(["a"], ts=4))]

    def files_of(cleaned: Cleaned | None) -> list[str]:
        assert cleaned is not None
        times = [v.requested_time for v in versions]
        return sorted(next(t for t in times if t in path) for path in cleaned.deleted)

    # only the version superseded before the late writer began may go
    assert files_of(clean(table, service_lock(table), 1)) == [versions[0].requested_time]
    metadata, _ = writer._write_files(late, held)  # reads the slice it saw
    with pytest.raises(WriteConflictError):
        late.commit(metadata)
    rollback_failed(table, service_lock(table), POLICY)
    assert files_of(clean(table, service_lock(table), 1)) == [v.requested_time for v in versions[1:3]]
    assert {r["id"]: r["ts"] for r in read.snapshot(table).to_pylist()} == {"a": 4, "b": 1}


@pytest.mark.parametrize("mode", list(read.PullMode))
def test_a_consumer_behind_archival_is_told_instead_of_skipping_commits(
    table: Table, mode: read.PullMode
) -> None:
    """Pulls read the active timeline (or the overlay built from it): commits archived before a consumer
    pulled them were skipped without a word."""
    LocalWriter(table).insert(rows(["a"]))
    if mode is read.PullMode.OVERLAY:
        _poll_daemon(table)
    checkpoint = read.pull(table, None, mode).checkpoint
    for i in range(5):
        LocalWriter(table).insert(rows([f"x{i}"], part=f"q{i}"))
    assert archive(table, service_lock(table)) is not None
    if mode is read.PullMode.OVERLAY:
        _poll_daemon(table)
    with pytest.raises(CheckpointArchivedError, match="archived before this consumer pulled them"):
        read.pull(table, checkpoint, mode)


def _poll_daemon(table: Table) -> None:
    config = DaemonConfig(tables=(TableEntry(table.uri, "t"),), port=0)
    from prometheus_client import CollectorRegistry

    service = TableService(config.tables[0], config, DaemonMetrics(CollectorRegistry(), lambda: []))
    service.poll()
    assert service.status.up, service.status.error


@pytest.mark.parametrize("when", ["before the claim", "during the claim"])
def test_a_claim_that_shares_its_time_with_another_action_is_made_again(
    table: Table, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Writers claim without the lock: a writer whose clock is ahead picked a time a table service had
    just claimed for another action (two instants of one time), from a timeline that did not show it."""
    LocalWriter(table).insert(rows(["a"]))
    ahead = time.time() + 3600
    clash = from_millis(int(ahead * 1000))  # the time the writer picks: its clock is ahead of the timeline
    claim_clean = partial(table.storage.write, f"{TIMELINE_DIR}/{clash}.clean.requested", b"")
    if when == "before the claim":
        table.timeline()  # what the writer last listed does not show the clean
        claim_clean()
    else:
        backend, original_create = type(table.storage), type(table.storage).create_if_absent

        def create(self: Storage, path: str, data: bytes) -> bool:
            if path == f"{TIMELINE_DIR}/{clash}.commit.requested":
                claim_clean()
            return original_create(self, path, data)

        monkeypatch.setattr(backend, "create_if_absent", create)
    options = WriteOptions(config=table.config, clock=lambda: ahead)
    writer = Transaction.begin(table, "insert", options=options)
    monkeypatch.undo()
    assert writer.instant_time > clash
    assert [(i.requested_time, i.action) for i in table.timeline().pending()] == [
        (clash, Action.CLEAN),
        (writer.instant_time, Action.COMMIT),
    ]
    assert not table.storage.exists(f"{TIMELINE_DIR}/{clash}.commit.requested")
    writer.abort()


def _claim_beside_a_clean(
    table: Table, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[str], None]
) -> tuple[Transaction, str]:
    """A writer, its clock ahead, claims the time a clean claimed just before; ``meanwhile(clash)`` runs
    right after the writer created its ``.requested`` file, before it lists."""
    ahead = time.time() + 3600
    clash = from_millis(int(ahead * 1000))
    backend, original_create = type(table.storage), type(table.storage).create_if_absent

    def create(self: Storage, path: str, data: bytes) -> bool:
        if path == f"{TIMELINE_DIR}/{clash}.commit.requested":
            table.storage.write(f"{TIMELINE_DIR}/{clash}.clean.requested", b"")
            created = original_create(self, path, data)
            meanwhile(clash)
            return created
        return original_create(self, path, data)

    monkeypatch.setattr(backend, "create_if_absent", create)
    options = WriteOptions(config=table.config, clock=lambda: ahead)
    writer = Transaction.begin(table, "insert", options=options)
    monkeypatch.undo()  # every patch of the test: they were for the claim
    return writer, clash


def _claim_left_behind_beside_a_clean(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> tuple[Transaction, str]:
    """:func:`_claim_beside_a_clean`, on a table with a commit, where the writer cannot delete the claim
    it withdraws: it is left behind at the clean's time."""
    LocalWriter(table).insert(rows(["a"]))
    original_delete = type(table.storage).delete

    def delete(self: Storage, path: str) -> None:
        if path.endswith(".commit.requested"):
            raise StorageError(f"injected: delete {path} failed")
        original_delete(self, path)

    monkeypatch.setattr(type(table.storage), "delete", delete)
    return _claim_beside_a_clean(table, monkeypatch, lambda _: None)


def test_a_claim_withdrawn_but_left_behind_is_removed_once_the_other_action_went_on(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer that lost a shared time could not delete its claim (soak seed 185027): the timeline hides
    the leftover behind the clean, so no rollback saw it, and the time stayed used by two actions."""
    writer, clash = _claim_left_behind_beside_a_clean(table, monkeypatch)
    writer.abort()
    leftover = f"{TIMELINE_DIR}/{clash}.commit.requested"
    assert table.storage.exists(leftover)
    lock, policy = service_lock(table), HeartbeatPolicy.from_config(table.config)

    rollback_failed(table, lock, policy)  # the clean is only requested: which claim stands is open yet
    assert table.storage.exists(leftover)

    table.storage.write(f"{TIMELINE_DIR}/{clash}.clean.inflight", b"")
    table.storage.write(f"{TIMELINE_DIR}/{clash}.not-an-instant", b"")  # skipped with a warning, as ever
    rollback_failed(table, lock, policy)
    assert not table.storage.exists(leftover)
    assert table.timeline().get(clash) == Instant(clash, Action.CLEAN, State.INFLIGHT)
    assert Timeline.shared_times(table.storage) == frozenset()


def _claim_and_plan_left_behind_beside_a_clean(table: Table) -> tuple[list[Instant], list[Instant]]:
    """A writer's claim and plan at the time of a clean that is inflight: ([claim, plan], the clean's)."""
    LocalWriter(table).insert(rows(["a"]))
    clash = from_millis(int(time.time() * 1000) + 3_600_000)
    writer = [Instant(clash, Action.COMMIT, state) for state in (State.REQUESTED, State.INFLIGHT)]
    clean = [Instant(clash, Action.CLEAN, state) for state in (State.REQUESTED, State.INFLIGHT)]
    for instant in (*writer, *clean):
        table.storage.write(table.instant_path(instant), b"")
    return writer, clean


def _complete(table: Table, clean: list[Instant]) -> None:
    completion = from_millis(to_millis(clean[-1].requested_time) + 1)
    clean.append(clean[-1].transition(State.COMPLETED, completion))
    table.storage.write(table.instant_path(clean[-1]), b"")


def test_a_claim_left_behind_with_its_plan_is_removed_once_the_other_action_completed(table: Table) -> None:
    """A writer's plan is written beside the listing that tells whether its claim stands (soak seed 888294,
    scenario 2): the listing showed a table service's claim at its time (there a rollback's, here a clean's),
    and the withdrawal could not delete the plan, so claim and plan stayed. Both actions had gone on by their
    files, so neither was taken for a leftover, and once the service completed the time stayed used by two
    actions for good."""
    (claim, plan), clean = _claim_and_plan_left_behind_beside_a_clean(table)
    table.timeline()
    # two inflight: which one stood is open while neither completed
    assert remove_withdrawn_claims(table) == []

    _complete(table, clean)
    table.timeline()
    assert remove_withdrawn_claims(table) == [plan, claim]  # the plan first: never one without its claim
    clash = claim.requested_time
    assert sorted(n for n in table.storage.names(TIMELINE_DIR) if n.startswith(clash)) == sorted(
        i.file_name for i in clean
    )
    rollback_failed(table, service_lock(table), HeartbeatPolicy.from_config(table.config))
    assert Timeline.shared_times(table.storage) == frozenset()
    assert table.timeline().get(clash) == clean[-1]
    assert sorted(read.snapshot(table).column("id").to_pylist()) == ["a"]


def test_the_daemon_removes_a_claim_left_behind_with_its_plan(table: Table) -> None:
    """The same leftover where the daemon is the only cleaner: it runs the rollback pass once it sees one."""
    writer, clean = _claim_and_plan_left_behind_beside_a_clean(table)
    service = _service(table)
    service.poll()
    assert service.status.up, service.status.error
    assert all(table.storage.exists(table.instant_path(i)) for i in (*writer, *clean))

    _complete(table, clean)
    service.poll()
    assert service.status.up, service.status.error
    clash = clean[0].requested_time
    assert sorted(n for n in table.storage.names(TIMELINE_DIR) if n.startswith(clash)) == sorted(
        i.file_name for i in clean
    )


def test_the_daemon_removes_a_claim_left_behind_though_no_write_failed(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same leftover, where the daemon is the only cleaner and nothing else is to be rolled back (soak
    14, seed 887351, scenario 1): it looked for leftovers only when it rolled something back, so the time
    stayed used by two actions, a pending commit to every other Hudi reader."""
    writer, clash = _claim_left_behind_beside_a_clean(table, monkeypatch)
    writer.abort()
    # its aborted round is rolled back while the clean is only requested: the leftover stays for now
    rollback_failed(table, service_lock(table), HeartbeatPolicy.from_config(table.config))
    table.storage.write(f"{TIMELINE_DIR}/{clash}.clean.inflight", b"")
    leftover = f"{TIMELINE_DIR}/{clash}.commit.requested"
    assert table.storage.exists(leftover)
    assert [i.action for i in table.timeline().pending()] == [Action.CLEAN]

    service = _service(table)
    service.poll()
    assert service.status.up, service.status.error
    assert not table.storage.exists(leftover)
    assert table.storage.exists(f"{TIMELINE_DIR}/{clash}.clean.inflight")


def test_a_claim_left_behind_after_going_ahead_of_its_listing_loses_its_file_first(table: Table) -> None:
    """A write that goes ahead of the listing after its claim writes its file before it knows the claim
    stands: the listing showed a clean's claim at its time, and the writer could delete nothing of what it
    had made (it was killed). Once the clean completed, the removal of withdrawn claims deletes the file
    the claim's plan names, then plan and claim; the table reads as before, with cowrite and hudi-rs."""
    (claim, plan), clean = _claim_and_plan_left_behind_beside_a_clean(table)  # on a table holding "a"
    [seeded] = table.timeline().data_commits()
    [base] = table.commit_metadata(seeded).write_stats
    clash = claim.requested_time
    path = f"p0/{base.file_id}_0-0-1_{clash}.parquet"  # what the claim wrote: a new slice of that group
    table.storage.write(path, table.storage.read(base.path))
    carried = CommitMetadata("upsert", (replace(base, path=path, prev_commit=seeded.requested_time),))
    for pending in (claim, plan):
        table.storage.write(table.instant_path(pending), carried.to_bytes(Action.COMMIT))
    _complete(table, clean)
    table.timeline()
    assert remove_withdrawn_claims(table) == [plan, claim]
    assert not table.storage.exists(path) and table.storage.exists(base.path)
    assert read.snapshot(table).column("id").to_pylist() == ["a"]
    assert [r["id"] for r in hudi_rs.snapshot(table.uri)] == ["a"]


def test_a_file_written_ahead_on_a_plan_that_does_not_stand_goes_before_the_commit(table: Table) -> None:
    """A write went ahead of its listing, and the listing showed a commit its process did not know: it plans
    again. A file it wrote ahead that the new plan does not write again is deleted before the commit, which
    would otherwise make it part of the table: its name carries the commit's time."""
    writer = LocalWriter(table)
    writer.insert(rows(["a"]))
    held = HeldInput.of(table, rows(["a"], ts=2, value="again"), Operation.UPSERT)
    transaction = Transaction.begin(table, "upsert", options=writer.options)
    [base] = table.commit_metadata(table.timeline().data_commits().last).write_stats
    ghost = replace(base, file_id="ghost-0", path=f"p0/ghost-0_0-0-1_{transaction.instant_time}.parquet")
    table.storage.write(ghost.path, table.storage.read(base.path))  # written ahead, on another plan
    metadata, _ = writer._write_files(transaction, held, ahead=[ghost])
    assert not table.storage.exists(ghost.path)
    transaction.commit(metadata)
    expected = [{"id": "a", "part": "p0", "ts": 2, "value": "again"}]
    assert read.snapshot(table).select(["id", "part", "ts", "value"]).to_pylist() == expected
    assert [{k: r[k] for k in ("id", "part", "ts", "value")} for r in hudi_rs.snapshot(table.uri)] == expected


def test_a_replacecommit_claims_an_odd_millisecond(table: Table) -> None:
    """A write that goes ahead of its listing claims an even millisecond, so no replacecommit, which would
    make visible the base files named with its time, ever completes at the time of a claim that went ahead
    and was withdrawn (:func:`~cowrite.format.claims.claim`)."""
    LocalWriter(table).insert(rows(["a"]))
    even = int(time.time() * 1000) + 1000 & ~1
    claimed, _, _ = claims.begin_instant(table, Action.REPLACE_COMMIT, even)
    assert claimed.requested_time == from_millis(even + 1)
    claims.withdraw(table, claimed, "the test is done with it")
    overwritten = LocalWriter(table).insert_overwrite(rows(["b"]))
    assert overwritten is not None and to_millis(overwritten.requested_time) % 2 == 1


def test_archival_leaves_a_time_shared_with_a_claim_left_behind_until_the_claim_is_removed(
    table: Table,
) -> None:
    """A table service's claim at the time of a commit, withdrawn, could not be deleted: the timeline hides
    it behind the commit. Archival took the commit and left the claim alone at its time, a pending instant
    at the time of an archived commit, which the rollback pass then rolled back as a failed write. Archival
    stops before that time until the rollback pass has removed the claim."""
    first = LocalWriter(table).insert(rows(["a"]))
    shared = LocalWriter(table).insert(rows(["b"]))
    for key in ("c", "d", "e"):
        LocalWriter(table).insert(rows([key]))
    leftover = Instant(shared.requested_time, Action.REPLACE_COMMIT, State.REQUESTED)
    table.storage.write(table.instant_path(leftover), b"")

    archived = archive(table, service_lock(table), keep_min=1, keep_max=1)
    assert archived is not None and archived.instants == (first.requested_time,)
    assert remove_withdrawn_claims(table) == [leftover]
    archived = archive(table, service_lock(table), keep_min=1, keep_max=1)
    assert archived is not None and archived.instants[0] == shared.requested_time
    names = table.storage.names(TIMELINE_DIR)
    assert not [n for n in names if n.startswith(shared.requested_time)]
    assert sorted(read.snapshot(table).column("id").to_pylist()) == ["a", "b", "c", "d", "e"]


def test_a_claimant_whose_claim_was_removed_before_it_listed_claims_again(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claimant paused between creating its claim and listing: meanwhile the clean of its time went on
    and a cleaner removed the claim as withdrawn. Listing, it sees no second action at its time, but it
    does not see its own claim either: it must not stand on a file that is gone."""
    LocalWriter(table).insert(rows(["a"]))

    def clean_goes_on_and_a_cleaner_runs(clash: str) -> None:
        table.storage.write(f"{TIMELINE_DIR}/{clash}.clean.inflight", b"")
        table.timeline()
        assert [i.file_name for i in remove_withdrawn_claims(table)] == [f"{clash}.commit.requested"]

    writer, clash = _claim_beside_a_clean(table, monkeypatch, clean_goes_on_and_a_cleaner_runs)
    assert writer.instant_time > clash
    assert [(i.requested_time, i.action) for i in table.timeline().pending()] == [
        (clash, Action.CLEAN),
        (writer.instant_time, Action.COMMIT),
    ]
    writer.abort()


def test_a_rollback_hidden_behind_a_leftover_claim_at_its_time_is_not_made_twice(table: Table) -> None:
    """A writer claimed the time of a rollback being carried out and could not withdraw (soak seed 502970):
    the timeline shows one instant per time, the writer's leftover, and a cleaner that missed the hidden
    rollback recorded a second one of the same failed instant."""
    LocalWriter(table).insert(rows(["a"]))
    lock, policy = service_lock(table), HeartbeatPolicy.from_config(table.config)
    later = time.time() + 60  # every file written now is past its tolerance then
    failed = Instant(from_millis(int(time.time() * 1000)), Action.COMMIT, State.REQUESTED)
    table.storage.write(table.instant_path(failed), b"")
    first = _start(table, lock, failed, policy, later)
    assert first is not None
    leftover = Instant(first.requested_time, Action.COMMIT, State.REQUESTED)
    table.storage.write(table.instant_path(leftover), b"")
    assert table.timeline().get(first.requested_time) == leftover  # in every process: the first by name

    rollback_failed(table, lock, policy, later)  # the leftover is rolled back; the hidden one is not redone
    rollback_failed(table, lock, policy, later)  # the hidden one, no longer hidden, is finished

    by_target: dict[str, list[Instant]] = {}
    for rollback in table.timeline().filter(actions=[Action.ROLLBACK]):
        by_target.setdefault(table.rollback_plan(rollback).target, []).append(rollback)
    assert [r.requested_time for r in by_target[failed.requested_time]] == [first.requested_time]
    assert len(by_target[leftover.requested_time]) == 1 and len(by_target) == 2
    assert all(r.is_completed for rollbacks in by_target.values() for r in rollbacks)
    assert table.timeline().get(failed.requested_time) is None
    assert rollback_failed(table, lock, policy, later) == []


def test_a_claim_below_a_commit_that_completed_meanwhile_is_made_again(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers claim without the lock: a writer whose clock is behind claimed a time below a commit that
    completed while it claimed, and would begin on a timeline showing it: its base files would then lose
    to that commit's in every file group both write, whatever it merged."""
    LocalWriter(table).insert(rows(["a"]))
    behind = time.time() - 3600
    backend, original_create = type(table.storage), type(table.storage).create_if_absent
    meanwhile: list[Instant] = []
    claims: list[str] = []

    def create(self: Storage, path: str, data: bytes) -> bool:
        if path.endswith(".commit.requested"):
            claims.append(path)
            if len(claims) == 1:  # the slow writer's first claim: another commit completes under it
                meanwhile.append(LocalWriter(table).upsert(rows(["a"], ts=2)))
        return original_create(self, path, data)

    monkeypatch.setattr(backend, "create_if_absent", create)
    options = WriteOptions(config=table.config, clock=lambda: behind)
    writer = Transaction.begin(table, "upsert", options=options)
    monkeypatch.undo()
    (completed,) = meanwhile
    assert writer.instant_time > completed.requested_time
    assert completed.requested_time in writer.begin_timeline.completed_times
    assert [i.requested_time for i in table.timeline().pending()] == [writer.instant_time]
    writer.abort()


def test_a_writer_paused_before_its_first_heartbeat_does_not_start_afresh(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer paused between its claim and its first heartbeat was rolled back meanwhile; it resumed with
    a fresh lease and wrote ``.inflight`` again: a pending instant after its completed rollback, which no
    cleaner rolled back again and which won every conflict from then on."""
    LocalWriter(table).insert(rows(["a"]))
    original_start = Heartbeat.start
    rolled_back: list[str] = []

    def paused_start(self: Heartbeat) -> Heartbeat:
        time.sleep(POLICY.tolerance + 0.1)  # others now take the writer for failed, by its .requested file
        rolled_back.extend(r.target for r in rollback_failed(table, service_lock(table), POLICY))
        return original_start(self)

    monkeypatch.setattr(Heartbeat, "start", paused_start)
    with pytest.raises(LeaseLostError, match="not renewed"):
        LocalWriter(table).upsert(rows(["a"], ts=2, value="paused"))
    monkeypatch.undo()
    assert len(rolled_back) == 1 and not table.timeline().pending()
    assert [r["value"] for r in read.snapshot(table).to_pylist()] == ["v"]


def test_a_writer_that_claims_again_leases_from_the_claim_that_stood(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Soak seed 886823, scenario 8, S3 at +50 ms.) Rivals' claims made a writer try again and again for
    longer than its tolerance; its lease ran from its first try, so it lost it just after the claim that
    stood, while it ran. Others judge the instant by that claim's file until the first heartbeat: the
    lease runs from that claim's create."""
    LocalWriter(table).insert(rows(["a"]))
    create = table.storage.create_if_absent
    tries: list[str] = []

    def contended(path: str, data: bytes) -> bool:
        tries.append(path)
        if len(tries) == 1 and path.endswith(".commit.requested"):
            time.sleep(POLICY.tolerance + 0.1)  # a slow try, and a rival took its time meanwhile
            return False
        return create(path, data)

    monkeypatch.setattr(table.storage, "create_if_absent", contended)
    LocalWriter(table).upsert(rows(["a"], ts=2, value="claimed again"))
    monkeypatch.undo()
    assert len(tries) >= 2 and tries[0] != tries[1]  # the time after the lost one
    assert [r["value"] for r in read.snapshot(table).to_pylist()] == ["claimed again"]


def test_a_time_whose_claim_lost_its_answer_is_not_claimed_again(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's claim was made but its create's answer was lost, and the writer claimed the same time for
    its next write, of another action, whose answer was lost too (soak 22, seed 887953, scenario 6): two
    claims of one time, both left behind, neither listed by its claimant. A process tries a time once."""
    LocalWriter(table).insert(rows(["a"]))
    create = table.storage.create_if_absent

    def answer_lost(path: str, data: bytes) -> bool:
        create(path, data)
        raise StorageError(f"connection reset after creating {path}")

    now = int(time.time() * 1000) | 1  # a replacecommit claims an odd millisecond
    monkeypatch.setattr(table.storage, "create_if_absent", answer_lost)
    for action in (Action.REPLACE_COMMIT, Action.COMMIT):
        with pytest.raises(StorageError):
            claims.begin_instant(table, action, now)
    monkeypatch.undo()
    left = [(i.requested_time, i.action) for i in table.timeline().pending()]
    assert left == [(from_millis(now), Action.REPLACE_COMMIT), (from_millis(now + 1), Action.COMMIT)]
    assert not Timeline.shared_times(table.storage)


def test_a_claim_the_listing_after_it_cannot_confirm_is_withdrawn_at_once(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stopped while claiming resumed after another's claim of the time it had picked was rolled
    back, claimed that time, and could not list the timeline after (soak 24, seed 888005, scenario 8):
    its claim, left behind, was rolled back again, a second rollback of one time. A claim is withdrawn
    when the listing that would confirm it fails."""
    LocalWriter(table).insert(rows(["a"]))
    before = table.timeline()

    def listing_fails(storage: Storage, tail: bool = False) -> Timeline:
        raise StorageError("injected: list .hoodie/timeline failed")

    monkeypatch.setattr(Timeline, "load", listing_fails)
    with pytest.raises(StorageError, match="injected"):
        claims.begin_instant(table, Action.COMMIT, int(time.time() * 1000))
    monkeypatch.undo()
    assert list(table.timeline()) == list(before)  # the claim is gone


def test_a_completion_linked_into_place_after_a_lower_claim_is_not_taken_for_a_claim_below_it(
    table: Table,
) -> None:
    """A completed file is written aside and linked into place: its modification time is when it was
    written. A claim of a lower time made in between came before the commit completed, which the checker,
    reading modification times, would take for a claim made below a completed instant. The same two made
    the other way round are reported."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    now = int(time.time() * 1000)

    def claims(first_in_place: bool) -> list[str]:
        low = Instant(from_millis(now + 1), Action.COMMIT, State.REQUESTED)
        high = Instant(from_millis(now + 2), Action.COMMIT, State.COMPLETED, from_millis(now + 3))
        aside = Path(table.storage.full_path(f"{high.file_name}.tmp"))
        aside.write_bytes(table.storage.read(table.instant_path(seeded)))  # a commit readers can read

        def link() -> None:  # as the local storage's create_if_absent does
            os.link(aside, table.storage.full_path(table.instant_path(high)))
            aside.unlink()

        time.sleep(0.05)
        if first_in_place:
            link()
            time.sleep(0.05)
        table.storage.write(table.instant_path(low), b"")
        time.sleep(0.05)
        if not first_in_place:
            link()
        violations, _ = Checker(_outcome(table.uri, seeded.requested_time)).check()
        for instant in (low, high):
            table.storage.delete(table.instant_path(instant))
        return [v.message for v in violations if "claimed after" in v.message]

    assert claims(first_in_place=False) == []
    now += 10
    completed = f"{from_millis(now + 2)}_{from_millis(now + 3)}.commit"
    assert claims(first_in_place=True) == [
        f"instant {from_millis(now + 1)} was claimed after {completed} completed, with a smaller time"
    ]


def test_a_claim_is_judged_alive_from_when_it_was_made_not_from_when_its_claimant_said_so(
    table: Table,
) -> None:
    """A writer stopped right after its claim stood, whose listing after the create was slow (soak 12,
    seed 887121, scenario 5): the judge rolled it back a tolerance after the claim's file was made, which
    the checker, counting from the writer's later ``claimed`` event, took for a judgement too early."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    instant, _, _ = claims.begin_instant(table, Action.COMMIT, int(time.time() * 1000))
    made = table.storage.stat(table.instant_path(instant)).modified
    time.sleep(POLICY.tolerance + 0.05)
    [rolled_back] = rollback_failed(table, service_lock(table), POLICY)
    assert rolled_back.target == instant.requested_time
    plan = Instant(rolled_back.rollback.requested_time, Action.ROLLBACK, State.REQUESTED)
    judged = table.storage.stat(table.instant_path(plan)).modified  # what the checker takes for the moment
    claimed = {"event": "claimed", "instant": instant.requested_time, "worker": 0, "round": 0, "seen": [],
               "action": "commit", "wall": judged - 0.1}  # fmt: skip
    early = f"rollback {rolled_back.rollback.requested_time} judged {instant.requested_time} failed"
    for event, reported in (({**claimed, "made": made}, False), (claimed, True)):
        outcome = replace(_outcome(table.uri, seeded.requested_time), events={0: [event]})
        violations, _ = Checker(outcome).check()
        assert any(v.message.startswith(early) for v in violations) is reported, violations


def test_a_writer_stopped_while_claiming_owes_nothing_to_a_lock_it_left_behind(table: Table) -> None:
    """A writer whose create of a lock lost its acknowledgement left that lock behind (soak 12, seed 887132,
    scenario 0), then was stopped while claiming its next instant, and the lock was expired meanwhile. The
    claim it made after it continued leased from its own create and rightly completed; the checker took
    the expired lock for that round's lease."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    written = LocalWriter(table).upsert(rows(["a"], ts=2, value="after"))
    pid, stopped = 4242, time.time()
    left = LockHolder(owner=f"vm:{pid}:left")
    assert table.storage.create_if_absent(acquired_path(1000), left.to_bytes())
    assert expire_lock(table.storage, 1000, left, "stale", "vm:1:reaper", at=stopped + 1)
    step = {"worker": 0, "pid": pid, "round": 4}
    events = [
        {**step, "event": "fault", "kind": "stop", "step": "claiming", "instant": None, "wall": stopped},
        {**step, "event": "resumed", "step": "claiming", "instant": None, "wall": stopped + 2},
        {**step, "event": "claimed", "instant": written.requested_time, "seen": [], "action": "commit",
         "wall": stopped + 2.1},
    ]  # fmt: skip
    checker = Checker(replace(_outcome(table.uri, seeded.requested_time), events={0: events}))
    checker._collect_events()
    checker.check_leases(checker._collect_timeline())  # the rows are no writer's plan: leases alone
    assert checker.violations == []


def test_a_writer_whose_stop_at_a_step_ended_within_the_margin_may_complete_it(table: Table) -> None:
    """A writer meant to stop past its lease at a protocol step was continued within a millisecond (soak 71,
    seed 888385, scenario 7: its heartbeat renewed 0.7 s later), and completed the instant. Its lease held:
    the checker reports a completed instant only where the stop outlasted the lease's safety margin."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    written = LocalWriter(table).upsert(rows(["a"], ts=2, value="after"))
    assert written is not None
    step = {"worker": 0, "pid": 4242, "round": 1, "step": "mid-write", "instant": written.requested_time}
    stopped = time.time()
    for lasted, reported in ((0.0001, False), (POLICY.tolerance + 1, True)):
        events = [
            {**step, "event": "fault", "kind": "stop", "wall": stopped},
            {**step, "event": "resumed", "wall": stopped + lasted},
        ]
        checker = Checker(replace(_outcome(table.uri, seeded.requested_time), events={0: events}))
        checker._collect_events()
        checker.check_leases(checker._collect_timeline())
        assert any("stopped past its lease" in v.message for v in checker.violations) is reported


def test_a_writer_stopped_past_its_lease_after_a_holder_published_its_commit_owes_it_nothing(
    table: Table,
) -> None:
    """A writer that handed its commit over took a turn of the lock and was stopped there past its lease
    (soak 76, seed 888418, scenario 2); a holder ahead had published its commit before the stop, so it
    found it completed when it continued. The checker reports a stop past the lease only for an instant
    first published after the stop began."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    written = LocalWriter(table).upsert(rows(["a"], ts=2, value="after"))
    assert written is not None
    step = {"worker": 0, "pid": 4242, "round": 1, "step": "locked", "instant": written.requested_time}
    stopped = time.time()
    events = [
        {**step, "event": "fault", "kind": "stop", "wall": stopped},
        {**step, "event": "resumed", "wall": stopped + POLICY.tolerance + 1},
    ]
    for published, reported in ((stopped - 0.4, False), (stopped + POLICY.tolerance + 1.1, True)):
        log = [{"event": "published", "instant": written.requested_time, "lock_id": None, "worker": 1,
                "pid": 4343, "round": 0, "wall": published}]  # fmt: skip
        outcome = replace(_outcome(table.uri, seeded.requested_time), events={0: events}, commit_log=log)
        checker = Checker(outcome)
        checker._collect_events()
        checker.check_leases(checker._collect_timeline())
        assert any("stopped past its lease" in v.message for v in checker.violations) is reported


def test_an_instant_written_again_after_its_rollback_is_rolled_back_again(table: Table) -> None:
    """(The same window, after the lease check before ``.inflight``.) A completed rollback of the instant
    made every later cleaner skip it, so it stayed pending for good."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    zombie, _ = staged(table, rows(["a"], ts=2, value="zombie"), Operation.UPSERT)
    assert zombie.heartbeat is not None and zombie.instant is not None
    zombie.heartbeat.stop(delete=False)
    inflight = table.instant_path(zombie.instant)
    plan = table.storage.read(inflight)
    written = sorted(s.path for s in CommitMetadata.from_bytes(plan, inflight).write_stats)
    later = time.time() + 10 * POLICY.tolerance
    [first] = rollback_failed(table, service_lock(table), POLICY, now=later)
    assert first.target == zombie.instant_time and sorted(first.deleted) == written
    assert not table.timeline().pending()
    table.storage.write(inflight, plan)  # resumed: its lease check had passed before the pause
    came_back = {"event": "planned", "instant": zombie.instant_time, "wall": time.time()}
    for path in written:
        table.storage.write(path, b"garbage")
    [second] = rollback_failed(table, service_lock(table), POLICY, now=later)
    assert second.target == zombie.instant_time and sorted(second.deleted) == written
    assert not table.timeline().pending()
    assert [r["value"] for r in read.snapshot(table).to_pylist()] == ["v"]
    # the checker allows the second rollback only because the writer came back
    assert_second_rollback_allowed_only_after(table, seeded, [first, second], came_back)


@pytest.mark.parametrize("left_behind", ["delete-fail", "create-lost-ack"])
def test_a_time_claimed_again_after_its_rollback_and_left_behind_is_rolled_back_again(
    table: Table, left_behind: str
) -> None:
    """A writer that picked its time from an old listing claimed the time of an instant already rolled
    back (its files gone, the create succeeded) and left the claim behind: it found later instants and
    could not delete the claim (soak 17, seed 887660, scenario 7), or the create's answer was lost and it
    never knew it had made one (soak 18, seed 887737, scenario 7). The claim left behind is rolled back in
    turn, which the checker took for one instant rolled back twice."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    dead = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None and dead.instant is not None
    dead.heartbeat.stop(delete=False)
    later = time.time() + 10 * POLICY.tolerance
    [first] = rollback_failed(table, service_lock(table), POLICY, now=later)
    claim = table.instant_path(dead.instant)
    assert first.target == dead.instant_time and not table.storage.exists(claim)
    assert table.storage.create_if_absent(claim, b"")  # claimed again: its time looked free
    left = {"event": "storage-fault", "kind": left_behind, "path": claim, "wall": time.time()}
    [second] = rollback_failed(table, service_lock(table), POLICY, now=later)
    assert second.target == dead.instant_time and not table.storage.exists(claim)
    assert not table.timeline().pending()
    # the checker allows the second rollback only because the time was claimed again and left behind
    assert_second_rollback_allowed_only_after(table, seeded, [first, second], left)


def test_a_time_claimed_again_while_its_rollback_completes_and_left_behind_is_rolled_back_again(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the claim was made after the first rollback deleted the old one and before it
    completed its instant (soak 25, seeds 888044 and 888045): the checker, which allowed only returns
    after that completion, reported the time rolled back twice."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    dead = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None and dead.instant is not None
    dead.heartbeat.stop(delete=False)
    claim, left = table.instant_path(dead.instant), []
    delete = table.storage.delete

    def then_claimed_again(path: str) -> None:
        delete(path)
        if path == claim:  # the rollback's last delete before it completes
            time.sleep(2 * EPSILON)
            assert table.storage.create_if_absent(claim, b"")  # its time looked free
            left.append({"event": "storage-fault", "kind": "delete-fail", "path": claim, "wall": time.time()})

    monkeypatch.setattr(table.storage, "delete", then_claimed_again)
    later = time.time() + 10 * POLICY.tolerance
    [first] = rollback_failed(table, service_lock(table), POLICY, now=later)
    monkeypatch.undo()
    [second] = rollback_failed(table, service_lock(table), POLICY, now=later)
    assert first.target == second.target == dead.instant_time and not table.timeline().pending()
    assert_second_rollback_allowed_only_after(table, seeded, [first, second], left[0])


def assert_second_rollback_allowed_only_after(
    table: Table, seeded: Instant, rollbacks: list[RolledBack], came_back: dict[str, Any]
) -> None:
    """The checker reports the target of ``rollbacks`` (two) as rolled back twice, unless a writer's
    events hold ``came_back``."""
    target = rollbacks[0].target
    by = ", ".join(r.rollback.requested_time for r in rollbacks)
    twice = f"instant {target} was rolled back 2 times: by {by}"
    for events, reported in (({}, [twice]), ({0: [came_back]}, [])):
        outcome = replace(_outcome(table.uri, seeded.requested_time), events=events)
        violations, _ = Checker(outcome).check()
        assert [v.message for v in violations if "rolled back 2 times" in v.message] == reported


def test_a_claim_left_behind_by_a_failed_delete_of_its_plan_is_told_from_a_double_rollback(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stopped at ``claiming`` had picked the time after its last listing's newest instant; that
    time was claimed by another meanwhile, failed, and was rolled back. The writer then claimed it again,
    with its plan written beside the listing, which showed the rollback (a later instant): withdrawing, it
    deletes the plan first, and that delete's answer was lost, so the claim stayed and was rolled back in
    turn (soak seed 888246, scenario 5). The checker took only a failed delete of the claim itself for a
    claim left behind, and reported the time rolled back twice."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    stopped, stale = Table.load(table.uri), table.timeline()  # the stopped writer's process, and its view
    later = time.time() + 10 * POLICY.tolerance
    millis = int(time.time() * 1000) + 1000
    failed = Instant(from_millis(millis), Action.COMMIT, State.REQUESTED)
    table.storage.write(table.instant_path(failed), b"")
    [first] = rollback_failed(table, service_lock(table), POLICY, now=later)
    plan = table.instant_path(failed.transition(State.INFLIGHT))
    delete, lost = type(table.storage).delete, []

    def answer_lost(self: Storage, path: str) -> None:
        delete(self, path)
        if path == plan:
            fault = {"event": "storage-fault", "kind": "delete-lost-ack", "path": path, "wall": time.time()}
            lost.append(fault)
            raise StorageError(f"injected: delete {path}: connection reset after the storage acted")

    monkeypatch.setattr(type(table.storage), "delete", answer_lost)
    claim, _, _ = claims.claim(stopped, stale, Action.COMMIT, millis, inflight=lambda _: b"the plan")
    monkeypatch.undo()
    assert claim.requested_time > first.rollback.requested_time and lost
    claims.withdraw(stopped, claim, "the test is done with it")
    assert table.timeline().get(failed.requested_time) == failed  # the claim, left behind
    [second] = rollback_failed(table, service_lock(table), POLICY, now=later)
    assert second.target == failed.requested_time and not table.timeline().pending()
    assert_second_rollback_allowed_only_after(table, seeded, [first, second], lost[0])


def test_two_claims_of_one_time_rolled_back_once_each_are_not_a_double_rollback(table: Table) -> None:
    """Two writers of different actions claimed one time and neither could withdraw (soak seed 768589,
    scenarios 1 and 4): each leftover claim is rolled back once, which the checker took for one instant
    rolled back twice."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    shared = from_millis(int(time.time() * 1000))
    for action in (Action.COMMIT, Action.REPLACE_COMMIT):
        table.storage.write(table.instant_path(Instant(shared, action, State.REQUESTED)), b"")
    later = time.time() + 10 * POLICY.tolerance
    undone = [r for _ in range(2) for r in rollback_failed(table, service_lock(table), POLICY, now=later)]
    assert [(r.target, table.rollback_plan(r.rollback).target_action) for r in undone] == [
        (shared, "commit"),  # shown first at the shared time (the first by name), then the other
        (shared, "replacecommit"),
    ]
    violations, _ = Checker(_outcome(table.uri, seeded.requested_time)).check()
    assert [v.message for v in violations if "rolled back" in v.message] == []


def test_the_rollback_of_one_claim_at_a_shared_time_underway_is_not_recorded_again(table: Table) -> None:
    """Two claims of different actions shared a time, and the first was rolled back (soak 22, seed 887953,
    scenario 6). While a cleaner's rollback of the second was underway, another cleaner took the completed
    rollback of the first, which names the same time, for a rollback of the second that had ended, and
    recorded one more: the second claim was rolled back twice."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    shared = from_millis(int(time.time() * 1000))
    for action in (Action.COMMIT, Action.REPLACE_COMMIT):
        table.storage.write(table.instant_path(Instant(shared, action, State.REQUESTED)), b"")
    lock, later = service_lock(table), time.time() + 10 * POLICY.tolerance
    [first] = rollback_failed(table, lock, POLICY, now=later)  # of the claim shown first: the commit
    second = table.timeline().get(shared)
    assert second is not None and second.action is Action.REPLACE_COMMIT
    underway = _start(table, lock, second, POLICY, later)
    assert underway is not None
    assert _start(table, lock, second, POLICY, later) is None  # another cleaner, meanwhile
    [finished] = rollback_failed(table, lock, POLICY, now=later)
    assert (finished.rollback.requested_time, finished.target) == (underway.requested_time, shared)
    plans = [table.rollback_plan(r.rollback) for r in (first, finished)]
    assert [(plan.target, plan.target_action) for plan in plans] == [
        (shared, "commit"),
        (shared, "replacecommit"),
    ]
    assert table.timeline().get(shared) is None and rollback_failed(table, lock, POLICY, now=later) == []
    violations, _ = Checker(_outcome(table.uri, seeded.requested_time)).check()
    assert [v.message for v in violations if "rolled back" in v.message] == []


def test_a_claim_left_behind_at_a_rollbacks_time_is_reported_not_read_as_its_plan(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's claim left behind at the time of a rollback (soak 14, seed 887351, scenario 1): the
    checker kept one requested file per time, the last listed, and read the writer's empty claim as the
    rollback's plan, ending in a traceback instead of a report."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    dead = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    [undone] = rollback_failed(table, service_lock(table), POLICY, now=time.time() + 10 * POLICY.tolerance)
    shared = undone.rollback.requested_time
    table.storage.write(table.instant_path(Instant(shared, Action.COMMIT, State.REQUESTED)), b"")
    listed = type(table.storage).list
    # a directory lists in no particular order: the claim after the plan, as in that soak
    monkeypatch.setattr(
        type(table.storage), "list", lambda *a, **k: sorted(listed(*a, **k), key=attrgetter("name"))[::-1]
    )
    violations, _ = Checker(_outcome(table.uri, seeded.requested_time)).check()
    assert [(v.invariant, v.message) for v in violations if v.invariant in ("3", "harness")] == [
        ("3", f"instant time {shared} is used by several actions: ['commit', 'rollback']")
    ]


def test_two_cleaners_finish_one_rollback_once(table: Table) -> None:
    """Two cleaners finishing one rollback plan completed its instant twice (two completion files), and both
    recorded a rollback of the same failed instant."""
    LocalWriter(table).insert(rows(["a"]))
    dead = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    failed = table.timeline().get(dead.instant_time)
    assert failed is not None
    later = time.time() + 10
    rollback = _start(table, service_lock(table, "a"), failed, POLICY, later)
    assert rollback is not None
    assert _start(table, service_lock(table, "b"), failed, POLICY, later) is None  # already being rolled back
    assert _finish(table, service_lock(table, "a"), rollback, later) is not None
    assert _finish(table, service_lock(table, "b"), rollback, later) is None
    completions = [
        n
        for n in (i.name for i in table.storage.list(TIMELINE_DIR))
        if n.startswith(rollback.requested_time + "_")
    ]
    assert len(completions) == 1


def test_two_cleaners_finish_one_clean_once(table: Table, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second cleaner that runs while the first deletes the files of the same plan completes it too."""
    writer = LocalWriter(table)
    writer.insert(rows(["a"]))
    writer.upsert(rows(["a"], ts=2))
    writer.upsert(rows(["a"], ts=3))
    backend = type(table.storage)
    original = backend.delete
    interleaved: list[object] = []

    def delete(self: Storage, path: str) -> None:
        if not interleaved and path.endswith(".parquet"):
            interleaved.append("running")
            interleaved.append(clean(table, service_lock(table, "second"), 1))  # the whole second run
        original(self, path)

    monkeypatch.setattr(backend, "delete", delete)
    first = clean(table, service_lock(table, "first"), 1)
    assert interleaved[1] is not None and first is None
    cleans = [i for i in table.timeline() if i.action is Action.CLEAN]
    names = [i.name for i in table.storage.list(TIMELINE_DIR)]
    assert [(i.state, sum(n.startswith(i.requested_time + "_") for n in names)) for i in cleans] == [
        (State.COMPLETED, 1)
    ]


def test_heartbeats_of_instants_no_longer_pending_are_collected(table: Table) -> None:
    """A writer killed between publishing and deleting its heartbeat, or one that came back after its
    instant was rolled back and recorded its abort, left a heartbeat nothing ever removed."""
    done = LocalWriter(table).insert(rows(["a"]))
    table.storage.write(heartbeat_path(done.requested_time), b'{"owner": "x"}')  # killed after publishing
    table.storage.write(heartbeat_path("20260101000000000"), b'{"aborted": "lease-lost"}')  # rolled back
    live = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    try:
        time.sleep(POLICY.tolerance + 0.1)
        rollback_failed(table, service_lock(table), POLICY)
        assert {i.name for i in table.storage.list(HEARTBEAT_DIR)} == {live.instant_time}
    finally:
        assert live.heartbeat is not None
        live.heartbeat.stop()


def test_a_commit_is_reported_even_if_its_heartbeat_cannot_be_deleted(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting the heartbeat after publishing failed with StorageError: the write reported an error
    ("nothing committed", exit 1) for a commit that was visible."""
    backend = type(table.storage)
    original = backend.delete
    failed: list[str] = []

    def delete(self: Storage, path: str) -> None:
        if path.startswith(HEARTBEAT_DIR):
            failed.append(path)
            raise StorageError(f"injected: deleting {path} failed")
        original(self, path)

    monkeypatch.setattr(backend, "delete", delete)
    renewed = threading.Event()
    with observe(lambda step, instant, details: renewed.set() if step is Step.RENEWED else None):
        transaction, metadata = staged(table, rows(["a"]), Operation.INSERT)
        assert renewed.wait(10)  # a write that outlasts its first renewal has a heartbeat to delete
        done = transaction.commit(metadata)  # type: ignore[arg-type]
    assert failed  # the fault was injected
    assert table.timeline().get(done.requested_time) == done and done.is_completed
    assert [r["id"] for r in read.snapshot(table).to_pylist()] == ["a"]


# -- incremental consumers across interleavings ------------------------------------------------------

STEPS = st.lists(
    st.tuples(st.sampled_from(["begin", "commit", "pull", "poll"]), st.integers(0, 2)), max_size=30
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS, data=st.data())
def test_consumers_see_every_commit_once_in_any_interleaving(
    steps: list[tuple[str, int]], data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Three writers begin and commit in any order (so commits complete out of requested-time order, and
    some conflict); consumers of each pull mode pull in between; the daemon's overlay is refreshed now and
    then. Folded together, each consumer's pulls are the snapshot, with no row version twice."""
    table = Table.create(
        str(tmp_path_factory.mktemp("t") / "t"),
        name="t",
        record_key_fields=["id"],
        partition_fields=["part"],
        ordering_fields=["ts"],
        properties=SETTINGS,
    )
    LocalWriter(table).insert(rows([f"k{i}" for i in range(6)]))
    service = _service(table)
    service.poll()
    staged_writes: dict[int, tuple[Transaction, object]] = {}
    consumers = {mode: _Consumer(table, mode) for mode in read.PullMode}
    fresh = iter(range(10**6))
    for action, who in steps:
        if action == "begin" and who not in staged_writes:
            keys_ = data.draw(st.lists(st.sampled_from([f"k{i}" for i in range(6)]), max_size=3, unique=True))
            keys_ += [f"n{next(fresh)}" for _ in range(data.draw(st.integers(0, 2)))]
            if keys_:
                staged_writes[who] = staged(
                    table, rows(keys_, ts=data.draw(st.integers(0, 3)), value=f"w{who}"), Operation.UPSERT
                )
        elif action == "commit" and who in staged_writes:
            _commit(*staged_writes.pop(who))
        elif action == "pull":
            list(consumers.values())[who].pull()
        elif action == "poll":
            service.poll()
    for transaction, metadata in staged_writes.values():
        _commit(transaction, metadata)
    _caught_up(service, table)
    snapshot = {
        r["id"]: (r["value"], r["_hoodie_commit_time"])
        for r in read.snapshot(table, with_meta=True).to_pylist()
    }
    for consumer in consumers.values():
        consumer.drain()
        assert consumer.state == snapshot, consumer.mode


def _commit(transaction: Transaction, metadata: object) -> None:
    try:
        transaction.commit(metadata)  # type: ignore[arg-type]
    except WriteConflictError:
        pass


def _caught_up(service: TableService, table: Table) -> None:
    """A poll brings the overlay up to the latest commit it saw completed: the watermark is that of its
    first look at the timeline, and a second look finds what completed before it (see
    ``cowrite.daemon.service``). Two polls, so that what completed during the first is in too."""
    service.poll()
    service.poll()
    latest = max((i.completion_time or "" for i in table.timeline().data_commits()), default="")
    assert service.overlay is not None and (service.overlay.watermark or "") >= latest


def _service(table: Table) -> TableService:
    from prometheus_client import CollectorRegistry

    config = DaemonConfig(tables=(TableEntry(table.uri, "t", SETTINGS),), port=0)
    return TableService(config.tables[0], config, DaemonMetrics(CollectorRegistry(), lambda: []))


class _Consumer:
    def __init__(self, table: Table, mode: read.PullMode) -> None:
        self.table, self.mode = table, mode
        self.checkpoint: str | None = None
        self.state: dict[str, tuple[str, str]] = {}
        self.delivered: set[tuple[str, str]] = set()

    def pull(self) -> bool:
        got = read.pull(self.table, self.checkpoint, self.mode, with_meta=True)
        for row in got.rows.to_pylist():
            version = (row["id"], row["_hoodie_commit_time"])
            assert version not in self.delivered, f"{self.mode}: {version} pulled twice"
            self.delivered.add(version)
            self.state[row["id"]] = (row["value"], row["_hoodie_commit_time"])
        self.checkpoint = got.checkpoint
        return bool(got.commits)

    def drain(self) -> None:
        while self.pull():
            pass


def claim_with_its_answer_lost(table: Table, claim: Instant) -> dict[str, Any]:
    """Make ``claim`` as a create that acted and lost its answer does; the writer's event of that fault."""
    table.storage.write(table.instant_path(claim), b"")
    path = f"{TIMELINE_DIR}/{claim.file_name}"
    return {
        "event": "storage-fault",
        "kind": "create-lost-ack",
        "path": path,
        "wall": time.time(),
        "round": 0,
    }


def test_a_claim_left_behind_after_its_first_rollback_was_archived_is_told_from_a_double_rollback(
    table: Table,
) -> None:
    """A writer's claim failed at once and was rolled back; archival then took that rollback off the
    active timeline (its file times with it). Another writer, whose clock was behind and whose claims kept
    failing before it listed, claimed that time again and lost the create's answer: the claim stayed, and
    was rolled back in turn (soak seed 888260, scenario 4). The checker took the second rollback's file
    times for the first's, and reported the time rolled back twice."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    later = time.time() + 10 * POLICY.tolerance
    failed = Instant(from_millis(int(time.time() * 1000) + 1000), Action.COMMIT, State.REQUESTED)
    claimed = {
        "event": "claimed",
        "instant": failed.requested_time,
        "wall": time.time(),
        "worker": 0,
        "round": 0,
    }
    table.storage.write(table.instant_path(failed), b"")
    [first] = rollback_failed(table, service_lock(table), POLICY, now=later)
    for key in ("b", "c", "d"):
        LocalWriter(table).insert(rows([key]))
    archived = archive(table, service_lock(table), keep_min=1, keep_max=1)
    assert archived is not None and first.rollback.requested_time in archived.instants
    lost = claim_with_its_answer_lost(table, failed)
    [second] = rollback_failed(table, service_lock(table), POLICY, now=later)
    assert second.target == failed.requested_time and not table.timeline().pending()
    by = f"{first.rollback.requested_time}, {second.rollback.requested_time}"
    twice = f"instant {failed.requested_time} was rolled back 2 times: by {by}"
    for events, reported in (({0: [claimed]}, [twice]), ({0: [claimed, lost]}, [])):
        outcome = replace(_outcome(table.uri, seeded.requested_time), events=events)
        violations, _ = Checker(outcome).check()
        assert [v.message for v in violations if "rolled back" in v.message] == reported


def test_a_claim_left_behind_at_the_time_of_an_archived_commit_is_rolled_back_alone(table: Table) -> None:
    """A writer whose clock was behind and whose claims kept failing before it listed claimed the time of
    a commit that archival had taken off the active timeline, so the create acted, and lost its answer.
    The claim stayed and was rolled back, deleting nothing but that claim (soak seed 888260, scenario 4);
    the checker reported a rollback of a completed instant."""
    seeded = LocalWriter(table).insert(rows(["a"]))
    committed = LocalWriter(table).insert(rows(["b"]))
    for key in ("c", "d", "e"):
        LocalWriter(table).insert(rows([key]))
    archived = archive(table, service_lock(table), keep_min=1, keep_max=1)
    assert archived is not None and committed.requested_time in archived.instants
    lost = claim_with_its_answer_lost(
        table, Instant(committed.requested_time, Action.COMMIT, State.REQUESTED)
    )
    later = time.time() + 10 * POLICY.tolerance
    [undone] = rollback_failed(table, service_lock(table), POLICY, now=later)
    assert undone.target == committed.requested_time and undone.deleted == ()
    assert sorted(read.snapshot(table).column("id").to_pylist()) == ["a", "b", "c", "d", "e"]
    wrong = f"rollback {undone.rollback.requested_time} targets {committed.requested_time}, which completed"
    for events, reported in (({}, [wrong]), ({0: [lost]}, [])):
        outcome = replace(_outcome(table.uri, seeded.requested_time), events=events)
        violations, _ = Checker(outcome).check()
        assert [v.message for v in violations if "which completed" in v.message] == reported
