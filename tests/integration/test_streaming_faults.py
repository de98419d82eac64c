"""Exactly once under faults: a streaming ingestion whose driver is killed and restarted, beside a backfill;
a streaming consumer reading while writers commit out of requested-time order.

The ingestion is a real Structured Streaming query in a process of its own (``support/streaming_driver.py``)
upserting JSON files through :func:`cowrite.spark.upsert_each_batch`; the backfill is a writer process
replacing the old partitions (``insert_overwrite``) at the same time. The driver's whole process group
(Python and its JVM) is killed with SIGKILL — before its commit, during it (the completed file written and
the lock still held included), after it but before Spark recorded the batch, and once at a random moment —
and restarted from the same checkpoint each time. Afterwards cowrite's reader and hudi-rs see every record
once with its latest value, each micro-batch is one completed commit, and a rollback pass leaves nothing
pending. The kill points are drawn from a seed the failure message names (``COWRITE_STREAM_SEED`` replays it).

The consumer is a ``readStream.format("cowrite")`` query in this process, running while four writer
processes commit, one of them held after writing so that it completes after instants requested later.
What it hands to ``foreachBatch`` must be the table's history: every record of every commit, once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support import TESTS, hudi_rs, streaming_driver, writer_process
from support.servers import S3Server
from support.tables import new_table, rows

from cowrite.cleaner import rollback_failed, service_lock
from cowrite.format import config as keys
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.txn import TXN_VERSION_KEY
from cowrite.spark import options as spark_keys
from cowrite.spark import register

pytestmark = pytest.mark.slow

BATCHES = 8
# A killed driver's lease ends soon after its last renewal, so the restarts do not wait long: 3 s, the
# least the README allows on an object store. Shorter, a driver whose renewals a busy machine delays by a
# second or two (its JVM starting, a Spark job running on two cores) loses its lease and fails the test.
LEASE = {keys.HEARTBEAT_INTERVAL_MS.key: "1000", keys.HEARTBEAT_TOLERABLE_MISSES.key: "3"}
BEFORE = ("requested", "planned")
DURING = ("written", "locked", "checked", "published")
AFTER = (streaming_driver.COMMITTED,)
WAIT = 120.0  # a driver starts a JVM: under load that alone may take tens of seconds


@dataclass
class Run:
    """The table, the query's input and checkpoint, and the processes started on them."""

    uri: str
    directory: Path
    storage_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def source(self) -> Path:
        return self.directory / "in"

    def table(self) -> Table:
        return Table.load(self.uri, **self.storage_options)

    def start(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        """A process in a group of its own (a driver's JVM is its child: SIGKILL reaches both)."""
        with open(self.directory / f"{name}.stderr", "wb") as stderr:
            process = subprocess.Popen(
                command,
                env={**os.environ, **self.env, "PYTHONPATH": str(TESTS)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        self.started.append(process)
        return process

    def driver(self, name: str) -> subprocess.Popen[bytes]:
        """A driver on standby: it starts its Spark session now and its query at :meth:`go`, so that its
        JVM starts while the driver before it runs."""
        command = [sys.executable, "-m", "support.streaming_driver", self.uri, str(self.source)]
        command += [str(self.directory / "checkpoint"), "--storage-options", json.dumps(self.storage_options)]
        return self.start(name, [*command, "--standby", str(self.directory / f"{name}.go")])

    def go(self, name: str, *options: str) -> None:
        """Start the query of driver ``name`` with ``options``."""
        writer_process.write_atomically(self.directory / f"{name}.go", json.dumps(options))

    def stderr(self, name: str) -> str:
        return (self.directory / f"{name}.stderr").read_text(errors="replace")[-4000:]

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def committed_batches(self) -> list[int]:
        """The micro-batch of every completed commit that carries one, in completion order."""
        table = self.table()
        commits = table.timeline().data_commits().in_completion_order()
        versions = (table.commit_metadata(i).extra.get(TXN_VERSION_KEY) for i in commits)
        return [int(v) for v in versions if v is not None]


@pytest.fixture(params=["local", "s3"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Run]:
    if request.param == "local":
        started = Run(str(tmp_path / "table"), tmp_path)
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        uri = server.new_uri("streaming")
        started = Run(uri, tmp_path, server.storage_options(), server.env())
    started.source.mkdir()
    try:
        yield started
    finally:
        for process in started.started:
            started.kill(process)


@pytest.mark.timeout(600)  # six drivers one after another, each starting a JVM: minutes on a loaded machine
def test_a_streaming_ingestion_killed_at_random_points_beside_a_backfill_writes_every_record_once(
    run: Run,
) -> None:
    seed = int(os.environ.get("COWRITE_STREAM_SEED", random.randrange(10**6)))
    rng = random.Random(seed)
    replay = f"(COWRITE_STREAM_SEED={seed})"
    table = new_table(run.uri, properties=LEASE, **run.storage_options)
    old = {"d0": ["o0", "o1", "o2"], "d1": ["o3", "o4"]}
    for part, ids in old.items():
        LocalWriter(table).insert(rows(ids, part, value="seed"))
    produced = _produce(run.source)

    rounds = 3
    backfill = run.start(
        "backfill",
        [sys.executable, str(Path(writer_process.__file__)), run.uri, "--operation", "insert_overwrite"]
        + ["--rounds", str(rounds), "--storage-options", json.dumps(run.storage_options)]
        + ["--batch", json.dumps([{"partition": p, "keys": k, "value": "backfill"} for p, k in old.items()])],
    )

    kills = [rng.choice(BEFORE), rng.choice(DURING), "random", rng.choice(DURING), rng.choice(AFTER)]
    driver = run.driver("driver-0")
    for number, point in enumerate(kills):
        name, following = f"driver-{number}", run.driver(f"driver-{number + 1}")
        signal_file = run.directory / f"{name}-{point}.signal"
        if point == "random":
            run.go(name, "--started-file", str(signal_file))
            _wait_for(signal_file, f"{name} to start", run, name, driver)
            time.sleep(rng.uniform(0.0, 3.0))
        else:
            batch = max(run.committed_batches(), default=-1) + 1
            assert batch < BATCHES, f"no micro-batch left to kill {name} at {point} in {replay}"
            run.go(name, "--pause-at", point, "--pause-batch", str(batch), "--ready-file", str(signal_file))
            _wait_for(signal_file, f"{name} to reach {point} of micro-batch {batch}", run, name, driver)
        run.kill(driver)
        driver = following

    last = f"driver-{len(kills)}"
    run.go(last)
    assert driver.wait(timeout=WAIT) == 0, f"the last run failed {replay}:\n{run.stderr(last)}"
    assert backfill.wait(timeout=WAIT) == 0, f"the backfill failed {replay}:\n{run.stderr('backfill')}"

    assert sorted(run.committed_batches()) == list(range(BATCHES)), f"each micro-batch once {replay}"
    backfilled = [(f"{i}-r{rounds - 1}", p, "backfill") for p, ids in old.items() for i in ids]
    expected = sorted(backfilled + [(i, p, v) for i, (p, v) in produced.items()])
    assert _rows(read.snapshot(run.table())) == expected, f"cowrite's snapshot {replay}"
    assert _rows(hudi_rs.snapshot(run.uri, run.storage_options)) == expected, f"hudi-rs's snapshot {replay}"

    table = run.table()
    rollback_failed(table, service_lock(table), HeartbeatPolicy.from_config(table.config), time.time() + 60)
    assert list(run.table().timeline().pending()) == [], f"failed writes were all rolled back {replay}"


def test_a_streaming_consumer_reads_every_commit_once_while_four_writers_commit_out_of_order(
    run: Run, spark: Any
) -> None:
    table = new_table(run.uri, properties=LEASE, **run.storage_options)
    LocalWriter(table).insert(rows(["seed"], "p0", value="seed"))
    register(spark)
    received: list[tuple[int, str, str, str]] = []  # batch, id, value, commit time
    consumer = (
        spark.readStream.format("cowrite")
        .option(spark_keys.STORAGE_OPTIONS_JSON.key, json.dumps(run.storage_options))
        .load(run.uri)
        .writeStream.foreachBatch(
            lambda frame, batch: received.extend(
                (batch, *r) for r in frame.select("id", "value", "_hoodie_commit_time").collect()
            )
        )
        .option("checkpointLocation", str(run.directory / "consumer"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:

        def writer(name: str, rounds: int, *options: str) -> subprocess.Popen[bytes]:
            batch = json.dumps({"partition": name, "keys": [f"{name}-a", f"{name}-b"], "value": name})
            command = [sys.executable, str(Path(writer_process.__file__)), run.uri, "--batch", batch]
            command += ["--rounds", str(rounds), "--storage-options", json.dumps(run.storage_options)]
            return run.start(name, [*command, *options])

        ready, go = run.directory / "slow.ready", run.directory / "slow.go"
        # paused once it has planned: its instant is claimed, and it holds no lock on either storage
        slow = writer("slow", 1, "--pause-at", "planned", "--ready-file", str(ready), "--go-file", str(go))
        _wait_for(ready, "the slow writer to plan its write", run, "slow", slow)
        fast = [writer(f"w{n}", 3) for n in range(3)]
        for n, process in enumerate(fast):
            assert process.wait(timeout=WAIT) == 0, run.stderr(f"w{n}")
        go.touch()
        assert slow.wait(timeout=WAIT) == 0, run.stderr("slow")
        consumer.processAllAvailable()
    finally:
        consumer.stop()

    commits = run.table().timeline().data_commits()
    slow_instant = json.loads(ready.read_text())["instant"]
    later = [i for i in commits if i.requested_time > slow_instant]
    assert later and all(i.completion_time < commits.get(slow_instant).completion_time for i in later)
    written = [("seed", "seed"), ("slow-a", "slow"), ("slow-b", "slow")]
    written += [(f"w{n}-{k}-r{r}", f"w{n}") for n in range(3) for k in "ab" for r in range(3)]
    assert sorted((key, value) for _, key, value, _ in received) == sorted(written)  # each once
    # every key was written once: the snapshot is the history, with each record's commit
    snapshot = read.snapshot(run.table(), with_meta=True).to_pylist()
    theirs = hudi_rs.snapshot(run.uri, run.storage_options, with_meta=True)
    for found in (snapshot, theirs):
        assert sorted((r["id"], r["value"], r["_hoodie_commit_time"]) for r in found) == sorted(
            r[1:] for r in received
        )
    batches: dict[str, set[int]] = {}  # each commit's rows in one micro-batch
    for batch, *_, commit_time in received:
        batches.setdefault(commit_time, set()).add(batch)
    assert all(len(b) == 1 for b in batches.values())


def _produce(source: Path) -> dict[str, tuple[str, str]]:
    """Write the query's input, one file per micro-batch: new keys and updates of the previous batch's;
    return the latest (partition, value) of every key."""
    latest: dict[str, tuple[str, str]] = {}
    for number in range(BATCHES):
        records = [(f"s{number}-{i}", f"n{i % 2}") for i in range(6)]
        records += [(f"s{number - 1}-{i}", f"n{i % 2}") for i in range(3) if number > 0]
        lines = [{"id": k, "part": p, "ts": number, "value": f"b{number}"} for k, p in records]
        temp = source.parent / f".{number}.json"
        temp.write_text("".join(json.dumps(line) + "\n" for line in lines))
        temp.rename(source / f"{number:03d}.json")
        latest.update({k: (p, f"b{number}") for k, p in records})
    return latest


def _rows(found: Any) -> list[tuple[str, str, str]]:
    listed = found if isinstance(found, list) else hudi_rs.rows(found)
    return sorted((r["id"], r["part"], r["value"]) for r in listed)


def _wait_for(path: Path, what: str, run: Run, name: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"{name} exited {process.returncode} before {what}:\n{run.stderr(name)}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{run.stderr(name)}"
        time.sleep(0.05)
