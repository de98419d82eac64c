"""The daemon: how fast it recovers from dead writers and lock holders, and what following many tables costs.

    .venv/bin/python bench/daemon.py            # 7 trials of each death; 10 tables x 10,000 instants, 20 s;
                                                # 100 tables x 1,000 instants on S3 (20 ms a request)
    .venv/bin/python bench/daemon.py --quick    # 3 trials; 10 tables x 1,000 instants, 10 s; 5 x 100 on S3
    .venv/bin/python bench/daemon.py --part recovery|following|s3

**Recovery.** One local table served by a ``python -m cowrite daemon`` process (heartbeat 1 s x 2 misses,
poll every 0.25 s). A trial starts a process that either begins a write (``.requested`` + ``.inflight``,
heartbeat renewed every second) or takes the table lock for an instant whose heartbeat it renews, kills it
with SIGKILL at a random phase of its heartbeat, and measures from the kill until the daemon has rolled the
write back (completed ``.rollback``, the instant's files gone) or written ``lock<id>.released`` (reason
``expired``). The protocol bounds that time by ``[tolerance - interval, tolerance + poll]`` plus the work.

**Following.** Ten local tables, each with a synthetic but valid timeline of N completed commits (requested,
inflight and an Avro commit file with one write stat each, written straight to disk), served by one
daemon process (default poll interval 5 s). It measures the time until ``/readyz`` answers 200 (every table
loaded, the END_COMMIT_TIME log built), then CPU (utime + stime from ``/proc/<pid>/stat``) and RSS
(``VmRSS``/``VmHWM`` from ``/proc/<pid>/status``) while idle and while a committer appends a few commits per
second (round-robin over the tables, through the filesystem lock, with heartbeats: the files a writer's
commit leaves). Then it checks the daemon counted every commit, measures the overlay's freshness (from a
commit's completion until the daemon's watermark, as ``/api/tables/<name>/watermark`` serves it, reached it:
``--rounds`` rounds of a commit per table, each at a moment of chance in the poll cycle), how long SIGTERM
took to drain, and the time to ready of a restart after SIGTERM and of one after SIGKILL.

**On S3** (``--part s3``): the same on tables of the tests' S3 server (moto) behind the delaying proxy
(``--delay`` seconds a request): time to ready, RSS, and the requests an idle poll costs (requests
counted at the proxy over an idle stretch, divided by the polls: its listings of the timelines). Each
table has a bucket of its own, and its history is stored into the server at once rather than PUT by PUT.

Prints figures; asserts nothing. Exits 1 only if the daemon or a trial process failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, State, from_millis
from cowrite.format.overlay import OVERLAY_DIR
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.protocol.heartbeat import Heartbeat, HeartbeatPolicy
from cowrite.protocol.locks import LockHolder
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.protocol.locks.lock_files import LOCK_DIR, read_release

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "row",
        "fields": [{"name": "id", "type": "long"}, {"name": "p", "type": "string"}],
    }
)


# -- the daemon process ------------------------------------------------------------------------------


class DaemonProcess:
    """``python -m cowrite daemon --config FILE``, its HTTP port (announced in its JSON log) and /proc."""

    def __init__(
        self,
        work: Path,
        tables: list[dict[str, Any]],
        poll: float,
        name: str = "daemon",
        env: dict[str, str] | None = None,
        clean: float = 300.0,
    ) -> None:
        lines = ["[server]", "port = 0", "[follow]", f"poll_interval_seconds = {poll}"]
        lines += ["[cleaner]", f"interval_seconds = {clean}", ""]
        for table in tables:
            lines += ["[[tables]]", *(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in table.items()), ""]
        config = work / f"{name}.toml"
        config.write_text("\n".join(lines))
        self.log = work / f"{name}.log"
        self.started = time.monotonic()
        with open(self.log, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cowrite", "daemon", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, **(env or {})},
            )
        self._port: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def lines(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                found.append({"event": line, "level": "unparsed"})
        return found

    @property
    def port(self) -> int:
        while self._port is None:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the daemon exited {self.process.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            for line in self.lines():
                found = re.fullmatch(r"http on [\d.]+:(\d+)", str(line.get("event")))
                if found:
                    self._port = int(found.group(1))
            time.sleep(0.02)
        return self._port

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            body = error.read()
            error.close()
            return error.code, body

    def wait_ready(self, timeout: float) -> float:
        """Seconds from the start of the process until /readyz answered 200."""
        deadline = time.monotonic() + timeout
        while self.get("/readyz")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon was not ready after {timeout} s")
            time.sleep(0.05)
        return time.monotonic() - self.started

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime

    def memory_mb(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MiB."""
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) / 1024
        return values["VmRSS"], values["VmHWM"]

    def metric_sum(self, name: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.get("/metrics")
        assert status == 200
        return sum(
            s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
            if s.name == name
        )

    def terminate(self) -> float:
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        if code != 0:
            raise RuntimeError(f"the daemon exited {code} on SIGTERM:\n{self.log.read_text()[-3000:]}")
        return time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# -- recovery ----------------------------------------------------------------------------------------

_WRITER = """
import sys, time
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.table import Table
from cowrite.protocol.transaction import Transaction, WriteOptions
table = Table.load(sys.argv[1])
options = WriteOptions(config=table.config.with_values(dict(a.split("=", 1) for a in sys.argv[2:])))
transaction = Transaction.begin(table, "insert", options=options)
transaction.plan(CommitMetadata("insert", ()))
print("ready", transaction.instant_time, flush=True)
time.sleep(3600)
"""

_HOLDER = """
import sys, time
from cowrite.protocol.heartbeat import Heartbeat, HeartbeatPolicy
from cowrite.protocol.locks import LockHolder
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.storage.backend import Storage
storage, instant = Storage.for_uri(sys.argv[1]), sys.argv[2]
policy = HeartbeatPolicy(float(sys.argv[3]), int(sys.argv[4]))
Heartbeat(storage, instant, policy).start()
lock = FileSystemLock(storage, LockHolder(instant=instant), policy)
lock.acquire()
print("ready", lock.lock_id, flush=True)
time.sleep(3600)
"""


def _spawn(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    """Start a victim; its word after "ready" (it waits for the heartbeat and its state to be on disk)."""
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().split()
    if len(line) != 2 or line[0] != "ready":
        process.kill()
        raise RuntimeError(f"victim failed to start (exit {process.wait()})")
    return process, line[1]


def _wait(condition: Callable[[], bool], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.005)
    return time.monotonic()


def _kill(process: subprocess.Popen[str], phase: float) -> float:
    time.sleep(phase)  # a random point of the victim's heartbeat cycle
    process.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    process.wait()
    return killed


def _rolled_back(table: Table, instant: str) -> bool:
    names = [info.name for info in table.storage.list(TIMELINE_DIR)]
    if any(name.startswith(instant) for name in names):
        return False
    for name in names:
        parsed = Instant.parse(name)
        if (
            parsed.action is Action.ROLLBACK
            and parsed.is_completed
            and table.rollback_plan(parsed).target == instant
        ):
            return True
    return False


def _is_released(table: Table, lock_id: int) -> bool:
    return _released(table, lock_id) is not None


def _released(table: Table, lock_id: int) -> dict[str, object] | None:
    try:
        return read_release(table.storage, lock_id)
    except FileNotFoundError:
        return None


@dataclass
class Latencies:
    name: str
    seconds: list[float]

    def report(self, tolerance: float, interval: float, poll: float) -> None:
        median = statistics.median(self.seconds)
        print(
            f"  {self.name:<28} median {median:5.2f} s = {median / tolerance:4.2f} x tolerance   "
            f"min {min(self.seconds):5.2f}  max {max(self.seconds):5.2f}  "
            f"(protocol bound {tolerance - interval:.2f}..{tolerance + poll:.2f} s + work)   "
            f"trials: {' '.join(f'{s:.2f}' for s in self.seconds)}"
        )


def recovery(work: Path, trials: int, interval: float, misses: int, poll: float) -> None:
    tolerance = interval * misses
    settings = {
        keys.HEARTBEAT_INTERVAL_MS.key: str(int(interval * 1000)),
        keys.HEARTBEAT_TOLERABLE_MISSES.key: str(misses),
    }
    uri = str(work / "recovery")
    table = Table.create(uri, name="recovery", record_key_fields=["id"], partition_fields=["p"])
    daemon = DaemonProcess(work, [{"uri": uri, "name": "recovery", **settings}], poll, "recovery-daemon")
    print(
        f"\n== recovery: heartbeat {interval} s x {misses} misses = tolerance {tolerance} s, "
        f"daemon poll {poll} s, {trials} trials each"
    )
    chance = random.Random(1)
    writers, holders = (
        Latencies("writer death -> rollback", []),
        Latencies("lock holder death -> release", []),
    )
    try:
        daemon.wait_ready(60)
        for _ in range(trials):
            process, instant = _spawn(_WRITER, uri, *(f"{k}={v}" for k, v in settings.items()))
            killed = _kill(process, chance.uniform(0, interval))
            writers.seconds.append(_wait(partial(_rolled_back, table, instant), 60) - killed)

            holder_instant = from_millis(int(time.time() * 1000))
            process, word = _spawn(_HOLDER, uri, holder_instant, str(interval), str(misses))
            killed = _kill(process, chance.uniform(0, interval))
            lock_id = int(word)
            done = _wait(partial(_is_released, table, lock_id), 60)
            release = _released(table, lock_id) or {}
            if release.get("reason") != "expired" or not str(release.get("owner")).startswith(
                "cowrite-daemon"
            ):
                raise RuntimeError(f"lock{lock_id} was released unexpectedly: {release}")
            holders.seconds.append(done - killed)
        writers.report(tolerance, interval, poll)
        holders.report(tolerance, interval, poll)
        rollbacks, expiries = (
            daemon.metric_sum("cowrite_rollbacks_total"),
            daemon.metric_sum("cowrite_lock_expiries_total"),
        )
        print(
            f"  daemon counted {rollbacks:.0f} rollbacks and {expiries:.0f} lock expiries "
            f"(expected {trials} each); lock files kept: {len(table.storage.list(LOCK_DIR))}"
        )
        daemon.terminate()
    finally:
        daemon.kill()


# -- following ---------------------------------------------------------------------------------------


def generate(
    uri: str,
    name: str,
    instants: int,
    start_ms: int,
    load: Callable[[dict[str, bytes]], None] | None = None,
    **options: Any,
) -> None:
    """A timeline of ``instants`` completed commits, 10 ms apart, each a new version of one file group.

    On local disk the files are written directly (no fsync, no temporary file: nothing else touches these
    tables yet); on S3 they go to ``load`` (:meth:`S3Server.load`), keyed by their bucket-relative path."""
    table = Table.create(
        uri, name=name, record_key_fields=["id"], partition_fields=["p"], storage_options=options
    )
    file_id = f"{uuid.uuid4()}-0"

    def files(n: int) -> list[tuple[str, bytes]]:
        requested, completed = from_millis(start_ms + 10 * n), from_millis(start_ms + 10 * n + 5)
        previous = from_millis(start_ms + 10 * (n - 1)) if n else "null"
        path = f"p0/{file_id}_0-0-0_{requested}.parquet"
        stat = WriteStat(
            file_id, path, "p0", previous, 100, 100 if n == 0 else 0, 0 if n == 0 else 100, 0, 40_960
        )
        metadata = CommitMetadata("insert" if n == 0 else "upsert", (stat,), schema=SCHEMA).to_bytes(
            Action.COMMIT
        )
        return [
            (f"{requested}.commit.requested", b""),
            (f"{requested}.inflight", metadata),
            (f"{requested}_{completed}.commit", metadata),
        ]

    timeline = [item for n in range(instants) for item in files(n)]
    if load is None:
        directory = Path(table.storage.full_path(TIMELINE_DIR))
        directory.mkdir(parents=True, exist_ok=True)
        for name_, data in timeline:
            (directory / name_).write_bytes(data)
        return
    prefix = uri.split("://", 1)[1].partition("/")[2]
    load({f"{prefix}/{TIMELINE_DIR}/{name_}": data for name_, data in timeline})


def _start(start_ms: int, table: int, instants: int) -> int:
    """Where the ``table``-th timeline starts: after the one before it ends, so that the tables of one daemon
    share no instant names, as real tables don't (shared names would be parsed once for all of them)."""
    return start_ms + table * (10 * instants + 1)


class Committer:
    """Appends commits to a table the way a writer's commit does, minus the data: the requested instant
    taken under the lock, a heartbeat, the plan, the completed commit published under the lock."""

    def __init__(self, uri: str) -> None:
        self.table = Table.load(uri)
        self.policy = HeartbeatPolicy()
        self.last = 0

    def commit(self) -> tuple[str, float]:
        """Append one commit; its completion time, and when (``time.time()``) its completed file was there."""
        storage = self.table.storage
        with FileSystemLock(storage, LockHolder(), self.policy):
            self.last = max(int(time.time() * 1000), self.last + 1)
            requested = Instant(from_millis(self.last), Action.COMMIT, State.REQUESTED)
            assert storage.create_if_absent(self.table.instant_path(requested), b"")
        heartbeat = Heartbeat(storage, requested.requested_time, self.policy)
        heartbeat.renew()
        file_id = f"{uuid.uuid4()}-0"
        stat = WriteStat(
            file_id,
            f"new/{file_id}_0-0-0_{requested.requested_time}.parquet",
            "new",
            "null",
            1,
            1,
            0,
            0,
            4096,
        )
        metadata = CommitMetadata("insert", (stat,), schema=SCHEMA).to_bytes(Action.COMMIT)
        storage.write(self.table.instant_path(requested.transition(State.INFLIGHT)), metadata)
        with FileSystemLock(storage, LockHolder(instant=requested.requested_time), self.policy):
            self.last = max(int(time.time() * 1000), self.last + 1)
            done = requested.transition(State.COMPLETED, from_millis(self.last))
            assert storage.create_if_absent(self.table.instant_path(done), metadata)
            published = time.time()
        heartbeat.stop(delete=True)
        return done.completion_time or "", published


def _measure(
    daemon: DaemonProcess, seconds: float, action: Callable[[], object] | None, rate: float
) -> dict[str, float]:
    cpu, started = daemon.cpu_seconds(), time.monotonic()
    peak_rss, commits = 0.0, 0
    while (elapsed := time.monotonic() - started) < seconds:
        if action is not None and commits < elapsed * rate:
            action()
            commits += 1
        else:
            time.sleep(0.02)
        peak_rss = max(peak_rss, daemon.memory_mb()[0])
    wall = time.monotonic() - started
    return {
        "cpu_percent": 100 * (daemon.cpu_seconds() - cpu) / wall,
        "rss_peak": peak_rss,
        "commits": commits,
        "wall": wall,
    }


def following(
    work: Path, tables: int, instants: int, seconds: float, rate: float, poll: float, rounds: int
) -> None:
    print(f"\n== following: {tables} tables x {instants:,} instants, daemon poll {poll} s")
    started = time.monotonic()
    uris = [str(work / f"table{n}") for n in range(tables)]
    start_ms = int((time.time() - 86_400) * 1000)
    for n, uri in enumerate(uris):
        generate(uri, f"table{n}", instants, _start(start_ms, n, instants))
    files = sum(len(os.listdir(Path(uri) / TIMELINE_DIR)) for uri in uris)
    print(f"  generated {files:,} timeline files in {time.monotonic() - started:.1f} s")

    daemon = DaemonProcess(work, [{"uri": uri, "name": f"table{n}"} for n, uri in enumerate(uris)], poll)
    try:
        ready = daemon.wait_ready(900)
        at_ready = daemon.metric_sum("cowrite_polls_skipped_total")
        rss, hwm = daemon.memory_mb()
        print(
            f"  startup: ready after {ready:.1f} s, {daemon.cpu_seconds():.1f} s CPU; "
            f"RSS {rss:.0f} MiB (peak {hwm:.0f} MiB)"
        )
        overlay = sum(_log_size(uri) for uri in uris) / len(uris)
        print(
            f"  END_COMMIT_TIME log: {overlay / 1e6:.1f} MB per table (its snapshot and the segments after)"
        )

        idle = _measure(daemon, seconds / 2, None, 0)
        print(
            f"  idle, {idle['wall']:.0f} s: CPU {idle['cpu_percent']:.1f} % of a core, "
            f"RSS peak {idle['rss_peak']:.0f} MiB"
        )

        committers = [Committer(uri) for uri in uris]
        turn = iter(range(10**9))
        before = daemon.metric_sum("cowrite_commits_total")
        busy = _measure(daemon, seconds, lambda: committers[next(turn) % tables].commit(), rate)
        print(
            f"  {rate:g} commits/s for {busy['wall']:.0f} s ({busy['commits']:.0f} commits, round-robin): "
            f"CPU {busy['cpu_percent']:.1f} % of a core, RSS peak {busy['rss_peak']:.0f} MiB"
        )
        deadline = time.monotonic() + 3 * poll + 30
        while daemon.metric_sum("cowrite_commits_total") - before < busy["commits"]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        counted = daemon.metric_sum("cowrite_commits_total") - before
        rss, hwm = daemon.memory_mb()
        print(
            f"  daemon counted {counted:.0f} of {busy['commits']:.0f} commits; "
            f"RSS {rss:.0f} MiB (peak {hwm:.0f} MiB)"
        )
        overruns = daemon.metric_sum("cowrite_polls_skipped_total")
        errors = [line for line in daemon.lines() if line.get("level") in ("error", "unparsed")]
        print(
            f"  polls skipped because the previous one still ran: {at_ready:.0f} while starting, "
            f"{overruns - at_ready:.0f} afterwards; error log lines: {len(errors)}"
        )
        fresh = freshness(daemon, committers, rounds, poll)
        print(
            f"  overlay freshness (commit completed -> in the END_COMMIT_TIME log), {len(fresh)} commits: "
            f"p50 {_percentile(fresh, 50):.2f} s, p99 {_percentile(fresh, 99):.2f} s, max {max(fresh):.2f} s"
        )
        print(f"  SIGTERM: drained and exited 0 in {daemon.terminate():.2f} s")
    finally:
        daemon.kill()

    # a restart finds its logs on disk and reads only the commit files they lack
    restarts(work, [{"uri": uri, "name": f"table{n}"} for n, uri in enumerate(uris)], poll, "restart")


def restarts(
    work: Path,
    tables: list[dict[str, Any]],
    poll: float,
    name: str,
    requests: Callable[[], int] | None = None,
    **options: Any,
) -> None:
    """The daemon started again after the SIGTERM that ended the one before, then after a SIGKILL (nothing
    drained): time to ready, CPU, RSS, and the ``requests`` made meanwhile (a counter that resets)."""
    for how in ("SIGTERM", "SIGKILL"):
        if requests is not None:
            requests()
        daemon = DaemonProcess(work, tables, poll, f"{name}-{how}", **options)
        try:
            ready = daemon.wait_ready(3600)
            made = f" ({requests():,} requests)" if requests is not None else ""
            rss, hwm = daemon.memory_mb()
            print(
                f"  restart after {how}: ready after {ready:.1f} s{made}, {daemon.cpu_seconds():.1f} s CPU; "
                f"RSS {rss:.0f} MiB (peak {hwm:.0f} MiB)"
            )
        finally:
            daemon.kill()


def freshness(daemon: DaemonProcess, committers: list[Committer], rounds: int, poll: float) -> list[float]:
    """Seconds from each commit's completion until the daemon's watermark (what its log says, as served on
    /api/tables/<name>/watermark) reached it: ``rounds`` rounds of one commit per table, each at a moment
    of chance in the daemon's poll cycle."""
    chance = random.Random(3)
    delays = []
    for _ in range(rounds):
        time.sleep(chance.uniform(0, poll))
        waiting = {n: committer.commit() for n, committer in enumerate(committers)}
        deadline = time.monotonic() + 10 * poll + 30
        while waiting and time.monotonic() < deadline:
            for n, (completion, published) in list(waiting.items()):
                status, body = daemon.get(f"/api/tables/table{n}/watermark")
                if status == 200 and (json.loads(body)["watermark"] or "") >= completion:
                    delays.append(time.time() - published)
                    del waiting[n]
            time.sleep(0.01)
        if waiting:
            raise RuntimeError(f"commits of tables {sorted(waiting)} never reached the overlay")
    return delays


def _percentile(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * percent / 100))]


def _log_size(uri: str) -> int:
    directory = Path(uri) / OVERLAY_DIR
    return sum(f.stat().st_size for f in directory.iterdir()) if directory.exists() else 0


def following_s3(work: Path, tables: int, instants: int, seconds: float, poll: float, delay: float) -> None:
    """The daemon following tables of the tests' S3 server, each request held ``delay`` seconds by the
    delaying proxy, which counts them: time to ready, RSS, and what an idle poll costs."""
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root), str(root / "tests")]
    from support.servers import S3Server

    from bench.proxy import ProxyProcess

    print(
        f"\n== following on S3: {tables} tables x {instants:,} instants, {delay * 1000:.0f} ms a request, "
        f"daemon poll {poll} s"
    )
    with S3Server() as server, ProxyProcess(server.endpoint_url, delay) as proxy:
        started = time.monotonic()
        # A bucket each: moto lists a prefix by going through every key of its bucket, where S3's cost
        # does not grow with the bucket; one bucket of all the tables made each listing 100 times dearer.
        buckets = [f"cowrite-table-{n}" for n in range(tables)]
        uris = [f"s3://{bucket}/table" for bucket in buckets]
        start_ms = int((time.time() - 86_400) * 1000)
        for n, (bucket, uri) in enumerate(zip(buckets, uris, strict=True)):  # not through the proxy
            server.create_bucket(bucket)
            load = partial(server.load, bucket)
            options = server.storage_options()
            generate(uri, f"table{n}", instants, _start(start_ms, n, instants), load, **options)
        print(f"  generated {3 * instants * tables:,} timeline files in {time.monotonic() - started:.1f} s")
        env = {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url}
        specs = [{"uri": uri, "name": f"table{n}"} for n, uri in enumerate(uris)]
        # No cleaning while it is measured: a cleaning of each of many tables, due once a start has taken
        # longer than the cleaner's interval, would hold the tables' polls meanwhile.
        daemon = DaemonProcess(work, specs, poll, "s3-daemon", env=env, clean=86_400.0)
        try:
            ready = daemon.wait_ready(3600)
            rss, hwm = daemon.memory_mb()
            at_ready = len(proxy.reset())
            print(
                f"  startup: ready after {ready:.1f} s ({at_ready:,} requests), {daemon.cpu_seconds():.1f} s "
                f"CPU; RSS {rss:.0f} MiB (peak {hwm:.0f} MiB)"
            )
            time.sleep(2 * poll)  # every table's second poll is behind it
            proxy.reset()
            time.sleep(seconds)
            requests = proxy.reset()
            polls = sum(r.kind == "LIST" and "%2Ftimeline%2F" in r.path for r in requests)
            kinds = Counter(r.kind for r in requests)
            print(
                f"  idle, {seconds:.0f} s: {len(requests)} requests in {polls} polls "
                f"= {len(requests) / max(polls, 1):.2f} per poll "
                f"({', '.join(f'{k} {n}' for k, n in kinds.items())}; "
                "the lock directory is looked at once per heartbeat interval)"
            )
            print(f"  SIGTERM: drained and exited 0 in {daemon.terminate():.2f} s")
        finally:
            daemon.kill()
        # a restart reads each table's END_COMMIT_TIME log, not its commits
        restarts(work, specs, poll, "s3-restart", lambda: len(proxy.reset()), env=env, clean=86_400.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 trials; 1,000 instants per table; 10 s")
    parser.add_argument("--part", choices=["recovery", "following", "s3"], help="run one part only")
    parser.add_argument("--trials", type=int)
    parser.add_argument("--tables", type=int, help="tables followed (default 10; on S3 100)")
    parser.add_argument("--instants", type=int, help="instants per table (default 10,000; on S3 1,000)")
    parser.add_argument("--rounds", type=int, help="overlay freshness: rounds of one commit per table")
    parser.add_argument("--delay", type=float, default=0.02, help="S3: seconds the proxy holds each request")
    parser.add_argument("--seconds", type=float, help="steady state with commits (idle: half of it)")
    parser.add_argument("--rate", type=float, default=3.0, help="commits per second during the steady state")
    parser.add_argument("--poll", type=float, default=5.0, help="the daemon's poll interval while following")
    parser.add_argument("--keep", action="store_true", help="keep the tables (printed directory)")
    args = parser.parse_args(argv)
    trials = args.trials or (3 if args.quick else 7)
    instants = args.instants or (1_000 if args.quick else 10_000)
    seconds = args.seconds or (10.0 if args.quick else 20.0)
    work = Path(tempfile.mkdtemp(prefix="cowrite-bench-daemon-"))
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; work directory {work}")
    try:
        if args.part in (None, "recovery"):
            recovery(work, trials, interval=1.0, misses=2, poll=0.25)
        if args.part in (None, "following"):
            tables = args.tables or 10
            following(
                work, tables, instants, seconds, args.rate, args.poll, args.rounds or (2 if args.quick else 5)
            )
        if args.part in (None, "s3"):
            tables = args.tables or (5 if args.quick else 100)
            on_s3 = args.instants or (100 if args.quick else 1_000)
            following_s3(work, tables, on_s3, seconds, args.poll, args.delay)
    except RuntimeError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
