"""The daemon as operators run it: heartbeat tracker, lock reaper, lazy rollback, cleaner, HTTP, operations.

Daemons run in this process (``Daemon(DaemonConfig(...), registry=CollectorRegistry())``, metrics read from
that fresh registry) or as ``python -m cowrite daemon`` processes; writers and lock holders that die are
real processes killed with SIGKILL. Waits poll for a condition with a bounded deadline; the only fakes are
clocks (the collector's scrape time, a judge's ``now``).

Heartbeats are short (200 ms x 2 misses) on local disk and memory. S3 reports modification times in whole
seconds, so a heartbeat there can look up to a second older than it is: S3 tables use 1 s x 3 misses.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support import TESTS, hudi_rs
from support.daemon import (
    POLL,
    WAIT,
    DaemonProcess,
    Processes,
    Target,
    count,
    daemon_config,
    data_files,
    get,
    kill,
    polls_later,
    port_of,
    released,
    sample,
    serving,
    snapshot,
    wait_until,
    writer,
)
from support.request_counts import ProxyProcess
from support.servers import S3Server
from support.tables import rows

from cowrite.cleaner import service_lock
from cowrite.cleaner.rollback import _start, rollback_failed
from cowrite.daemon import service
from cowrite.daemon.config import TOKEN_VARIABLE, DaemonConfig, TableEntry
from cowrite.daemon.http import serve
from cowrite.daemon.metrics import TableStateCollector, TableStatus
from cowrite.daemon.service import Daemon
from cowrite.errors import ConfigError, WriteConflictError
from cowrite.format import claims
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.table import PROPERTIES_FILE, Table
from cowrite.local import read
from cowrite.protocol.heartbeat import Heartbeat, heartbeat_path
from cowrite.protocol.liveness import PendingInstant
from cowrite.protocol.locks import LockHolder
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.protocol.locks.holders import current_lock
from cowrite.protocol.locks.lock_files import LOCK_DIR
from cowrite.protocol.sketch import MARK
from cowrite.protocol.table_schema import ALTER_SCHEMA, latest_schema
from cowrite.protocol.transaction import Transaction, WriteOptions

LOCK_WORKER = TESTS / "support" / "lock_worker.py"

# What does not depend on the backend (HTTP, schedules, lock-wait and conflict accounting, a broken
# neighbour) runs on local disk and memory only: moto answers one request at a time, and the tracker,
# rollback, reaper, follower and overlay tests already run against S3.
FAST_BACKENDS = pytest.mark.parametrize("storage_uri", ["local", "memory"], indirect=True)


# -- tables ------------------------------------------------------------------------------------------


@pytest.fixture
def target(
    storage_uri: str,
    storage_options: dict[str, Any],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> Target:
    """A table root on every backend. For S3 the daemon, like a deployed one, finds the endpoint and keys in
    the AWS environment variables."""
    if not storage_uri.startswith("s3://"):
        return Target(storage_uri, storage_options)
    env = request.getfixturevalue("s3_server").env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # whole-second modification times: up to 1 s of apparent age on top of the interval
    return Target(storage_uri, storage_options, env, interval_ms=1000, misses=3, slack=2.0, poll=0.25)


@pytest.fixture
def process_target(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Target:
    """Like ``target``, for backends other processes can reach (not memory)."""
    if request.param == "local":
        return Target(str(tmp_path / "table"))
    server = request.getfixturevalue("s3_server")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return Target(
        server.new_uri("daemon"),
        server.storage_options(),
        server.env(),
        interval_ms=1000,
        misses=3,
        slack=2.0,
        poll=0.25,
    )


# -- heartbeat tracker -------------------------------------------------------------------------------


def test_scrape_ages_heartbeats_from_the_last_poll_by_the_scrape_clock() -> None:
    polled_at = 1_800_000_000.0
    live = Instant(from_millis(int((polled_at - 30) * 1000)), Action.COMMIT, State.INFLIGHT)
    dead = Instant(from_millis(int((polled_at - 90) * 1000)), Action.REPLACE_COMMIT, State.REQUESTED)
    status = TableStatus(
        "orders",
        "/t",
        up=True,
        polled_at=polled_at,
        instants_by_state={"completed": 7, "inflight": 1, "requested": 1},
        pending=(
            PendingInstant(live, heartbeat_age=0.25, idle=0.25, failed=False),
            PendingInstant(dead, heartbeat_age=None, idle=61.0, failed=True),
        ),
        garbage_files=2,
        garbage_bytes=2048,
        watermark=from_millis(int((polled_at - 5) * 1000)),
    )
    down = TableStatus("broken", "/b", up=False, error="no hoodie.properties")
    registry = CollectorRegistry()
    registry.register(TableStateCollector(lambda: [status, down], clock=lambda: polled_at + 0.5))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("cowrite_heartbeat_age_seconds", table="orders", instant=live.requested_time) == 0.75
    assert value("cowrite_heartbeat_age_seconds", table="orders", instant=dead.requested_time) == 61.5
    assert value("cowrite_failed_writes", table="orders") == 1
    assert value("cowrite_pending_instants", table="orders") == 2
    assert value("cowrite_oldest_pending_age_seconds", table="orders") == 90.5
    assert value("cowrite_timeline_instants", table="orders", state="completed") == 7
    assert (
        value("cowrite_garbage_files", table="orders"),
        value("cowrite_garbage_bytes", table="orders"),
    ) == (2, 2048)
    assert value("cowrite_watermark_timestamp_seconds", table="orders") == polled_at - 5
    assert (value("cowrite_table_up", table="orders"), value("cowrite_table_up", table="broken")) == (1, 0)
    assert value("cowrite_pending_instants", table="broken") is None  # no state of a table that is down


def test_tracker_follows_a_live_writer_and_rolls_it_back_only_after_the_tolerance(target: Target) -> None:
    table = target.create()
    writer(target.table()).insert(rows(["k1"]))
    live = Transaction.begin(target.table(), "upsert", options=WriteOptions(config=target.table().config))
    instant = live.instant_time
    with target.serving() as daemon:
        wait_until(
            lambda: sample(daemon, "cowrite_pending_instants", table="orders") == 1, "the pending write"
        )
        for _ in range(3):  # a heartbeating writer stays young and is never judged failed
            polls_later(daemon, 2)
            age = sample(daemon, "cowrite_heartbeat_age_seconds", table="orders", instant=instant)
            assert age is not None and age < target.tolerance
            assert count(daemon, "cowrite_failed_writes", table="orders") == 0
        assert count(daemon, "cowrite_timeline_instants", table="orders", state="completed") == 1
        assert count(daemon, "cowrite_timeline_instants", table="orders", state="requested") == 1
        oldest = count(daemon, "cowrite_oldest_pending_age_seconds", table="orders")
        assert 0 < oldest < time.time() - to_millis(instant) / 1000 + 1

        assert live.heartbeat is not None
        live.heartbeat.stop(delete=False)  # the writer dies: no more renewals
        last_beat = table.storage.stat(heartbeat_path(instant)).modified
        wait_until(lambda: count(daemon, "cowrite_rollbacks_total", table="orders") == 1, "the rollback")
        [rollback] = [i for i in table.timeline() if i.action is Action.ROLLBACK]
        # judged failed only once the heartbeat was older than interval x misses (instant times are in ms)
        assert to_millis(rollback.requested_time) >= int((last_beat + target.tolerance) * 1000)
        assert table.rollback_plan(rollback).target == instant
        polls_later(daemon, 1)
        assert sample(daemon, "cowrite_heartbeat_age_seconds", table="orders", instant=instant) is None
        assert count(daemon, "cowrite_pending_instants", table="orders") == 0
        assert (
            count(daemon, "cowrite_cleaner_runs_total", table="orders", service="rollback", outcome="ok") == 1
        )
        assert count(daemon, "cowrite_timeline_instants", table="orders", state="requested") == 0
    assert not table.storage.exists(heartbeat_path(instant))


@FAST_BACKENDS
def test_a_writer_that_lost_a_conflict_is_counted_and_rolled_back_without_waiting(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    target.interval_ms, target.misses = 60_000, 2  # only the writer's own abort can make it failed soon
    target.create()
    table = target.table()
    writer(table).insert(rows(["k1"]))
    # what a scrape right after the rollback would see of its cause
    conflicts_when_rolled_back: list[float] = []

    def rolling_back(*args: Any) -> Any:
        done = rollback_failed(*args)
        conflicts_when_rolled_back.append(count(daemon, "cowrite_write_conflicts_total", table="orders"))
        return done

    monkeypatch.setattr(service, "rollback_failed", rolling_back)
    with target.serving() as daemon:
        slow = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
        winner = writer(table).upsert(rows(["k1"], ts=2, value="fast"))
        [stat] = table.commit_metadata(winner).write_stats
        # the same file group, in a file of its own
        mine = CommitMetadata(
            "upsert", (replace(stat, path=stat.path.replace(winner.requested_time, slow.instant_time)),)
        )
        with pytest.raises(WriteConflictError):
            slow.commit(mine)
        wait_until(
            lambda: count(daemon, "cowrite_rollbacks_total", table="orders") == 1,
            "the aborted write's rollback",
        )
        assert conflicts_when_rolled_back[-1] == 1
        assert count(daemon, "cowrite_write_conflicts_total", table="orders") == 1
        assert count(daemon, "cowrite_aborted_writes_total", table="orders", reason="conflict") == 1
        assert count(daemon, "cowrite_commits_total", table="orders", action="commit") == 1  # the winner
    assert table.timeline().get(slow.instant_time) is None
    assert snapshot(target) == [("k1", "p0", "fast", winner.requested_time)]


# -- stale-lock reaper -------------------------------------------------------------------------------


@pytest.mark.parametrize("process_target", ["local", "s3"], indirect=True)
def test_the_lock_of_a_killed_holder_is_expired_by_the_daemon(
    process_target: Target, processes: Processes
) -> None:
    target = process_target
    table = target.create()
    instant = from_millis(int(time.time() * 1000))
    spec = {
        "uri": target.uri,
        "options": target.storage_options,
        "instant": instant,
        "config": {keys.LOCK_PROVIDER.key: "filesystem"},
        "heartbeat": [target.interval_ms / 1000, target.misses],
    }
    with target.serving() as daemon:
        holder = processes.start(
            [sys.executable, str(LOCK_WORKER), "hold", json.dumps(spec)], target.env, "holder"
        )

        def held() -> int | None:
            lock = current_lock(table.storage)
            return lock.lock_id if lock and lock.holder and lock.holder.instant == instant else None

        lock_id = wait_until(held, "the holder to take the lock")
        # a holder that keeps its heartbeat keeps its lock, though the lock file is older than the tolerance
        alive_until = time.monotonic() + target.tolerance + 2 * target.poll
        while time.monotonic() < alive_until:
            polls_later(daemon, 1)
            assert held() == lock_id
        assert count(daemon, "cowrite_lock_expiries_total", table="orders") == 0

        died = kill(holder)
        release = wait_until(lambda: released(table.storage, lock_id), "the lock's release")
        expired_after = time.monotonic() - died
        assert release["reason"] == "expired"
        assert str(release["owner"]).startswith(f"cowrite-daemon@{socket.gethostname()}")
        assert expired_after <= target.tolerance + 2 * target.poll + target.slack
        wait_until(
            lambda: count(daemon, "cowrite_lock_expiries_total", table="orders") == 1, "the expiry counted"
        )
        assert current_lock(table.storage).holder is None  # type: ignore[union-attr]


@FAST_BACKENDS
def test_lock_waits_are_observed_and_old_lock_files_collected(target: Target) -> None:
    target.create()
    table = target.table()
    with target.serving(locks_kept=3) as daemon:
        polls_later(daemon, 1)
        # a live holder (its heartbeat renewed) keeps a writer waiting for 0.7 s
        blocker = f"{from_millis(int(time.time() * 1000))}"
        heartbeat = Heartbeat(table.storage, blocker, target.policy).start()
        lock = FileSystemLock(table.storage, LockHolder(instant=blocker), target.policy)
        lock.acquire()
        commits: list[Instant | None] = []
        waiting = threading.Thread(target=lambda: commits.append(writer(table).insert(rows(["k1"]))))
        waiting.start()

        def planned() -> bool:  # from then on it only writes a file before it asks for the lock
            return any(i.state is State.INFLIGHT for i in table.timeline().pending())

        wait_until(planned, "the waiting writer's plan")  # the first write of a process may take a while
        time.sleep(0.7)
        lock.release()
        heartbeat.stop()
        waiting.join(WAIT)
        for n in range(4):
            commits.append(writer(table).insert(rows([f"k{n + 2}"], part=f"p{n + 1}")))
        highest = current_lock(table.storage).lock_id  # type: ignore[union-attr]
        assert highest == 6  # the blocker's lock, then one per write (to commit)
        kept = range(highest - 3, highest + 1)
        expected = {f"lock{i}.acquired" for i in kept}
        # every writer's turn ended with a note of what it published (lock<id>.published.<file>, then a
        # sketch of the commit): those of the kept turns stay, older ones go with their locks
        expected |= {f"lock{i}.published.{c.file_name}" for i, c in zip(kept, commits[-4:], strict=True) if c}
        wait_until(
            lambda: {i.name.partition(MARK)[0] for i in table.storage.list(LOCK_DIR)} == expected,
            "old lock files collected",
        )
        wait_until(
            lambda: count(daemon, "cowrite_lock_wait_seconds_count", table="orders") == 6, "lock waits"
        )
        assert count(daemon, "cowrite_lock_wait_seconds_bucket", table="orders", le="0.5") == 5
        assert count(daemon, "cowrite_lock_wait_seconds_bucket", table="orders", le="1.0") == 6
        assert 0.5 <= count(daemon, "cowrite_lock_wait_seconds_sum", table="orders") < 2.0
        assert count(daemon, "cowrite_lock_expiries_total", table="orders") == 0
        wait_until(
            lambda: count(daemon, "cowrite_commits_total", table="orders", action="commit") == 5, "commits"
        )


# -- lazy rollback -----------------------------------------------------------------------------------


@pytest.mark.parametrize("process_target", ["local", "s3"], indirect=True)
def test_a_writer_killed_mid_write_is_rolled_back_and_a_live_one_left_alone(
    process_target: Target, processes: Processes
) -> None:
    target = process_target
    target.create()
    seeded = writer(target.table()).insert(rows(["s1", "s2"], value="seed"))
    seed_rows = [(k, "p0", "seed", seeded.requested_time) for k in ("s1", "s2")]
    assert snapshot(target) == seed_rows
    table = target.table()
    seed_files = data_files(table)

    with target.serving() as daemon:
        doomed_batch = [
            {"partition": "p1", "keys": ["d1"], "value": "doomed"},
            {"partition": "p2", "keys": ["d2"], "value": "doomed"},
        ]
        live_batch = [
            {"partition": "p3", "keys": ["l1"], "value": "live"},
            {"partition": "p4", "keys": ["l2"], "value": "live"},
        ]
        doomed = processes.writer(target, doomed_batch, "doomed", "mid-write")
        live = processes.writer(target, live_batch, "live", "mid-write", release_by_file=True)
        dead_instant = processes.paused(doomed, "doomed")["instant"]
        live_instant = processes.paused(live, "live")["instant"]
        dead_files = {f for f in data_files(table) if dead_instant in f}
        live_files = {f for f in data_files(table) if live_instant in f}
        assert (len(dead_files), len(live_files)) == (1, 1)  # each paused between its two files

        died = kill(doomed)
        wait_until(
            lambda: (
                table.timeline().get(dead_instant) is None
                and not table.timeline().pending().filter(actions=[Action.ROLLBACK])
            ),
            "the rollback",
        )
        rolled_back_after = time.monotonic() - died
        assert rolled_back_after <= target.tolerance + 2 * target.poll + target.slack
        assert data_files(table) == seed_files | live_files
        assert not table.storage.exists(heartbeat_path(dead_instant))
        [rollback] = [i for i in table.timeline() if i.action is Action.ROLLBACK]
        assert rollback.is_completed and table.rollback_plan(rollback).target == dead_instant
        polls_later(daemon, 1)  # the rollback is counted after it is on storage, by the end of its poll
        assert count(daemon, "cowrite_rollbacks_total", table="orders") == 1
        assert snapshot(target) == seed_rows  # readers never saw either write

        # the live writer, paused but heartbeating, is never touched however long it takes
        still = time.monotonic() + target.tolerance  # paused for twice the tolerance by then
        while time.monotonic() < still:
            polls_later(daemon, 1)
            assert table.timeline().get(live_instant) is not None
        assert data_files(table) == seed_files | live_files
        (processes.directory / "live.go").touch()
        assert live.wait(WAIT) == 0, processes.stderr("live")
        assert count(daemon, "cowrite_rollbacks_total", table="orders") == 1
    assert snapshot(target) == sorted(
        seed_rows + [("l1", "p3", "live", live_instant), ("l2", "p4", "live", live_instant)]
    )
    assert {(i.requested_time, i.state) for i in table.timeline() if i.action is Action.COMMIT} == {
        (seeded.requested_time, State.COMPLETED),
        (live_instant, State.COMPLETED),
    }


@FAST_BACKENDS
def test_a_failed_write_waiting_for_a_busy_lock_stays_reported_with_its_garbage(target: Target) -> None:
    target.create()
    table = target.table()
    writer(table).insert(rows(["k1"]))
    dead = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    file_id = f"{uuid.uuid4()}-0"
    garbage = f"p9/{file_id}_0-0-0_{dead.instant_time}.parquet"
    dead.plan(CommitMetadata("insert", (WriteStat(file_id, garbage, "p9", "null", 1, 1, 0, 0, 1234),)))
    table.storage.write(garbage, b"x" * 1234)  # the one file it wrote before it died
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    # a live writer (its instant on the timeline, its heartbeat renewed) keeps the lock the rollback needs;
    # a heartbeat of an instant the timeline does not show would be collected as an orphan
    with service_lock(table) as claiming:
        now = int(time.time() * 1000)
        blocker = claims.claim_instant(
            table, table.timeline(), Action.COMMIT, now, lock=claiming
        ).requested_time
    heartbeat = Heartbeat(table.storage, blocker, target.policy).start()
    lock = FileSystemLock(table.storage, LockHolder(instant=blocker), target.policy)
    lock.acquire()
    entry = TableEntry(target.uri, settings={**target.settings, keys.LOCK_WAIT_MS.key: "300"})
    with serving(entry) as daemon:
        try:
            wait_until(
                lambda: count(daemon, "cowrite_failed_writes", table="orders") == 1, "the failed write"
            )
            for _ in range(3):  # poll after poll, the table is up and the garbage reported exactly
                polls_later(daemon, 1)
                assert sample(daemon, "cowrite_table_up", table="orders") == 1
                assert count(daemon, "cowrite_failed_writes", table="orders") == 1
                assert count(daemon, "cowrite_garbage_files", table="orders") == 1
                assert count(daemon, "cowrite_garbage_bytes", table="orders") == 1234
            runs = {"table": "orders", "service": "rollback"}
            assert count(daemon, "cowrite_cleaner_runs_total", **runs, outcome="error") >= 1
            assert count(daemon, "cowrite_rollbacks_total", table="orders") == 0
        finally:
            lock.release()  # the blocking writer lives on (its heartbeat renewed): only the dead one fails
        try:
            wait_until(lambda: count(daemon, "cowrite_rollbacks_total", table="orders") == 1, "the rollback")
            polls_later(daemon, 1)
            assert count(daemon, "cowrite_garbage_files", table="orders") == 0
            assert count(daemon, "cowrite_garbage_bytes", table="orders") == 0
            assert count(daemon, "cowrite_failed_writes", table="orders") == 0
            assert count(daemon, "cowrite_deleted_files_total", table="orders", service="rollback") == 1
        finally:
            heartbeat.stop()
    assert not table.storage.exists(garbage)


# -- cleaner -----------------------------------------------------------------------------------------


@FAST_BACKENDS
def test_the_cleaner_runs_on_schedule_and_keeps_the_last_n_commits(target: Target) -> None:
    target.create()
    table = target.table()
    versions = [writer(table).upsert(rows(["k1", "k2"], ts=n, value=f"v{n}")) for n in range(1, 6)]
    files = sorted(data_files(table), key=lambda path: path.rsplit("_", 1)[-1])
    assert len(files) == 5  # one file group, one file per version
    latest = snapshot(target)
    started = time.time()
    with target.serving(clean_interval=0.3, commits_retained=2) as daemon:
        wait_until(
            lambda: (
                count(daemon, "cowrite_cleaner_runs_total", table="orders", service="clean", outcome="ok")
                >= 3
            ),
            "three cleaner runs",
        )
        assert count(daemon, "cowrite_deleted_files_total", table="orders", service="clean") == 3
        assert count(daemon, "cowrite_cleaner_duration_seconds_count", table="orders", service="clean") >= 3
    assert data_files(table) == set(files[3:])  # what the last two commits need
    assert all(v.requested_time in f for v, f in zip(versions[3:], files[3:], strict=True))
    [cleaned] = [i for i in table.timeline() if i.action is Action.CLEAN]
    # on schedule, not at start (an instant time is whole milliseconds, truncated)
    assert cleaned.is_completed and to_millis(cleaned.requested_time) >= int((started + 0.3) * 1000)
    assert (
        snapshot(target)
        == latest
        == [("k1", "p0", "v5", versions[4].requested_time), ("k2", "p0", "v5", versions[4].requested_time)]
    )


@pytest.mark.parametrize(
    ("process_target", "cleaner"),
    [("local", "daemon"), ("s3", "daemon"), ("local", "cowrite clean")],
    indirect=["process_target"],
)
def test_a_schema_change_whose_writer_died_before_recording_it_at_the_latest_time_is_recorded_by_the_cleaner(
    process_target: Target, cleaner: str, processes: Processes
) -> None:
    """Writer A adds a column and commits after a writer of a later instant time; killed with SIGKILL
    before the empty commit that records the schema at the latest instant time, it leaves hudi-rs, which
    takes the schema from there, without the column. The daemon's cleaning records it, once; so does the
    one-off ``cowrite clean``."""
    target = process_target
    target.create()
    table = target.table()
    seed = writer(table).insert(rows(["s"], "p0"))
    batch, turns = processes.directory / "a.parquet", processes.directory / "turns"
    turns.mkdir()
    pq.write_table(rows(["a"], "p1").append_column("extra", pa.array([7], pa.int64())), batch)
    # A plans its write, then waits for turn 1 to write and commit; it stops at the empty commit, to be killed
    turn = ["--turn-dir", str(turns), "--turn", "1", "--turns", "2"]
    a = processes.writer(target, batch, "a", "recording-schema", more=turn)
    # planned, A's instant time is final (a claim that finds a later one beside it is made again, later)
    wait_until(lambda: table.timeline().pending().filter(states=[State.INFLIGHT]), "A to plan its write")
    later = writer(table).insert(rows(["b"], "p2"))  # a later instant time, completed first
    (turns / "turn-1").touch()
    a_instant = processes.paused(a, "a")["instant"]
    kill(a)

    def operations() -> list[str]:
        return [table.commit_metadata(i).operation for i in table.timeline().data_commits()]

    assert seed.requested_time < a_instant < later.requested_time
    assert operations() == ["insert", "upsert", "insert"]  # in the order of instant times
    assert all("extra" not in row for row in hudi_rs.snapshot(target.uri, target.storage_options))

    if cleaner == "daemon":
        with target.serving(clean_interval=0.3) as daemon:
            wait_until(lambda: operations()[-1] == ALTER_SCHEMA, "the schema recorded", timeout=WAIT)

            def runs() -> float:
                return count(
                    daemon, "cowrite_cleaner_runs_total", table="orders", service="schema", outcome="ok"
                )

            recorded = runs()
            wait_until(lambda: runs() >= recorded + 2, "two cleanings more")
    else:
        outputs = [clean_once(target) for _ in range(2)]
        alter = table.timeline().data_commits().last
        assert alter is not None
        assert outputs == [
            f"nothing to clean\nrecorded the table's schema at the latest instant time ({alter.file_name})\n",
            "nothing to clean\n",
        ]
    assert operations() == ["insert", "upsert", "insert", ALTER_SCHEMA]  # recorded once
    alter = table.timeline().data_commits().last
    assert alter is not None and table.commit_metadata(alter).write_stats == ()
    assert table.commit_metadata(alter).schema == latest_schema(table, table.timeline())
    expected = [("a", "p1", 7), ("b", "p2", None), ("s", "p0", None)]
    mine = read.snapshot(target.table()).to_pylist()
    theirs = hudi_rs.snapshot(target.uri, target.storage_options)
    for found in (mine, theirs):
        assert sorted((r["id"], r["part"], r["extra"]) for r in found) == expected


def clean_once(target: Target) -> str:
    """What ``cowrite clean`` prints on the table, with its settings, which it must clean without an
    error (it expires the lock a killed writer left, and says so on stderr)."""
    command = [sys.executable, "-m", "cowrite", "clean", target.uri, *target.cli_options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


# -- HTTP --------------------------------------------------------------------------------------------


@FAST_BACKENDS
def test_http_serves_metrics_health_and_the_read_only_api(target: Target) -> None:
    target.create()
    table = target.table()
    first = writer(table).insert(rows(["k1"]))
    config = DaemonConfig(tables=(target.entry(),), port=0, poll_interval=POLL)
    assert DaemonConfig(tables=()).host == "127.0.0.1"  # loopback unless told otherwise
    daemon = Daemon(config, registry=CollectorRegistry())
    server = serve(daemon, config.host, config.port)
    daemon.http = server
    try:
        port = port_of(daemon)
        assert server.server_address[0] == "127.0.0.1"
        assert get(port, "/healthz") == (200, {"status": "ok"})
        assert get(port, "/readyz") == (503, {"ready": False})  # no table polled yet
        daemon.start(serve_http=False)
        wait_until(lambda: get(port, "/readyz")[0] == 200, "readiness")
        second = writer(table).insert(rows(["k2"], part="p1"))
        pending = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
        wait_until(  # the watermark follows one poll behind the listing that first shows a commit
            lambda: (
                get(port, "/api/tables/orders/watermark")[1]
                == {"fence": pending.instant_time, "watermark": second.completion_time}
            ),
            "the pending write and the watermark",
        )

        status, text = get(port, "/metrics")
        metrics = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert metrics[("cowrite_table_up", (("table", "orders"),))] == 1
        assert metrics[("cowrite_commits_total", (("action", "commit"), ("table", "orders")))] == 1
        assert metrics[("cowrite_pending_instants", (("table", "orders"),))] == 1
        assert (
            metrics[("cowrite_watermark_timestamp_seconds", (("table", "orders"),))]
            == to_millis(second.completion_time or "") / 1000
        )

        timeline = get(port, "/api/tables/orders/timeline")[1]
        assert timeline == [
            {
                "requested_time": i.requested_time,
                "action": i.action.value,
                "state": i.state.name,
                "completion_time": i.completion_time,
            }
            for i in table.timeline()
        ]
        [beat] = get(port, "/api/tables/orders/heartbeats")[1]
        assert (beat["instant"], beat["state"], beat["failed"], beat["aborted"]) == (
            pending.instant_time,
            "REQUESTED",
            False,
            None,
        )
        age = beat["heartbeat_age_seconds"]  # none until its first renewal, half a tolerance after the claim
        assert age is None or 0 <= age < target.tolerance
        lock = current_lock(table.storage)
        assert lock is not None
        assert get(port, "/api/tables/orders/locks") == (
            200,
            {"id": lock.lock_id, "owner": None, "instant": None, "acquired_at": lock.acquired_at},
        )
        assert get(port, "/api/tables/orders/watermark") == (
            200,
            {"watermark": second.completion_time, "fence": pending.instant_time},
        )
        overlay = get(port, f"/api/tables/orders/overlay?since={first.completion_time}")[1]
        assert overlay["watermark"] == second.completion_time
        assert [(e["requested_time"], e["completion_time"]) for e in overlay["entries"]] == [
            (second.requested_time, second.completion_time)
        ]
        [status_view] = get(port, "/api/tables")[1]
        assert (status_view["name"], status_view["up"], status_view["pending"], status_view["failed"]) == (
            "orders",
            True,
            1,
            0,
        )
        assert get(port, "/api/tables/orders/status")[1] == status_view

        assert get(port, "/api/tables/nope/timeline")[0] == 404
        assert get(port, "/api/tables/orders/nope")[0] == 404
        assert get(port, "/nope")[0] == 404
        assert get(port, "/api/tables/orders/overlay?since=yesterday")[0] == 400
        assert get(port, "/api/tables/orders/rollback", "POST")[0] == 403  # no token configured: off
        assert pending.heartbeat is not None
        pending.heartbeat.stop()
    finally:
        daemon.stop()


@FAST_BACKENDS
def test_changes_over_http_need_the_right_token(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    target.create()
    table = target.table()
    writer(table).insert(rows(["k1"]))
    dead = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    monkeypatch.setenv(TOKEN_VARIABLE, "s3cret")
    config = DaemonConfig.load(
        None, [target.uri], port=0, poll_interval=3600.0
    )  # polled once, then on request
    assert config.token == "s3cret"
    daemon = Daemon(replace(config, tables=(target.entry(),)), registry=CollectorRegistry())
    daemon.start()
    try:
        port = port_of(daemon)
        wait_until(lambda: daemon.ready, "the first poll")
        name = daemon.services[0].name
        assert name == "orders"  # not named in the configuration: the table's own name, once opened
        assert dead.instant is not None  # stopped before its first heartbeat: judged by its claim
        last_sign = table.storage.stat(table.instant_path(dead.instant)).modified
        time.sleep(max(0.0, last_sign + target.tolerance + 0.05 - time.time()))  # the writer is failed now
        assert get(port, f"/api/tables/{name}/rollback", "POST")[0] == 401
        assert get(port, f"/api/tables/{name}/rollback", "POST", token="guess")[0] == 401
        assert table.timeline().get(dead.instant_time) is not None
        status, body = get(port, f"/api/tables/{name}/rollback", "POST", token="s3cret")
        assert status == 200 and body["pending"] == 0, body
        assert table.timeline().get(dead.instant_time) is None
        assert get(port, "/api/tables/nope/clean", "POST", token="s3cret")[0] == 404
        assert get(port, f"/api/tables/{name}/clean", "POST", token="s3cret")[0] == 200
    finally:
        daemon.stop()


# -- configuration -----------------------------------------------------------------------------------


def test_configuration_file_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    path = tmp_path / "daemon.toml"
    path.write_text(
        "[server]\nport = 9999\n[follow]\npoll_interval_seconds = 0.5\n[cleaner]\ncommits_retained = 3\n"
        '[[tables]]\nuri = "s3://bucket/orders"\nname = "orders"\n'
        '"hoodie.client.heartbeat.interval_in_ms" = "200"\n'
        "hoodie.client.heartbeat.tolerable.misses = 4\n"
        '[[tables]]\nuri = "/data/events"\n'
    )
    config = DaemonConfig.load(str(path), ["/data/extra"], port=0)
    assert config == DaemonConfig(
        tables=(
            TableEntry(
                "s3://bucket/orders",
                "orders",
                {keys.HEARTBEAT_INTERVAL_MS.key: "200", keys.HEARTBEAT_TOLERABLE_MISSES.key: "4"},
            ),
            TableEntry("/data/events"),
            TableEntry("/data/extra"),
        ),
        host="127.0.0.1",
        port=0,
        poll_interval=0.5,
        clean_interval=300.0,
        commits_retained=3,
        token=None,
    )
    with pytest.raises(ConfigError, match="no tables"):
        DaemonConfig.load(None, [])
    path.write_text("[follow]\npoll_interval_seconds = 0\n[[tables]]\nuri = '/t'\n")
    with pytest.raises(ConfigError, match="positive"):
        DaemonConfig.load(str(path))
    path.write_text("[[tables]]\nname = 'no uri'\n")
    with pytest.raises(ConfigError, match="uri"):
        DaemonConfig.load(str(path))


# -- operations --------------------------------------------------------------------------------------


@FAST_BACKENDS
def test_a_broken_table_is_reported_and_the_others_are_served(
    target: Target, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    target.create()
    good = target.table()
    broken = Table.create(
        str(tmp_path / "broken"), name="broken", record_key_fields=["id"], partition_fields=["part"]
    )
    writer(good).insert(rows(["k1"]))
    writer(broken).insert(rows(["k1"]))
    with serving(target.entry(name="orders"), TableEntry(broken.uri, name="broken")) as daemon:
        assert (
            sample(daemon, "cowrite_table_up", table="orders"),
            sample(daemon, "cowrite_table_up", table="broken"),
        ) == (1, 1)
        # a corrupt completed commit: the daemon cannot read it, readers of the table would fail too
        bogus = Instant(
            from_millis(int(time.time() * 1000)),
            Action.COMMIT,
            State.COMPLETED,
            from_millis(int(time.time() * 1000) + 1),
        )
        broken.storage.write(broken.instant_path(bogus), b"\x00 not avro")
        wait_until(
            lambda: sample(daemon, "cowrite_table_up", table="broken") == 0, "the broken table reported"
        )
        assert bogus.file_name in str(daemon.service("broken").status.error)  # type: ignore[union-attr]
        assert str(daemon.service("broken").status.corrupt).endswith(bogus.file_name)  # type: ignore[union-attr]
        assert (
            sample(daemon, "cowrite_corrupt_timeline_file", table="broken"),
            sample(daemon, "cowrite_corrupt_timeline_file", table="orders"),
        ) == (1, 0)
        second = writer(good).insert(rows(["k2"]))
        wait_until(
            lambda: count(daemon, "cowrite_commits_total", table="orders", action="commit") == 1,
            "the good table's commit",
        )
        polls_later(daemon, 3)
        assert sample(daemon, "cowrite_table_up", table="orders") == 1
        assert daemon.service("orders").status.watermark == second.completion_time  # type: ignore[union-attr]
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "broken" in r.getMessage()]
    assert len(errors) == 1  # once per new problem, not once per poll
    assert bogus.file_name in errors[0].getMessage()


def test_polls_skipped_while_a_slow_first_poll_runs_are_counted_and_said_once(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a slow object store a first poll outlasts several poll intervals: the polls skipped meanwhile are
    counted, and said in one line, not in a warning of the scheduler's per skip."""
    table = Table.create(
        s3_server.new_uri("overrun"),
        name="slow",
        record_key_fields=["id"],
        partition_fields=["part"],
        storage_options=s3_server.storage_options(),
    )
    writer(table).insert(rows(["k1"]))
    caplog.set_level(logging.INFO)
    with ProxyProcess(s3_server.endpoint_url, delay=0.2) as proxy:
        for name, value in {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url}.items():
            monkeypatch.setenv(name, value)
        # a first poll makes more than five requests one after another: over a second, ten intervals
        with serving(TableEntry(table.uri, name="slow"), poll=0.1) as daemon:
            skipped = count(daemon, "cowrite_polls_skipped_total", table="slow")
    assert skipped >= 5
    said = [r.getMessage() for r in caplog.records if "first poll is still running" in r.getMessage()]
    assert said == ["table slow: its first poll is still running; later polls wait for it"]
    assert not [r for r in caplog.records if r.name.startswith("apscheduler") and "skipped" in r.getMessage()]


def test_a_daemon_process_serves_good_tables_beside_a_broken_one_and_drains_on_sigterm(
    tmp_path: Path, processes: Processes
) -> None:
    good = Target(str(tmp_path / "good"))
    good.create()
    writer(good.table()).insert(rows(["k1"]))
    broken = tmp_path / "broken"
    Table.create(str(broken), name="broken", record_key_fields=["id"])
    properties = broken / PROPERTIES_FILE
    properties.write_bytes(properties.read_bytes()[:40])  # torn: the table's name is gone
    config = daemon_config(
        tmp_path, [{"uri": good.uri, "name": "good", **good.settings}, {"uri": str(broken), "name": "broken"}]
    )
    daemon = DaemonProcess(processes, config, "daemon")
    up = ("cowrite_table_up", (("table", "broken"),)), ("cowrite_table_up", (("table", "good"),))
    wait_until(lambda: get(daemon.port, "/readyz")[0] == 200, "readiness")
    metrics = daemon.metrics()
    assert (metrics[up[0]], metrics[up[1]]) == (0, 1)
    second = writer(good.table()).insert(rows(["k2"]))
    commits = ("cowrite_commits_total", (("action", "commit"), ("table", "good")))
    watermark = "/api/tables/good/watermark"
    wait_until(
        lambda: get(daemon.port, watermark)[1]["watermark"] == second.completion_time, "the new commit"
    )
    assert daemon.metrics()[commits] == 1
    assert get(daemon.port, "/api/tables/broken/timeline")[0] == 503

    took = daemon.terminate()
    assert took < 5.0
    logs = daemon.logs()
    assert all({"event", "level", "logger", "timestamp"} <= line.keys() for line in logs)
    [failure] = [line for line in logs if line["level"] == "error"]
    assert "broken" in failure["event"] and "hoodie.table.name" in failure["event"]
    assert logs[-1]["event"] == "stopped"


@pytest.mark.parametrize("process_target", ["local"], indirect=True)
def test_a_restarted_daemon_finishes_a_rollback_a_crashed_one_began(
    process_target: Target, processes: Processes, tmp_path: Path
) -> None:
    target = process_target
    target.create()
    seeded = writer(target.table()).insert(rows(["s1"], value="seed"))
    table = target.table()
    seed_files = data_files(table)
    batch = [
        {"partition": "p1", "keys": ["d1"], "value": "doomed"},
        {"partition": "p2", "keys": ["d2"], "value": "doomed"},
    ]
    doomed = processes.writer(target, batch, "doomed", "mid-write")
    dead_instant = processes.paused(doomed, "doomed")["instant"]
    kill(doomed)
    # A daemon judged the write failed, recorded its rollback plan, deleted a file, crashed holding the lock.
    crashed = service_lock(table, "cowrite-daemon@crashed")
    target_instant = table.timeline().get(dead_instant)
    assert target_instant is not None
    rollback = _start(table, crashed, target_instant, target.policy, now=time.time() + 3600)
    assert rollback is not None
    written = [path for path in table.rollback_plan(rollback).files if table.storage.exists(path)]
    assert len(written) == 1
    table.storage.delete(written[0])
    crashed.acquire()
    stale_lock = current_lock(table.storage)
    assert stale_lock is not None and stale_lock.holder is not None

    config = daemon_config(tmp_path, [{"uri": target.uri, "name": "orders", **target.settings}])
    daemon = DaemonProcess(processes, config, "restarted", target.env)
    rolled = ("cowrite_rollbacks_total", (("table", "orders"),))
    wait_until(lambda: daemon.metrics().get(rolled) == 1, "the rollback finished")
    timeline = table.timeline()
    assert timeline.get(dead_instant) is None and not timeline.pending()
    [finished] = [i for i in timeline if i.action is Action.ROLLBACK]
    assert (finished.requested_time, finished.state) == (rollback.requested_time, State.COMPLETED)
    assert data_files(table) == seed_files
    assert released(table.storage, stale_lock.lock_id)["reason"] == "expired"  # type: ignore[index]
    expiries = ("cowrite_lock_expiries_total", (("table", "orders"),))
    wait_until(lambda: daemon.metrics().get(expiries) == 1, "the expiry counted")
    assert snapshot(target) == [("s1", "p0", "seed", seeded.requested_time)]
    assert daemon.terminate() < 5.0
