"""``cowrite demo``: the main job — a streaming ingestion beside a batch backfill, the daemon, a conflict, a
rollback, and incremental reads by completion time, on a local table.

Every part is real: the daemon is a ``cowrite daemon`` process serving HTTP on 127.0.0.1; the ingestion
is a ``cowrite stream`` process (a Structured Streaming query) writing the files that arrive in a
directory, killed with SIGKILL — its JVM too — right after a micro-batch's commit landed and before Spark
recorded it, then restarted from its checkpoint; every other writer is a ``cowrite write --engine spark``
process with its own SparkSession, one of them killed by SIGKILL in the middle of its write. The demo ends
with a consumer, a ``readStream.format("cowrite")`` query in this process, checked against the timeline.
The heartbeat tolerance is shortened (1 s x 2) so the daemon's rollback happens within seconds instead of
minutes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

import cowrite

_COWRITE = [sys.executable, "-m", "cowrite"]
_SPARK = ["--master", "local[1]", "-o", "spark.ui.enabled=false"]
_FAST_HEARTBEAT = {
    "hoodie.client.heartbeat.interval_in_ms": "1000",
    "hoodie.client.heartbeat.tolerable.misses": "2",
}


def _batch(directory: Path, name: str, rows: list[dict[str, object]]) -> str:
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _rows(region: str, ids: range, version: int) -> list[dict[str, object]]:
    return [{"id": i, "region": region, "version": version, "amount": i * 10 + version} for i in ids]


def _spark_write(
    table: str, batch: str, operation: str = "upsert", hold_until: Path | None = None
) -> subprocess.Popen[str]:
    args = [table, "--input", batch, "--operation", operation, "--engine", "spark", "--master", "local[1]"]
    command = (
        [*_COWRITE, "write", *args]
        if hold_until is None
        else [sys.executable, "-m", "cowrite.held", "written", str(hold_until), "write", *args]
    )
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _outcome(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate()
    lines = [line for line in (out or err).splitlines() if line.strip()]
    return f"exit {process.returncode}: {lines[-1] if lines else ''}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (our own loopback daemon)
        return bytes(response.read())


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"the demo waited {seconds:.0f} s for {what}")
        time.sleep(0.2)


def run(path: str | None = None, say: Callable[[str], None] = print) -> None:
    work = Path(tempfile.mkdtemp(prefix="cowrite-demo-"))
    table_path = path or str(work / "orders")
    say(f"== a table at {table_path}")
    settings = [arg for key, value in _FAST_HEARTBEAT.items() for arg in ("-o", f"{key}={value}")]
    subprocess.run(
        [
            *_COWRITE,
            "init",
            table_path,
            "--record-key",
            "id",
            "--partition-field",
            "region",
            "--ordering-field",
            "version",
            "--name",
            "orders",
            *settings,
        ],
        check=True,
    )
    table = cowrite.load(table_path)
    subprocess.run(
        [
            *_COWRITE,
            "write",
            table_path,
            "--operation",
            "insert",
            "--input",
            _batch(work, "history", _rows("us", range(100, 130), 1)),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    say(f"== the daemon follows the table and serves {url}/metrics")
    daemon = subprocess.Popen(
        [
            *_COWRITE,
            "daemon",
            table_path,
            "--port",
            str(port),
            "--poll-interval",
            "0.5",
            "--log-level",
            "WARNING",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    consumer: _Consumer | None = None
    try:
        _wait(lambda: _ready(url), 60, "the daemon to be ready")
        checkpoint = table.timeline().latest_completion_time
        say(
            '== a streaming consumer: readStream.format("cowrite") from the earliest commit, in this '
            "process; it runs now and at the end, each time until it has read what is there "
            "(Trigger.AvailableNow), as a scheduled job would"
        )
        consumer = _Consumer(table, work)
        consumer.run(say)
        _demonstrate(table, table_path, work, say)
        say("== an incremental consumer that checkpoints by completion time")
        pulled = cowrite.pull(table, checkpoint)
        say(
            f"   since {checkpoint}: {pulled.rows.num_rows} records from commits {list(pulled.commits)}; "
            f"next checkpoint {pulled.checkpoint}"
        )
        say("== the streaming consumer runs again, from its checkpoint")
        consumer.run(say)
        consumer.check(say)
        say("== what the daemon tells Prometheus")
        metrics = _get(f"{url}/metrics").decode()
        for line in metrics.splitlines():
            if line.startswith(
                (
                    "cowrite_commits_total",
                    "cowrite_write_conflicts_total",
                    "cowrite_rollbacks_total",
                    "cowrite_pending_instants",
                    "cowrite_table_up",
                )
            ):
                say(f"   {line}")
    finally:
        if consumer is not None:
            consumer.stop()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    say(
        f"== the daemon stopped on SIGTERM (exit {daemon.returncode}); the table now holds "
        f"{cowrite.snapshot(table).num_rows} records:"
    )
    for instant in table.timeline():
        operation = (
            table.commit_metadata(instant).operation
            if instant.is_completed and instant.action.writes_data
            else ""
        )
        say(f"   {instant.file_name:<48} {operation}")
    _check_with_hudi_rs(table, say)


def _check_with_hudi_rs(table: cowrite.Table, say: Callable[[str], None]) -> None:
    """Read the table with hudi-rs, Hudi's Rust reader, and say whether it returns exactly cowrite's
    records. It is the one other reader this project verifies; without it installed nothing is claimed."""
    try:
        from hudi import HudiTableBuilder
    except ImportError:
        say("   hudi-rs is not installed: no other reader checked this table.")
        return
    theirs = pa.Table.from_batches(HudiTableBuilder.from_base_uri(table.uri).build().read())
    mine = cowrite.snapshot(table)
    columns = mine.column_names
    if sorted(theirs.select(columns).to_pylist(), key=repr) == sorted(mine.to_pylist(), key=repr):
        say(f"   hudi-rs reads the same {mine.num_rows} records.")
    else:
        say(f"   hudi-rs reads {theirs.num_rows} records, cowrite {mine.num_rows}: the readers disagree.")
        raise SystemExit(1)


def _ready(url: str) -> bool:
    try:
        return json.loads(_get(f"{url}/readyz"))["ready"] is True
    except OSError:
        return False


def _demonstrate(table: cowrite.Table, table_path: str, work: Path, say: Callable[[str], None]) -> None:
    stream = _Stream(table_path, work)
    say(
        "== a streaming ingestion (`cowrite stream`: each file arriving in incoming/ one commit, eu) beside "
        "a backfill rewriting history (us)"
    )
    stream.arrive("eu-0", _rows("eu", range(0, 20), 1))
    ready = work / "stream-paused"
    ingestion = stream.start_held(ready)
    backfill = _spark_write(
        table_path, _batch(work, "backfill", _rows("us", range(100, 130), 2)), "insert_overwrite"
    )
    try:
        stream.arrive("eu-1", _rows("eu", range(20, 40), 1))
        stream.arrive("eu-2", _rows("eu", range(40, 50), 1))
        _wait(lambda: ready.exists() or ingestion.poll() is not None, 180, "the stream's first commit")
        if not ready.exists():
            raise RuntimeError(f"the stream exited {ingestion.returncode} before its first commit")
    finally:
        os.killpg(ingestion.pid, signal.SIGKILL)  # its JVM is in its process group
        ingestion.wait()
    instant = json.loads(ready.read_text())["instant"]
    say(
        f"   stream     killed with SIGKILL (its JVM too) right after commit {instant} landed, before Spark "
        f"recorded its micro-batch; it held the table lock, which expires with its heartbeat"
    )
    say(f"   backfill   {_outcome(backfill)}")
    say(
        "== a correction job fixes eu records the stream wrote while the stream restarts from its checkpoint "
        "(--once: the files waiting, then exit); both write the eu file group: the first to commit wins"
    )
    release = work / "release-correction"
    correction = _spark_write(
        table_path, _batch(work, "fix", _rows("eu", range(0, 5), 3)), hold_until=release
    )
    before = table.timeline().requested_times
    _wait(
        lambda: bool(table.timeline().pending().requested_times - before), 120, "the correction job to begin"
    )
    for line in stream.once():
        say(f"   stream     {line}")
    release.touch()
    say(f"   correction {_outcome(correction)}   (3 = write conflict; nothing of it is visible)")

    say("== a writer is killed with SIGKILL mid-write; the daemon rolls it back once its heartbeat is stale")
    doomed = _spark_write(
        table_path, _batch(work, "doomed", _rows("apac", range(200, 230), 1)), hold_until=work / "never"
    )
    apac = Path(table_path) / "apac"  # the demo's table is on local disk
    _wait(lambda: any(apac.glob("*.parquet")), 120, "the writer's files")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    visible = cowrite.snapshot(table).column("region").to_pylist().count("apac")
    say(f"   killed; files it left: {len(list(apac.glob('*.parquet')))}, records of it visible: {visible}")
    _wait(lambda: not any(apac.glob("*.parquet")), 60, "the daemon's rollback")
    rollbacks = [i.file_name for i in cowrite.timeline(table) if i.action == "rollback"]
    say(f"   the daemon rolled it back (and the aborted correction before it): {rollbacks}; files left: 0")


class _Stream:
    """The ingestion: ``cowrite stream`` on the table, the directory its files arrive in, its checkpoint."""

    def __init__(self, table_path: str, work: Path) -> None:
        self.table_path = table_path
        self.incoming = work / "incoming"
        self.incoming.mkdir()
        self.checkpoint = work / "stream-checkpoint"
        self.arrived = 0

    def arrive(self, name: str, rows: list[dict[str, object]]) -> None:
        """A file arriving: written under a hidden name (the stream skips those), then renamed into place,
        a second later than the one before by its modification time, so that the stream takes the files
        in the order they arrived whatever the clock's resolution."""
        hidden = self.incoming / f".{name}.jsonl"
        hidden.write_text("".join(json.dumps(row) + "\n" for row in rows))
        stamp = time.time() - 3600 + self.arrived
        os.utime(hidden, (stamp, stamp))
        hidden.rename(self.incoming / f"{name}.jsonl")
        self.arrived += 1

    def args(self, *more: str) -> list[str]:
        where = ["--input", str(self.incoming), "--checkpoint", str(self.checkpoint)]
        return [self.table_path, *where, *_SPARK, *more]

    def start_held(self, ready: Path) -> subprocess.Popen[bytes]:
        """The stream, running until killed: it stops itself at its first commit (:mod:`cowrite.held`)."""
        return subprocess.Popen(
            [sys.executable, "-m", "cowrite.held", "published", str(ready), "stream", *self.args()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # SIGKILL reaches its JVM through the group
        )

    def once(self) -> list[str]:
        """Run the stream until it wrote what is waiting; its lines, and its error if it failed."""
        done = subprocess.run([*_COWRITE, "stream", *self.args("--once")], capture_output=True, text=True)
        lines = done.stdout.splitlines()
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.strip()]
            lines.append(f"exit {done.returncode}: {errors[-1] if errors else ''}")
        return lines


class _Consumer:
    """A streaming consumer of the table in this process: ``readStream.format("cowrite")`` from the earliest
    commit, run now and then from its checkpoint until it has read what is there
    (``Trigger.AvailableNow``). It counts the records of each commit it receives, per micro-batch."""

    def __init__(self, table: cowrite.Table, work: Path) -> None:
        from cowrite.spark import command, register

        settings = {"spark.app.name": "cowrite demo consumer", "spark.ui.enabled": "false"}
        self.spark: Any = command.session("local[1]", settings)[0]
        self.spark.sparkContext.setLogLevel("ERROR")
        register(self.spark)
        self.table = table
        self.checkpoint = work / "consumer-checkpoint"
        self.received: list[tuple[int, str, int]] = []  # micro-batch, commit (requested time), records

    def run(self, say: Callable[[str], None]) -> None:
        from cowrite.spark import options as spark_keys

        def each_batch(frame: Any, batch: int) -> None:
            counts = frame.groupBy("_hoodie_commit_time").count().collect()
            self.received.extend((batch, str(commit), int(records)) for commit, records in counts)

        before = len(self.received)
        query = (
            self.spark.readStream.format("cowrite")
            .option(spark_keys.START_OFFSET.key, spark_keys.EARLIEST)
            .load(self.table.uri)
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        new = self.received[before:]
        say(f"   consumer read {_counted(len(new), 'commit')}, {sum(n for _, _, n in new)} records")

    def check(self, say: Callable[[str], None]) -> None:
        """Say what the consumer read in all; "exactly once" only if every completed data commit on the
        timeline came in one micro-batch with as many records as it wrote (its write stats' inserts and
        updates), and nothing else came. Exits 1 otherwise."""
        written = {
            commit.requested_time: sum(
                s.num_inserts + s.num_update_writes for s in self.table.commit_metadata(commit).write_stats
            )
            for commit in self.table.timeline().data_commits()
        }
        # A micro-batch reads the newest version of each record its commits wrote: a commit whose record a
        # later commit of the same batch updated would count one less. The demo's runs are placed so that
        # none does (the first reads the history alone, which the backfill then rewrites; the commits after
        # it write keys of their own).
        read = {commit: records for _, commit, records in self.received}
        batches = len({batch for batch, _, _ in self.received})  # Spark numbers them across runs
        if len(read) == len(self.received) and read == written:
            say(
                f"   in all it read {_counted(len(read), 'commit')}, {sum(read.values())} records, in "
                f"{_counted(batches, 'micro-batch')}: every data commit on the timeline exactly once, with "
                "every record it wrote"
            )
        else:
            say(f"   it read {sorted(self.received)}; the timeline's commits wrote {sorted(written.items())}")
            raise SystemExit(1)

    def stop(self) -> None:
        self.spark.stop()


def _counted(count: int, thing: str) -> str:
    return f"{count} {thing}" + ("" if count == 1 else "es" if thing.endswith("h") else "s")
