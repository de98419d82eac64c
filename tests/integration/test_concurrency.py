"""Several real writer processes on one table: concurrency, write conflicts, kill -9, SIGSTOP, clock skew.

Every writer is a process of its own (``support/writer_process.py``); faults are real signals, injected at
protocol steps the writer reports by a file (the pause is monkeypatched inside the writer process only).
Every scenario checks the exact row set — with cowrite's reader and with hudi-rs — and the exact timeline.
Waits poll for files with bounded timeouts; nothing sleeps for a fixed long time.

Rows are compared as ``(id, part, value, _hoodie_commit_time)``: a row must carry the requested time of the
instant that last wrote it, and copied rows keep theirs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hudi import HudiTableBuilder
from kazoo.client import KazooClient
from support import TESTS, wait_until, writer_process
from support.servers import S3Server, ZooKeeperServer

from cowrite.errors import ConfigError
from cowrite.format import config as keys
from cowrite.format.config import Config
from cowrite.format.instant import State
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR, Timeline
from cowrite.local.read import snapshot
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HEARTBEAT_DIR, HeartbeatPolicy, heartbeat_path
from cowrite.protocol.liveness import judge
from cowrite.protocol.locks import handover, lock_for
from cowrite.protocol.locks.base import LockHolder, Standing
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.protocol.locks.holders import current_lock
from cowrite.protocol.locks.lock_files import LOCK_DIR, read_release, serves_path
from cowrite.protocol.transaction import WriteOptions
from cowrite.storage.backend import Storage

pytestmark = pytest.mark.slow

WORKER = Path(writer_process.__file__)

EXIT_OK, EXIT_CONFLICT, EXIT_LEASE_LOST = 0, 3, 5

# Short pauses between lock tries, and a total wait no scenario should ever come near.
QUICK_LOCK = {
    keys.LOCK_WAIT_MS.key: "30000",
    keys.LOCK_RETRY_WAIT_MS.key: "5",
    keys.LOCK_MAX_RETRY_WAIT_MS.key: "50",
}
# A writer is failed 0.4 s after its last heartbeat: fault scenarios recover in well under a second.
FAST_HEARTBEAT = {
    keys.HEARTBEAT_INTERVAL_MS.key: "200",
    keys.HEARTBEAT_TOLERABLE_MISSES.key: "2",
}
TOLERANCE = 0.4

WAIT = 30.0  # upper bound of any single wait; a healthy run needs a small fraction of it

Row = tuple[str, str, str, str]  # id, partition, value, _hoodie_commit_time
Rows = dict[str, tuple[str, str, str]]  # id -> (partition, value, _hoodie_commit_time)


# -- the table and its readers ---------------------------------------------------------------------


@dataclass
class Target:
    """The table under test and how each party reaches it (this process, the writers, hudi-rs)."""

    uri: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # for writer processes
    hudi_options: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"t_{uuid.uuid4().hex[:12]}")

    def create(self) -> Table:
        return Table.create(
            self.uri,
            name=self.name,
            record_key_fields=["id"],
            partition_fields=["part"],
            ordering_fields=["ts"],
            storage_options=self.storage_options,
        )

    @property
    def storage(self) -> Storage:
        return Storage.for_uri(self.uri, **self.storage_options)

    def table(self) -> Table:
        return Table.open(self.storage)

    def timeline(self) -> Timeline:
        return Timeline.load(self.storage)

    def timeline_files(self) -> set[str]:
        return {info.name for info in self.storage.list(TIMELINE_DIR)}

    def data_files(self) -> set[str]:
        return {i.path for i in self.storage.walk_files() if not i.path.startswith(".hoodie/")}


def local_target(tmp_path: Path) -> Target:
    return Target(str(tmp_path / "table"))


def s3_target(server: S3Server) -> Target:
    return Target(
        server.new_uri("concurrency"),
        storage_options=server.storage_options(),
        env=server.env(),
        hudi_options={
            "aws_endpoint_url": server.endpoint_url,
            "aws_access_key_id": server.env()["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": server.env()["AWS_SECRET_ACCESS_KEY"],
            "aws_region": server.env()["AWS_DEFAULT_REGION"],
            "aws_allow_http": "true",
        },
    )


def _rows(table: pa.Table) -> list[Row]:
    columns = [table.column(c).to_pylist() for c in ("id", "part", "value", "_hoodie_commit_time")]
    return sorted(zip(*columns, strict=True))


def cowrite_rows(target: Target) -> list[Row]:
    return _rows(snapshot(target.table(), with_meta=True))


def hudi_rows(target: Target) -> list[Row]:
    builder = HudiTableBuilder.from_base_uri(target.uri)
    if target.hudi_options:
        builder = builder.with_storage_options(target.hudi_options)
    batches = builder.build().read()
    if not batches:
        return []
    return _rows(pa.Table.from_batches(batches))


def assert_rows(target: Target, expected: Rows) -> None:
    """Both readers see exactly ``expected``: id -> (partition, value, commit time)."""
    want = sorted((key, *row) for key, row in expected.items())
    assert cowrite_rows(target) == want, "cowrite's snapshot differs"
    assert hudi_rows(target) == want, "hudi-rs's snapshot differs"


def seed(target: Target, keys_: list[str], partition: str = "p0") -> tuple[str, Rows]:
    """Commit ``keys_`` (value "seed", ts 0) from this process; the instant time and the rows."""
    table = target.create()
    data = pa.table(
        {
            "id": keys_,
            "part": [partition] * len(keys_),
            "ts": pa.array([0] * len(keys_), pa.int64()),
            "value": ["seed"] * len(keys_),
        }
    )
    writer = LocalWriter(table, WriteOptions(config=table.config.with_values(QUICK_LOCK)))
    instant = writer.insert(data).requested_time
    return instant, {k: (partition, "seed", instant) for k in keys_}


def instant_files(target: Target, instant: str) -> set[str]:
    return {name for name in target.timeline_files() if name.startswith(instant)}


def pending_files(instant: str, state: State) -> set[str]:
    """Timeline files of a ``commit`` instant that stopped in ``state``."""
    files = {f"{instant}.commit.requested"}
    if state >= State.INFLIGHT:
        files.add(f"{instant}.inflight")
    return files


def completed_files(instant: str, completion: str) -> set[str]:
    return {f"{instant}.commit.requested", f"{instant}.inflight", f"{instant}_{completion}.commit"}


def data_files_of(target: Target, instant: str) -> set[str]:
    return {path for path in target.data_files() if path.endswith(f"_{instant}.parquet")}


def heartbeat_of(target: Target, instant: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(target.storage.read(heartbeat_path(instant))))
    except FileNotFoundError:
        return None


def batch(partition: str, keys_: list[str], value: str, ts: int = 1) -> dict[str, Any]:
    return {"partition": partition, "keys": keys_, "value": value, "ts": ts}


def expected_rows(groups: list[dict[str, Any]], instant: str) -> Rows:
    return {key: (g["partition"], g["value"], instant) for g in groups for key in g["keys"]}


# -- writer processes ------------------------------------------------------------------------------


@dataclass
class Writer:
    name: str
    process: subprocess.Popen[bytes]
    directory: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def file(self, suffix: str) -> Path:
        return self.directory / f"{self.name}.{suffix}"

    def output(self) -> str:
        err = self.file("stderr")
        return err.read_text(errors="replace")[-4000:] if err.exists() else ""

    def wait(self, timeout: float = WAIT) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            message = f"writer {self.name} still running after {timeout} s:\n{self.output()}"
            raise AssertionError(message) from None

    def finish(self, expect: int, timeout: float = WAIT) -> dict[str, Any]:
        """Wait for the exit, check its code, and return the writer's summary."""
        code = self.wait(timeout)
        assert code == expect, f"writer {self.name} exited {code}, expected {expect}:\n{self.output()}"
        return dict(json.loads(self.file("result").read_text()))

    def paused(self, timeout: float = WAIT) -> dict[str, Any]:
        """Wait until the writer reports its pause; the pause's pid, step and instant."""
        ready = self.file("ready")

        def arrived() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"writer {self.name} exited {self.process.returncode}:\n{self.output()}")
            return ready.exists()

        wait_until(arrived, f"writer {self.name} to pause", timeout)
        return dict(json.loads(ready.read_text()))

    def release(self) -> None:
        self.file("go").touch()

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        """kill -9 and reap it."""
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=WAIT)
        assert self.process.returncode == -signal.SIGKILL


class Writers:
    """Starts writer processes for one test; whatever still runs at the end is killed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Writer] = []

    def start(
        self,
        target: Target,
        groups: list[dict[str, Any]],
        *,
        name: str,
        operation: str = "upsert",
        options: dict[str, str] | None = None,
        lock_provider: str = "filesystem",
        skew: float = 0.0,
        pause_at: str | None = None,
        release_by_file: bool = False,
        fail_at: str | None = None,
        report_tries: int = 0,
        rounds: int = 1,
        start_file: Path | None = None,
        commit_log: Path | None = None,
        turn: tuple[Path, int, int] | None = None,
    ) -> Writer:
        writer_dir = self.directory
        settings = {**QUICK_LOCK, **(options or {})}
        command = [
            sys.executable,
            str(WORKER),
            target.uri,
            "--operation",
            operation,
            "--batch",
            json.dumps(groups),
            "--rounds",
            str(rounds),
            "--lock-provider",
            lock_provider,
            "--storage-options",
            json.dumps(target.storage_options),
            "--clock-skew",
            str(skew),
            "--result",
            str(writer_dir / f"{name}.result"),
            "--loaded-file",
            str(writer_dir / f"{name}.loaded"),
            "--pause-timeout",
            str(2 * WAIT),
        ]
        for key, value in settings.items():
            command += ["-o", f"{key}={value}"]
        if pause_at is not None:
            command += ["--pause-at", pause_at, "--ready-file", str(writer_dir / f"{name}.ready")]
            if release_by_file:
                command += ["--go-file", str(writer_dir / f"{name}.go")]
        if fail_at is not None:
            command += ["--fail-at", fail_at]
        if report_tries:
            command += ["--tries", str(report_tries), "--tries-file", str(writer_dir / f"{name}.tries")]
        if start_file is not None:
            command += ["--start-file", str(start_file)]
        if commit_log is not None:
            command += ["--commit-log", str(commit_log)]
        if turn is not None:
            command += ["--turn-dir", str(turn[0]), "--turn", str(turn[1]), "--turns", str(turn[2])]
        env = {**os.environ, **target.env, "PYTHONPATH": str(TESTS)}
        with open(writer_dir / f"{name}.stderr", "wb") as stderr:
            process = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
            )
        writer = Writer(name, process, writer_dir)
        self.started.append(writer)
        return writer

    def start_together(self, writers: list[Writer], start_file: Path) -> None:
        """Release writers started with ``start_file`` once all have loaded (imports take most of a start)."""
        wait_until(
            lambda: all(w.file("loaded").exists() or w.process.poll() is not None for w in writers),
            "all writers to load",
        )
        start_file.touch()

    def cleanup(self) -> None:
        for writer in self.started:
            if writer.process.poll() is None:
                try:
                    os.kill(writer.pid, signal.SIGCONT)
                    os.kill(writer.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                writer.process.wait(timeout=WAIT)


@pytest.fixture
def writers(tmp_path: Path) -> Iterator[Writers]:
    directory = tmp_path / "writers"
    directory.mkdir()
    pool = Writers(directory)
    yield pool
    pool.cleanup()


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_commit_order(target: Target, log: list[dict[str, Any]], before: list[str]) -> None:
    """The timeline's completion order is the order commits happened in (the commit log, written under
    the lock), after the ``before`` instants committed earlier; times are unique and strictly increase."""
    timeline = target.timeline()
    completed = timeline.in_completion_order()
    assert [i.requested_time for i in completed] == [*before, *(entry["instant"] for entry in log)]
    completions = [i.completion_time or "" for i in completed]
    assert all(a < b for a, b in zip(completions, completions[1:], strict=False)), completions
    published = {(i.requested_time, i.completion_time) for i in completed}
    assert {(e["instant"], e["completion"]) for e in log} <= published
    for instant in completed:
        assert instant.completion_time is not None and instant.completion_time > instant.requested_time
    requested = [i.requested_time for i in timeline]
    assert len(requested) == len(set(requested))
    lock_ids = [entry["lock_id"] for entry in log if entry["lock_id"] is not None]
    # (a turn that published the commits of writers queued behind it logged them all under its id)
    assert lock_ids == sorted(lock_ids), f"commits did not happen in lock order: {lock_ids}"


def assert_lock_free(target: Target) -> None:
    lock = current_lock(target.storage)
    assert lock is None or lock.holder is None, f"lock{lock.lock_id if lock else ''} still held: {lock}"


def zookeeper_settings(server: ZooKeeperServer, target: Target, session_ms: int = 10_000) -> dict[str, str]:
    return {
        keys.ZK_URL.key: server.hosts,
        keys.ZK_BASE_PATH.key: "/cowrite-test/concurrency",
        keys.ZK_LOCK_KEY.key: target.name,
        keys.ZK_SESSION_TIMEOUT_MS.key: str(session_ms),
        keys.ZK_CONNECTION_TIMEOUT_MS.key: "10000",
    }


def zookeeper_contenders(server: ZooKeeperServer, target: Target) -> list[str]:
    client = KazooClient(hosts=server.hosts, timeout=10)
    client.start(timeout=10)
    try:
        path = f"/cowrite-test/concurrency/{target.name}"
        return list(client.get_children(path)) if client.exists(path) else []
    finally:
        client.stop()
        client.close()


# -- 1. disjoint writers all commit ----------------------------------------------------------------

WRITERS = 4


@pytest.mark.parametrize("setup", ["filesystem-lock-local", "filesystem-lock-s3", "zookeeper-lock-local"])
def test_disjoint_writers_started_together_all_commit(
    setup: str, writers: Writers, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if setup == "filesystem-lock-s3":
        target = s3_target(request.getfixturevalue("s3_server"))
    else:
        target = local_target(tmp_path)
    target.create()
    provider, options = "filesystem", {}
    if setup.startswith("zookeeper"):
        provider = "zookeeper"
        options = zookeeper_settings(request.getfixturevalue("zookeeper_server"), target)

    start, log = tmp_path / "start", tmp_path / "commits.log"
    plans = [[batch(f"p{i}", [f"w{i}-{j}" for j in range(5)], f"writer-{i}")] for i in range(WRITERS)]
    started = [
        writers.start(
            target,
            plan,
            name=f"w{i}",
            operation="insert",
            lock_provider=provider,
            options=options,
            start_file=start,
            commit_log=log,
        )
        for i, plan in enumerate(plans)
    ]
    writers.start_together(started, start)
    results = [w.finish(EXIT_OK, timeout=60) for w in started]

    instants = [r["commits"][0]["instant"] for r in results]
    assert len(set(instants)) == WRITERS
    entries = read_log(log)
    assert len(entries) == WRITERS
    assert_commit_order(target, entries, before=[])
    timeline = target.timeline()
    assert len(timeline) == WRITERS and all(i.is_completed for i in timeline)
    assert target.timeline_files() == set().union(
        *(completed_files(r["commits"][0]["instant"], r["commits"][0]["completion"]) for r in results)
    )
    assert target.storage.list(HEARTBEAT_DIR) == []
    if provider == "filesystem":
        assert_lock_free(target)
        lock = current_lock(target.storage)
        turns = {entry["lock_id"] for entry in entries}  # a turn may publish the commits queued behind it
        assert None not in turns and lock is not None and lock.lock_id >= len(turns)
        released = [i.name for i in target.storage.list(LOCK_DIR) if i.name.endswith(".released")]
        reasons = {read_release(target.storage, int(name[4:].split(".")[0]))["reason"] for name in released}
        assert reasons <= {"released"}, "a live writer's lock was expired"  # (most turns end with a note)
    else:
        assert zookeeper_contenders(request.getfixturevalue("zookeeper_server"), target) == []

    expected: Rows = {}
    for plan, instant in zip(plans, instants, strict=True):
        expected |= expected_rows(plan, instant)
    assert_rows(target, expected)


# -- 2. two writers, one file group: exactly one commits -------------------------------------------


def test_overlapping_writers_exactly_one_commits(writers: Writers, tmp_path: Path) -> None:
    target = local_target(tmp_path)
    seeded, rows = seed(target, [f"s{i}" for i in range(6)])
    (file_group,) = {p.rsplit("/", 1)[1].split("_")[0] for p in target.data_files()}

    plan_a, plan_b = [batch("p0", ["s0", "s1"], "A")], [batch("p0", ["s3", "s4"], "B")]
    loser = writers.start(target, plan_a, name="a", pause_at="written", release_by_file=True)
    instant_a = loser.paused()["instant"]
    # A's base file is written, its instant pending: nothing of it is visible.
    assert len(data_files_of(target, instant_a)) == 1
    assert instant_files(target, instant_a) == pending_files(instant_a, State.INFLIGHT)
    assert_rows(target, rows)

    winner = writers.start(target, plan_b, name="b")
    instant_b = winner.finish(EXIT_OK)["commits"][0]["instant"]
    loser.release()
    error = loser.finish(EXIT_CONFLICT)["error"]

    assert error["type"] == "WriteConflictError"
    assert (error["instant"], error["winner"]) == (instant_a, instant_b)
    assert error["file_groups"] == [f"p0/{file_group}"]
    for name in (instant_a, instant_b, f"p0/{file_group}"):
        assert name in error["message"]
    assert "write conflict" in loser.output()

    timeline = target.timeline()
    assert [i.requested_time for i in timeline.completed()] == [seeded, instant_b]
    assert instant_files(target, instant_a) == pending_files(instant_a, State.INFLIGHT)
    assert data_files_of(target, instant_a) == set(), "the loser's base file was not removed"
    assert (heartbeat_of(target, instant_a) or {}).get("aborted") == "conflict"  # failed now, not on expiry
    assert heartbeat_of(target, instant_b) is None
    assert_lock_free(target)
    assert_rows(target, rows | expected_rows(plan_b, instant_b))


# -- 3. kill -9 at every step ----------------------------------------------------------------------

KILL_STEPS = [
    pytest.param("claimed", "filesystem", id="kill-while-claiming"),
    pytest.param("requested", "filesystem", id="kill-after-requested"),
    pytest.param("mid-write", "filesystem", id="kill-mid-write"),
    pytest.param("locked", "filesystem", id="kill-holding-lock"),
    pytest.param("published", "filesystem", id="kill-after-publish"),
    pytest.param("locked", "zookeeper", id="kill-holding-zookeeper-lock"),
]
ZK_SESSION_MS = 2000  # the server's tickTime is 500 ms: sessions may be 1 to 10 s


@pytest.mark.parametrize(("step", "provider"), KILL_STEPS)
def test_kill_9_at_each_step_loses_nothing_and_frees_the_lock(
    step: str, provider: str, writers: Writers, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target = local_target(tmp_path)
    seeded, rows = seed(target, [f"s{i}" for i in range(6)])
    options = dict(FAST_HEARTBEAT)
    if provider == "zookeeper":
        server: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        options |= zookeeper_settings(server, target, session_ms=ZK_SESSION_MS)

    # The victim updates the seed's file group first, then opens one in p1: two base files to write.
    victim_plan = [batch("p0", ["s0", "s1", "s2"], "victim"), batch("p1", ["v0", "v1"], "victim")]
    victim = writers.start(
        target, victim_plan, name="victim", pause_at=step, lock_provider=provider, options=options
    )
    instant = victim.paused()["instant"]
    victim.kill()

    published = step == "published"
    state = {"claimed": State.REQUESTED, "requested": State.REQUESTED, "published": State.COMPLETED}.get(
        step, State.INFLIGHT
    )
    victim_instant = target.timeline().get(instant)
    assert victim_instant is not None and victim_instant.state is state
    if published:
        completion = victim_instant.completion_time or ""
        assert instant_files(target, instant) == completed_files(instant, completion)
        rows |= expected_rows(victim_plan, instant)
    else:
        assert instant_files(target, instant) == pending_files(instant, state)
    heartbeat = heartbeat_of(target, instant)
    if step == "claimed":
        assert heartbeat is None  # it starts once the claim stands
    else:  # died silently: judged by the age of its heartbeat, or of its timeline files before the first
        assert heartbeat is None or "aborted" not in heartbeat
    assert judge(target.table(), victim_instant, HeartbeatPolicy(0.2, 2)).aborted is None
    written = {"claimed": 0, "requested": 0, "mid-write": 1}.get(step, 2)
    assert len(data_files_of(target, instant)) == written
    assert_rows(target, rows)  # earlier commits intact; a dead write's files invisible

    held = step in ("locked", "published")  # a writer takes the lock only to commit
    if provider == "filesystem":
        lock = current_lock(target.storage)
        assert lock is not None and (lock.holder is not None) == held, lock
        if lock.holder is not None:
            assert lock.holder.instant == instant
        dead_lock = lock.lock_id
    else:
        assert len(zookeeper_contenders(server, target)) == 1  # the dead session's node, until it expires

    # Another writer updates the same file group and opens another: it must get the lock and merge onto
    # the last *committed* base file, never onto the dead writer's garbage.
    rescue_plan = [batch("p0", ["s2", "s3", "s4"], "rescue", ts=2), batch("p2", ["r0", "r1"], "rescue", ts=2)]
    began = time.monotonic()
    rescuer = writers.start(target, rescue_plan, name="rescuer", lock_provider=provider, options=options)
    result = rescuer.finish(EXIT_OK)
    took = time.monotonic() - began
    rescue_instant = result["commits"][0]["instant"]

    if provider == "filesystem" and held:
        release = read_release(target.storage, dead_lock)
        assert release["reason"] == "expired", release
        assert f":{rescuer.pid}:" in str(release["owner"])
    if provider == "zookeeper":
        assert zookeeper_contenders(server, target) == []
        assert took >= ZK_SESSION_MS / 1000 * 0.5, f"the rescuer got the lock after {took:.1f} s"
    assert took < 20, f"recovering the lock took {took:.1f} s"
    if provider == "filesystem":
        assert_lock_free(target)

    rows |= expected_rows(rescue_plan, rescue_instant)
    assert_rows(target, rows)
    timeline = target.timeline()
    expected_completed = [seeded, *([instant] if published else []), rescue_instant]
    assert [i.requested_time for i in timeline.in_completion_order()] == expected_completed
    if not published:
        assert instant_files(target, instant) == pending_files(instant, state)


# -- 4. SIGSTOP past the heartbeat tolerance -------------------------------------------------------


@pytest.mark.parametrize(
    "step", [pytest.param("written", id="stop-after-write"), pytest.param("locked", id="stop-holding-lock")]
)
def test_a_writer_stopped_past_its_lease_never_commits(step: str, writers: Writers, tmp_path: Path) -> None:
    target = local_target(tmp_path)
    seeded, rows = seed(target, [f"s{i}" for i in range(6)])
    victim_plan = [batch("p0", ["s0", "s1"], "victim"), batch("p1", ["v0"], "victim")]
    victim = writers.start(
        target, victim_plan, name="victim", pause_at=step, release_by_file=True, options=FAST_HEARTBEAT
    )
    instant = victim.paused()["instant"]
    victim_files = data_files_of(target, instant)
    assert len(victim_files) == 2
    victim.signal(signal.SIGSTOP)
    victim.release()  # it goes on as soon as it runs again
    stopped_lock = current_lock(target.storage)

    other_plan = [batch("p2", ["o0", "o1"], "other")]
    other = writers.start(target, other_plan, name="other", options=FAST_HEARTBEAT)
    other_instant = other.finish(EXIT_OK)["commits"][0]["instant"]
    # The victim is stale by now (by its heartbeat, or its .inflight if stopped before the first renewal);
    # make sure it is stale by more than the whole tolerance.
    pending = target.timeline().get(instant)
    assert pending is not None
    policy = HeartbeatPolicy(0.2, 2)
    wait_until(lambda: judge(target.table(), pending, policy).idle > 2 * TOLERANCE, "a stale writer")
    victim.signal(signal.SIGCONT)
    error = victim.finish(EXIT_LEASE_LOST)["error"]
    assert error["type"] == "LeaseLostError", error

    if step == "locked":
        assert stopped_lock is not None and stopped_lock.holder is not None
        assert stopped_lock.holder.instant == instant
        release = read_release(target.storage, stopped_lock.lock_id)
        assert release["reason"] == "expired" and f":{other.pid}:" in str(release["owner"])
    assert_lock_free(target)
    timeline = target.timeline()
    assert [i.requested_time for i in timeline.in_completion_order()] == [seeded, other_instant]
    assert instant_files(target, instant) == pending_files(instant, State.INFLIGHT)
    assert data_files_of(target, instant) == set(), "the stopped writer's files were not removed"
    assert (heartbeat_of(target, instant) or {}).get("aborted") == "lease-lost"
    assert_rows(target, rows | expected_rows(other_plan, other_instant))


# -- 5. clock skew ---------------------------------------------------------------------------------

SKEWS = (-5.0, 0.0, 5.0)
ROUNDS = 4


@pytest.mark.parametrize("order", ["skew-round-robin", "skew-free-running"])
def test_skewed_clocks_keep_instants_unique_and_completions_ordered(
    order: str, writers: Writers, tmp_path: Path
) -> None:
    target = local_target(tmp_path)
    target.create()
    start, log, turns = tmp_path / "start", tmp_path / "commits.log", tmp_path / "turns"
    turns.mkdir()
    plans = [
        [batch(f"p{k}", [f"k{k}-{j}" for j in range(3)], f"skew{skew:+.0f}")] for k, skew in enumerate(SKEWS)
    ]
    started = [
        writers.start(
            target,
            plan,
            name=f"w{k}",
            operation="insert",
            skew=skew,
            rounds=ROUNDS,
            start_file=start,
            commit_log=log,
            turn=(turns, k, len(SKEWS)) if order == "skew-round-robin" else None,
        )
        for k, (plan, skew) in enumerate(zip(plans, SKEWS, strict=True))
    ]
    (turns / "turn-0").touch()
    writers.start_together(started, start)
    results = [w.finish(EXIT_OK, timeout=60) for w in started]

    entries = read_log(log)
    assert len(entries) == len(SKEWS) * ROUNDS
    assert_commit_order(target, entries, before=[])
    if order == "skew-round-robin":
        pids = [w.pid for w in started]
        assert [e["pid"] for e in entries] == pids * ROUNDS
    instants = [c["instant"] for r in results for c in r["commits"]]
    assert len(set(instants)) == len(SKEWS) * ROUNDS
    timeline = target.timeline()
    assert len(timeline) == len(SKEWS) * ROUNDS and all(i.is_completed for i in timeline)

    expected: Rows = {}
    for plan, result in zip(plans, results, strict=True):
        for round_number, commit in enumerate(result["commits"]):
            for group in plan:
                row = (group["partition"], group["value"], commit["instant"])
                expected |= {f"{key}-r{round_number}": row for key in group["keys"]}
    assert_rows(target, expected)


# -- 6. a storage failure while taking the lock -----------------------------------------------------


def test_a_storage_failure_while_taking_the_lock_leaves_it_free(writers: Writers, tmp_path: Path) -> None:
    target = local_target(tmp_path)
    seeded, rows = seed(target, [f"s{i}" for i in range(3)])
    # Default heartbeat settings: a leaked lock would block everybody for 2 minutes.
    victim = writers.start(target, [batch("p1", ["v0"], "victim")], name="victim", fail_at="lock-rescan")
    error = victim.finish(1)["error"]
    assert error["type"] == "StorageError" and "injected" in error["message"]
    assert target.timeline().completed().requested_times == {seeded}

    assert_lock_free(target)  # the writer survived its error: it must not keep a lock it does not know
    plan = [batch("p2", ["o0"], "other")]
    other = writers.start(target, plan, name="other", options={keys.LOCK_WAIT_MS.key: "5000"})
    other_instant = other.finish(EXIT_OK)["commits"][0]["instant"]
    assert_rows(target, rows | expected_rows(plan, other_instant))


# -- 7. a long wait for a busy lock ----------------------------------------------------------------

TRIES = 1100  # past 1024 the retry policy's 2 ** tries no longer fits a float


def test_a_writer_waiting_long_for_a_busy_lock_keeps_waiting(writers: Writers, tmp_path: Path) -> None:
    target = local_target(tmp_path)
    seeded, rows = seed(target, [f"s{i}" for i in range(3)])
    holder_plan, waiter_plan = [batch("p1", ["h0"], "holder")], [batch("p2", ["w0"], "waiter")]
    holder = writers.start(target, holder_plan, name="holder", pause_at="locked", release_by_file=True)
    holder.paused()
    # Pauses of about a millisecond (Hudi's own key names): a thousand tries take a second or two.
    quick = {
        keys.LOCK_RETRY_WAIT_MS.key: "1",
        keys.LOCK_MAX_RETRY_WAIT_MS.key: "1",
        keys.LOCK_WAIT_MS.key: "60000",
    }
    waiter = writers.start(target, waiter_plan, name="waiter", options=quick, report_tries=TRIES)

    def waited_long() -> bool:
        if waiter.process.poll() is not None:
            raise AssertionError(f"the waiting writer exited {waiter.process.returncode}:\n{waiter.output()}")
        return waiter.file("tries").exists()

    wait_until(waited_long, f"{TRIES} tries to take the lock")
    holder.release()
    holder_instant = holder.finish(EXIT_OK)["commits"][0]["instant"]
    waiter_instant = waiter.finish(EXIT_OK)["commits"][0]["instant"]
    assert [i.requested_time for i in target.timeline().in_completion_order()] == [
        seeded,
        holder_instant,
        waiter_instant,
    ]
    rows |= expected_rows(holder_plan, holder_instant) | expected_rows(waiter_plan, waiter_instant)
    assert_rows(target, rows)


# -- 8. early conflict detection and record-key conflicts, across processes -----------------------------

EARLY = {
    "hoodie.write.concurrency.early.conflict.detection.enable": "true",
    "hoodie.write.concurrency.async.conflict.detector.period_ms": "0",
}


def test_early_detection_stops_the_later_writer_before_it_writes(writers: Writers, tmp_path: Path) -> None:
    target = local_target(tmp_path)
    seeded, rows = seed(target, [f"s{i}" for i in range(4)])
    plan_a, plan_b = [batch("p0", ["s0"], "A")], [batch("p0", ["s1"], "B")]
    earlier = writers.start(target, plan_a, name="a", options=EARLY, pause_at="written", release_by_file=True)
    instant_a = earlier.paused()["instant"]
    later = writers.start(target, plan_b, name="b", options=EARLY)
    error = later.finish(EXIT_CONFLICT)["error"]
    assert (error["type"], error["winner"]) == ("WriteConflictError", instant_a)
    assert data_files_of(target, error["instant"]) == set()  # it stopped before writing its file
    earlier.release()
    earlier.finish(EXIT_OK)
    assert_rows(target, rows | expected_rows(plan_a, instant_a))


@pytest.mark.parametrize(
    ("operation", "check_keys"),
    [("upsert", True), ("upsert", False), ("insert", True)],
    ids=["upsert", "upsert-check-off", "insert"],
)
def test_concurrent_writers_of_one_new_key(
    operation: str, check_keys: bool, writers: Writers, tmp_path: Path
) -> None:
    """Two writers insert key "new" into p0, each into a file group of its own. Upserts conflict (the
    record-key check is on by default); with it off, or for inserts (Hudi's insert semantics), both
    commit and the key is there twice."""
    target = local_target(tmp_path)
    settings = {
        "hoodie.parquet.small.file.limit": "0",  # each write opens its own file group
        "cowrite.write.conflict.record.keys": str(check_keys).lower(),
    }
    seeded, rows = seed(target, ["s0"])
    plan_a, plan_b = [batch("p0", ["new"], "A")], [batch("p0", ["new"], "B")]
    slow = writers.start(
        target,
        plan_a,
        name="a",
        operation=operation,
        options=settings,
        pause_at="written",
        release_by_file=True,
    )
    instant_a = slow.paused()["instant"]
    fast = writers.start(target, plan_b, name="b", operation=operation, options=settings)
    instant_b = fast.finish(EXIT_OK)["commits"][0]["instant"]
    slow.release()
    if check_keys and operation == "upsert":
        error = slow.finish(EXIT_CONFLICT)["error"]
        assert error["winner"] == instant_b and "records with the same keys" in error["message"]
        assert "p0/new" in error["message"]
        assert_rows(target, rows | expected_rows(plan_b, instant_b))
    else:  # what plain file-group OCC gives: two records with one key
        slow.finish(EXIT_OK)
        want = sorted([("s0", *rows["s0"]), ("new", "p0", "A", instant_a), ("new", "p0", "B", instant_b)])
        assert cowrite_rows(target) == want and hudi_rows(target) == want


# -- 9. group commit on S3: a holder publishes the commits of the writers queued behind it -------------

# Long enough a lease that a waiter hands its commit over for seconds (cowrite.protocol.group), short
# enough that a dead holder's lock expires within the test's waits.
GROUP_HEARTBEAT = {
    keys.HEARTBEAT_INTERVAL_MS.key: "2000",
    keys.HEARTBEAT_TOLERABLE_MISSES.key: "2",
}


def requests_queued(target: Target, count: int) -> bool:
    """Whether ``count`` places in the lock's queue hold a waiter's commit."""
    places = [i.name for i in target.storage.list(LOCK_DIR) if i.name.endswith(".queued")]
    return sum(bool(target.storage.read(f"{LOCK_DIR}/{name}")) for name in places) >= count


def lock_notes(target: Target) -> list[str]:
    return sorted(
        i.name for i in target.storage.list(LOCK_DIR) if ".published" in i.name or ".grouped." in i.name
    )


def test_the_holder_publishes_the_commits_queued_behind_it(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    target = s3_target(s3_server)
    target.create()
    log = tmp_path / "commits.log"
    plans = {name: [batch(name, [f"{name}-{j}" for j in range(3)], name)] for name in ("a", "b", "c")}
    holder = writers.start(
        target,
        plans["a"],
        name="a",
        operation="insert",
        pause_at="locked",
        release_by_file=True,
        commit_log=log,
    )
    holder.paused()
    waiters = [
        writers.start(target, plans[n], name=n, operation="insert", commit_log=log) for n in ("b", "c")
    ]
    wait_until(lambda: requests_queued(target, 2), "both waiters to hand their commits over")
    holder.release()
    results = {w.name: w.finish(EXIT_OK)["commits"][0] for w in [holder, *waiters]}

    # One turn of the lock published all three, the holder's first; the waiters learnt from its notes
    published_in_one_turn(target, log, holder, results, plans)


def published_in_one_turn(
    target: Target, log: Path, holder: Writer, results: dict[str, Any], plans: dict[str, Any]
) -> int:
    """That one turn of ``holder`` published the writers' commits (``results``, by name; the holder's is
    "a") and noted them, in commit order as its log says, and ended leaving no place and no heartbeat
    behind; the table holds every plan's rows. The turn's lock id."""
    entries = read_log(log)
    lock_id = int(entries[0]["lock_id"])
    others = sorted(results[n]["instant"] for n in results if n != "a")
    assert entries[0]["instant"] == results["a"]["instant"]
    assert sorted(e["instant"] for e in entries[1:]) == others
    assert {e["lock_id"] for e in entries} == {lock_id} and {e["pid"] for e in entries} == {holder.pid}
    assert_commit_order(target, entries, before=[])
    completed = {i.requested_time: i for i in target.timeline()}
    for result in results.values():
        assert completed[result["instant"]].completion_time == result["completion"]
    own, *grouped = [f"{e['instant']}_{e['completion']}.commit" for e in entries]
    notes = lock_notes(target)
    assert len(notes) == len(entries)
    assert [n for n in notes if n.startswith(f"lock{lock_id}.published+{len(grouped)}.{own}")]
    assert all([n for n in notes if n.startswith(f"lock{lock_id}.grouped.{name}")] for name in grouped)
    lock = current_lock(target.storage)
    assert lock is not None and lock.lock_id == lock_id and lock.holder is None
    assert not [i for i in target.storage.list(LOCK_DIR) if i.name.endswith(".queued")]
    assert target.storage.list(HEARTBEAT_DIR) == []
    expected: Rows = {}
    for name, plan in plans.items():
        expected |= expected_rows(plan, results[name]["instant"])
    assert_rows(target, expected)
    return lock_id


def test_a_queued_commit_that_conflicts_is_left_to_its_writer(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    target = s3_target(s3_server)
    seeded, rows = seed(target, [f"s{i}" for i in range(4)])
    options = {keys.RETRIES_ON_CONFLICT.key: "0"}
    log = tmp_path / "commits.log"
    holder_plan = [batch("p0", ["s0", "s1"], "holder")]
    holder = writers.start(
        target,
        holder_plan,
        name="holder",
        pause_at="locked",
        release_by_file=True,
        commit_log=log,
        options=options,
    )
    holder.paused()
    rival_plan = [batch("p0", ["s2"], "rival")]  # the seed's one file group, as the holder's
    rival = writers.start(target, rival_plan, name="rival", commit_log=log, options=options)
    other_plan = [batch("p1", ["o0"], "other")]
    other = writers.start(
        target, other_plan, name="other", operation="insert", commit_log=log, options=options
    )
    wait_until(lambda: requests_queued(target, 2), "both waiters to hand their commits over")
    holder.release()
    held = holder.finish(EXIT_OK)["commits"][0]["instant"]
    added = other.finish(EXIT_OK)["commits"][0]["instant"]
    rival.wait()
    assert rival.process.returncode == EXIT_CONFLICT, rival.output()

    entries = read_log(log)
    assert [e["instant"] for e in entries] == [held, added]
    assert {e["pid"] for e in entries} == {holder.pid}
    assert_commit_order(target, entries, before=[seeded])
    timeline = target.timeline()
    assert [i.requested_time for i in timeline.in_completion_order()] == [seeded, held, added]
    losers = [i for i in timeline if not i.is_completed]
    assert len(losers) <= 1 and all(i.requested_time not in (held, added) for i in losers)
    rows |= expected_rows(holder_plan, held) | expected_rows(other_plan, added)
    assert_rows(target, rows)


def test_a_holder_killed_while_publishing_queued_commits_loses_none(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    target = s3_target(s3_server)
    target.create()
    # This test holds the lock (its turn notes that it published nothing) while three writers queue behind it;
    # whichever takes the lock next publishes the others' commits after its own, and dies after the first.
    policy = HeartbeatPolicy(interval=2.0, tolerable_misses=2)
    lock = FileSystemLock(target.storage, LockHolder(owner="test"), policy)
    lock.acquire()
    plans = {name: [batch(name, [f"{name}-{j}" for j in range(2)], name)] for name in ("a", "b", "c")}
    started = [
        writers.start(target, plan, name=n, operation="insert", pause_at="grouped", options=GROUP_HEARTBEAT)
        for n, plan in plans.items()
    ]
    wait_until(lambda: requests_queued(target, 3), "three waiters to hand their commits over")
    lock.note_published(None)
    lock.release()
    killed = wait_for_any_pause(started)
    killed.kill()
    survivors = [w for w in started if w is not killed]
    results = {w.name: w.finish(EXIT_OK)["commits"][0]["instant"] for w in survivors}

    timeline = target.timeline()
    assert all(i.is_completed for i in timeline) and len(timeline) == 3
    by_name = {n: [i for i in timeline if i.requested_time == results.get(n)] for n in plans}
    assert all(len(found) == 1 for n, found in by_name.items() if n in results)
    killed_instant = next(i.requested_time for i in timeline if i.requested_time not in results.values())
    expected: Rows = {}
    for name, plan in plans.items():
        expected |= expected_rows(plan, results.get(name, killed_instant))
    assert_rows(target, expected)
    assert_lock_free(target)


def wait_for_any_pause(started: list[Writer]) -> Writer:
    found: list[Writer] = []

    def paused() -> bool:
        found.extend(w for w in started if w.file("ready").exists())
        return bool(found)

    wait_until(paused, "a holder to publish a waiter's commit")
    return found[0]


def test_a_waiter_that_gives_up_after_handing_its_commit_over_reports_it_published(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    """A waiter whose wait for the lock times out may have had its commit published meanwhile by the
    holder ahead of it: it waits until its request lapses, then looks, and reports the commit."""
    target = s3_target(s3_server)
    target.create()
    lock = FileSystemLock(target.storage, LockHolder(owner="test"), HeartbeatPolicy())
    lock.acquire()
    log = tmp_path / "commits.log"
    # Whichever takes the lock publishes the other's commit and stops there, its release not made: the
    # other times out waiting (3 s), waits for its request to lapse, and finds its commit in the timeline.
    plans = {name: [batch(name, [f"{name}-0"], name)] for name in ("a", "b")}
    options = {keys.LOCK_WAIT_MS.key: "3000"}
    started = {
        n: writers.start(
            target,
            plan,
            name=n,
            operation="insert",
            pause_at="grouped",
            release_by_file=True,
            options=options,
            commit_log=log,
        )
        for n, plan in plans.items()
    }
    wait_until(lambda: requests_queued(target, 2), "both writers to hand their commits over")
    lock.note_published(None)
    lock.release()
    holder = wait_for_any_pause(list(started.values()))
    waiter = next(w for w in started.values() if w is not holder)
    waited = waiter.finish(EXIT_OK, timeout=WAIT)["commits"][0]
    holder.release()
    held = holder.finish(EXIT_OK)["commits"][0]

    # (the holder made no release meanwhile: the waiter learnt of its commit from the timeline, once its
    # wait had timed out)
    assert waited["seconds"] >= 3.0
    entries = read_log(log)
    assert [(e["instant"], e["completion"]) for e in entries] == [
        (held["instant"], held["completion"]),
        (waited["instant"], waited["completion"]),
    ]
    assert_commit_order(target, entries, before=[])
    expected: Rows = {}
    for name, plan in plans.items():
        expected |= expected_rows(plan, (held if started[name] is holder else waited)["instant"])
    assert_rows(target, expected)
    assert_lock_free(target)


# -- 10. standing turns on S3: a holder keeps its turn and publishes the commits handed to it ----------

# A turn that stands for seconds with no commit handed to it, so that the writers a test starts reach it;
# the lease as group commit's, so that a dead holder's lock expires within the test's waits.
STANDING = {
    **GROUP_HEARTBEAT,
    keys.LOCK_STANDING_MS.key: "30000",
    keys.LOCK_STANDING_IDLE_MS.key: "5000",
}


def serving(target: Target) -> list[str]:
    """The ``lock<id>.serves`` files: the turns that stand, or stood and are not collected yet."""
    return [i.name for i in target.storage.list(LOCK_DIR) if i.name.endswith(".serves")]


def test_a_standing_turn_publishes_the_commits_handed_to_it(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    target = s3_target(s3_server)
    target.create()
    log, go = tmp_path / "commits.log", tmp_path / "go"
    plans = {name: [batch(name, [f"{name}-{j}" for j in range(3)], name)] for name in ("a", "b", "c")}
    waiters = [
        writers.start(
            target, plans[n], name=n, operation="insert", options=STANDING, start_file=go, commit_log=log
        )
        for n in ("b", "c")
    ]
    holder = writers.start(target, plans["a"], name="a", operation="insert", options=STANDING, commit_log=log)
    wait_until(lambda: serving(target), "the holder's turn to stand")
    writers.start_together(waiters, go)
    results = {w.name: w.finish(EXIT_OK)["commits"][0] for w in waiters}
    results["a"] = holder.finish(EXIT_OK)["commits"][0]

    # One turn published all three, the holder's first: the waiters' were handed to it over a connection,
    # with no place in the queue taken, and it ended by itself, its holder's heartbeat stopped with it
    lock_id = published_in_one_turn(target, log, holder, results, plans)
    assert serving(target) == [f"lock{lock_id}.serves"]


def test_a_holder_killed_while_its_turn_stands_loses_no_commit(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    """kill -9 of a standing holder between the create of a waiter's completed file and its answer: the
    waiter finds the connection broken, waits through the store until the dead holder's lock expires,
    and finds its commit published."""
    target = s3_target(s3_server)
    target.create()
    plans = {name: [batch(name, [f"{name}-{j}" for j in range(2)], name)] for name in ("a", "b")}
    holder = writers.start(
        target, plans["a"], name="a", operation="insert", options=STANDING, pause_at="grouped"
    )
    wait_until(lambda: serving(target), "the holder's turn to stand")
    waiter = writers.start(target, plans["b"], name="b", operation="insert", options=STANDING)
    paused = holder.paused()
    holder.kill()
    result = waiter.finish(EXIT_OK)["commits"][0]

    assert paused["instant"] == result["instant"]  # the holder died once the waiter's commit was created
    timeline = target.timeline()
    assert all(i.is_completed for i in timeline) and len(timeline) == 2
    held = next(i for i in timeline if i.requested_time != result["instant"])
    assert timeline.get(result["instant"]).completion_time == result["completion"]  # type: ignore[union-attr]
    assert held.completion_time is not None and held.completion_time < result["completion"]
    (stood,) = serving(target)
    stood_id = int(stood.removeprefix("lock").removesuffix(".serves"))
    assert read_release(target.storage, stood_id)["reason"] == "expired"
    assert_rows(
        target, expected_rows(plans["a"], held.requested_time) | expected_rows(plans["b"], result["instant"])
    )
    assert_lock_free(target)


def test_a_waiter_killed_after_handing_its_commit_over_is_published(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    """kill -9 of a waiter whose commit a standing turn is publishing: the turn goes on, answers nobody,
    and notes the commit; the table holds it."""
    target = s3_target(s3_server)
    target.create()
    log = tmp_path / "commits.log"
    plans = {name: [batch(name, [f"{name}-{j}" for j in range(2)], name)] for name in ("a", "b")}
    holder = writers.start(
        target,
        plans["a"],
        name="a",
        operation="insert",
        options=STANDING,
        pause_at="grouped",
        release_by_file=True,
        commit_log=log,
    )
    wait_until(lambda: serving(target), "the holder's turn to stand")
    waiter = writers.start(target, plans["b"], name="b", operation="insert", options=STANDING)
    paused = holder.paused()
    waiter.kill()
    holder.release()
    held = holder.finish(EXIT_OK)["commits"][0]["instant"]

    entries = read_log(log)
    assert [e["instant"] for e in entries] == [held, paused["instant"]]
    assert_commit_order(target, entries, before=[])
    timeline = target.timeline()
    assert all(i.is_completed for i in timeline) and len(timeline) == 2
    own, handed = [f"{e['instant']}_{e['completion']}.commit" for e in entries]
    lock_id = entries[0]["lock_id"]
    notes = lock_notes(target)
    assert [n for n in notes if n.startswith(f"lock{lock_id}.published+1.{own}")]
    assert [n for n in notes if n.startswith(f"lock{lock_id}.grouped.{handed}")]
    assert_rows(target, expected_rows(plans["a"], held) | expected_rows(plans["b"], paused["instant"]))
    assert_lock_free(target)


def test_a_standing_turn_refuses_a_commit_that_conflicts(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    """A writer that began before the holder's commit, and touches its file group, is refused by the
    standing turn, goes on through the store, and loses the conflict there; nothing of it is published."""
    target = s3_target(s3_server)
    seeded, rows = seed(target, [f"s{i}" for i in range(3)])
    options = {**STANDING, keys.RETRIES_ON_CONFLICT.key: "0"}
    log = tmp_path / "commits.log"
    rival_plan = [batch("p0", ["s2"], "rival")]  # the seed's one file group, as the holder's
    rival = writers.start(
        target,
        rival_plan,
        name="rival",
        options=options,
        pause_at="planned",
        release_by_file=True,
        commit_log=log,
    )
    rival.paused()  # it began on the seed alone
    holder_plan = [batch("p0", ["s0"], "holder")]
    seeding = serving(target)  # the seed's turn stood too
    holder = writers.start(target, holder_plan, name="holder", options=options, commit_log=log)
    wait_until(lambda: serving(target) != seeding, "the holder's turn to stand")
    rival.release()
    rival.wait()
    assert rival.process.returncode == EXIT_CONFLICT, rival.output()
    held = holder.finish(EXIT_OK)["commits"][0]["instant"]

    entries = read_log(log)
    assert [e["instant"] for e in entries] == [held]
    timeline = target.timeline()
    assert [i.requested_time for i in timeline.in_completion_order()] == [seeded, held]
    assert [i for i in timeline if not i.is_completed and i.requested_time == held] == []
    assert_rows(target, rows | expected_rows(holder_plan, held))
    assert_lock_free(target)


def test_a_stale_standing_address_sends_the_waiter_through_the_store(
    s3_server: S3Server, writers: Writers, tmp_path: Path
) -> None:
    """A ``lock<id>.serves`` whose holder no longer listens (a port closed since): the waiter hands its
    commit over in its place in the queue instead, and commits once the lock is free."""
    target = s3_target(s3_server)
    target.create()
    lock = FileSystemLock(target.storage, LockHolder(owner="test"), HeartbeatPolicy())
    lock.acquire()
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    address = handover.Address("127.0.0.1", port, socket.gethostname(), "secret")
    assert lock.lock_id is not None
    target.storage.write(serves_path(lock.lock_id), address.to_bytes())
    plan = [batch("b", ["b-0", "b-1"], "b")]
    waiter = writers.start(target, plan, name="b", operation="insert", options=STANDING)
    wait_until(lambda: requests_queued(target, 1), "the waiter to queue its commit in the store")
    lock.note_published(None)
    lock.release()
    result = waiter.finish(EXIT_OK)["commits"][0]

    timeline = target.timeline()
    assert [(i.requested_time, i.completion_time) for i in timeline] == [
        (result["instant"], result["completion"])
    ]
    assert_rows(target, expected_rows(plan, result["instant"]))
    assert_lock_free(target)


def test_a_standing_turn_takes_only_messages_with_its_secret_and_id() -> None:
    taken: list[tuple[str, bytes]] = []

    def take(kind: str, payload: bytes, answer: handover.Answer) -> None:
        taken.append((kind, payload))
        answer("P\tnoted")

    listener = handover.Listener("127.0.0.1", 7, take)
    try:
        right = listener.address
        wrong = handover.Address(right.host, right.port, right.node, "not-the-secret")
        refused = f"{handover.REFUSED}\tnot this turn's secret"
        assert handover._exchange(wrong, 7, handover.COMMIT, b"request") == refused
        assert handover._exchange(right, 8, handover.COMMIT, b"request") == refused
        assert taken == []
        assert handover._exchange(right, 7, handover.COMMIT, b"request") == "P\tnoted"
        assert taken == [(handover.COMMIT, b"request")]
    finally:
        listener.close()
    with pytest.raises(handover.Unreached):
        handover._exchange(right, 7, handover.COMMIT, b"request")


def test_turns_stand_only_where_the_settings_let_them(s3_server: S3Server, tmp_path: Path) -> None:
    s3 = s3_target(s3_server).storage
    local = Storage.for_uri(str(tmp_path / "table"))
    holder, policy = LockHolder(owner="test"), HeartbeatPolicy()

    def standing(storage: Storage, **settings: str) -> Standing | None:
        return lock_for(storage, Config(settings), holder, policy, "t").standing

    assert standing(s3) == Standing(most=3.0, idle=0.3, address="127.0.0.1")
    assert standing(s3, **{keys.LOCK_STANDING_MS.key: "0"}) is None
    assert standing(local) is None  # local disk: a turn costs no round trips
    with pytest.raises(ConfigError, match="cowrite.lock.standing.ms must be 0 or more"):
        standing(s3, **{keys.LOCK_STANDING_MS.key: "-1"})


def test_a_turn_that_cannot_listen_ends_with_its_commit(s3_server: S3Server, writers: Writers) -> None:
    """An address that is not this host's: the commit stands, and the turn ends at once as a turn that
    does not stand, noted and released."""
    target = s3_target(s3_server)
    target.create()
    plan = [batch("a", ["a-0"], "a")]
    options = {keys.LOCK_STANDING_ADDRESS.key: "192.0.2.1"}  # TEST-NET-1: no host has it
    result = writers.start(target, plan, name="a", operation="insert", options=options).finish(EXIT_OK)
    (commit,) = result["commits"]
    assert [(i.requested_time, i.completion_time) for i in target.timeline()] == [
        (commit["instant"], commit["completion"])
    ]
    assert serving(target) == [] and len(lock_notes(target)) == 1
    assert_rows(target, expected_rows(plan, commit["instant"]))
    assert_lock_free(target)


def test_a_waiter_counts_its_commit_handed_over_unless_the_turn_refused_it(tmp_path: Path) -> None:
    """What a waiter makes of each answer (:func:`cowrite.protocol.locks.handover.offer`): published, with
    the note naming its commit; refused, so nobody published it; and unknown (the turn's create failed
    midway), so it may have been published and the waiter must look, and does not try that turn again."""
    storage = Storage.for_uri(str(tmp_path / "table"))
    answers = iter(["P\tnoted\tnoted", "R\tit lapses", "U\tthe create failed midway"])
    listener = handover.Listener("127.0.0.1", 3, lambda kind, payload, answer: answer(next(answers)))
    try:
        handover.learn(storage.uri, 3, listener.address)
        assert handover.offer(storage, 3, b"request") == (True, "noted")
        assert handover.offer(storage, 3, b"request") == (False, None)
        assert handover.standing_turn(storage.uri) == 3
        assert handover.offer(storage, 3, b"request") == (True, None)
        assert handover.standing_turn(storage.uri) is None
    finally:
        listener.close()
