"""Commits on an object store with real round trips: cowrite vs delta-rs on one S3 server, in one run.

    .venv/bin/python -m bench.objectstore                     # 1, 2, 4, 8 writers x 8 commits, 20 ms
    .venv/bin/python -m bench.objectstore --delay 0.05 --writers 8 --commits 16
    .venv/bin/python -m bench.objectstore --history 100,10000 # + requests per commit over a long history

The S3 server is the tests' moto server on 127.0.0.1; every request reaches it through
:class:`bench.proxy.DelayingProxy`, which holds it ``--delay`` seconds as a network would and notes who
signed it: each writer process signs with an access key of its own, so every request is charged to its
writer. Writers are processes of their own that start together once all have opened the table.

Workloads (those of ``bench/commit_throughput.py``, 100-row upserts):

- ``disjoint``: writer ``i`` upserts its 100 keys of partition ``p<i>`` again and again; no commit may
  fail, so every failure is a *spurious abort*;
- ``overlap``: every writer upserts its own keys into one shared file group; conflicts are expected;
- ``apart``: the disjoint workload with a table of its own per writer, in the same bucket: no lock, no
  rival's commit to check, so its commits/s is the ceiling of any commit protocol for ``disjoint`` on
  this server and these cores;
- ``sequencer``, ``turns`` and ``channel`` (``--ceilings``, at the largest writer count): not cowrite but
  the yardsticks of :mod:`bench.ceilings`, the disjoint workload with only the requests every commit needs
  and completed files created one after another, published by a thread that never hands the job on, by the
  writers taking turns, or by that thread reached over a connection rather than through the store: what the
  order of a commit's files allows on this server and these cores;
- ``delta-rs``: the disjoint workload as ``write_deltalake(mode="append")`` into one Delta table on the
  same server, behind the same proxy (conditional PUTs; a conflicting append is retried by delta-rs);
- ``history`` (``--history``): the disjoint workload at the largest writer count on tables that already
  hold that many completed instants, as the daemon's archival leaves them (the newest
  ``hoodie.keep.min.commits`` on the active timeline, the rest archived); ``--active-history``: all of
  them on the active timeline, as on a table whose archival never ran (moto lists a prefix by walking
  the whole bucket, so at thousands of instants its listings, not the round trips, set the time).

Per configuration it prints commits/s (commits over the wall time from the common start to the last writer's
end), p50/p99 latency of a write call, spurious aborts and conflicts; requests per commit by kind; and the
round trips a write call makes **one after another** (the longest chain of its requests in which each starts
after the previous one was answered), in the whole call and inside the table lock's critical section (from the
lock's acquisition to the end of its release). Then the S3 server's own time a commit by kind of request (it
answers one request at a time, so this bounds commits/s however short the round trips); the CPU a commit took
of the writers, the server and the proxy, which share the machine's cores, and the commits/s at which those
cores would be busy all the time; where the lock's turns go at two writers or more (:mod:`bench.lock_turns`),
and where a write call's time goes, part by part, for commits published in their writer's own turn and for
those handed over (:mod:`bench.commit_phases`); the ratio to delta-rs and the targets of the object-storage
issue. A benchmark, not a test: it exits 0 unless a writer crashed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench.bucket import cowrite_options, delta_options, s3_server
from bench.ceilings import YARDSTICKS
from bench.commit_phases import Phases, Seen, phases, watcher
from bench.commit_throughput import ROWS, WriterResult, batch, run_writers, timed_writes
from bench.lock_turns import Turns, lock_turns
from bench.proxy import DelayingProxy, Request, sequential
from cowrite.protocol.locks.lock_files import is_release

# The object-storage issue's targets at 20 ms per request, disjoint upserts
# The environment variable that tells writer processes how long to hold an exchange with a standing turn of
# the lock (cowrite.protocol.locks.handover): as long as the proxy holds a request to the store.
HANDOVER_HELD = "BENCH_HANDOVER_HELD"
TARGET_RATIO_TOP = 5.0  # x delta-rs commits/s at the largest writer count
TARGET_RATIO_ONE = 2.0  # x delta-rs commits/s at 1 writer
TARGET_P99_S = 2.0
TARGET_REQUESTS = 15.0
TARGET_FLAT = 1.1  # requests a commit "flat": at most a tenth more with more writers or a longer history


# -- workers ---------------------------------------------------------------------------------------


@dataclass
class Windows:
    """When each write call ran, when the writer held the table lock, and when its process saw the protocol's
    steps (time.time())."""

    calls: list[tuple[float, float]] = field(default_factory=list)
    held: list[tuple[float, float]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)  # the protocol's steps its process saw


def time_lock_holds(held: list[tuple[float, float]]) -> None:
    """Record, in this process, each span from a lock's acquisition to the end of its release."""
    import cowrite.protocol.transaction as transaction

    make = transaction.lock_for

    def timed(*args: Any, **kwargs: Any) -> Any:
        lock = make(*args, **kwargs)
        acquire, acquire_next, release = lock.acquire, lock.acquire_next, lock.release
        taken: list[float] = []

        def timed_acquire(timeout: float | None = None) -> None:
            acquire(timeout)
            taken.append(time.time())

        def timed_acquire_next(turn: int | None) -> bool:
            began = time.time()
            if acquired := acquire_next(turn):
                taken.append(began)  # its one try is its acquisition: counted inside
            return acquired

        def timed_release() -> None:
            release()
            if taken:  # a release after an abort may find nothing held
                held.append((taken.pop(), time.time()))

        lock.acquire, lock.acquire_next, lock.release = timed_acquire, timed_acquire_next, timed_release
        return lock

    transaction.lock_for = timed


def windowed(write: Callable[[Any], object], windows: Windows) -> Callable[[Any], object]:
    def timed(data: Any) -> object:
        began = time.time()
        try:
            return write(data)
        finally:
            windows.calls.append((began, time.time()))

    return timed


def cowrite_worker(
    uri: str, endpoint: str, index: int, commits: int, mode: str, ready: Any, go: Any, results: Any
) -> None:
    result, windows = WriterResult(), Windows()
    try:
        from cowrite.errors import WriteConflictError
        from cowrite.format.table import Table
        from cowrite.local.writer import LocalWriter
        from cowrite.protocol.locks import handover
        from cowrite.steps import observe

        handover.LATENCY = float(os.environ[HANDOVER_HELD])  # a connection between hosts, as the proxy's

        table = Table.load(writer_table(uri, mode, index), **cowrite_options(endpoint, f"cowrite{index}"))
        time_lock_holds(windows.held)
        writer = LocalWriter(table)
        partition = "shared" if mode == "overlap" else f"p{index}"
        batches = [batch(index, partition, b) for b in range(commits)]
        ready.put(index)
        go.wait()
        with observe(watcher(windows.seen)):
            timed_writes(result, batches, windowed(writer.upsert, windows), (WriteConflictError,))
    except BaseException:
        result.errors["crash: " + traceback.format_exc().strip().splitlines()[-1]] += 1
        ready.put(index)
    results.put((index, result, windows))


def delta_worker(
    uri: str, endpoint: str, index: int, commits: int, mode: str, ready: Any, go: Any, results: Any
) -> None:
    result, windows = WriterResult(), Windows()
    try:
        from deltalake import write_deltalake

        options = delta_options(endpoint, f"delta-rs{index}")
        batches = [batch(index, f"p{index}", b) for b in range(commits)]
        ready.put(index)
        go.wait()
        append = partial(write_deltalake, uri, mode="append", partition_by=["part"], storage_options=options)
        timed_writes(result, batches, windowed(append, windows))
    except BaseException:
        result.errors["crash: " + traceback.format_exc().strip().splitlines()[-1]] += 1
        ready.put(index)
    results.put((index, result, windows))


# -- round trips -----------------------------------------------------------------------------------


def inside(requests: list[Request], window: tuple[float, float]) -> list[Request]:
    return [r for r in requests if window[0] <= r.began and r.ended <= window[1]]


def lock_hold(mine: list[Request], held: tuple[float, float]) -> list[Request]:
    """A writer's requests while it held the lock: those made from its acquisition until ``release()``
    returned, and the release itself, which cowrite makes in the background on an object store."""
    taken, returned = held
    made = inside(mine, held)
    ended = [r for r in mine if r.kind == "PUT" and is_release(r.path.rsplit("/", 1)[-1])]
    releases = [r for r in ended if taken <= r.began]  # a .released file or the turn's note
    release = min(releases, key=lambda r: r.began, default=None)
    return made if release is None or release in made else [*made, release]


@dataclass
class Summary:
    engine: str
    mode: str
    writers: int
    result: WriterResult
    seconds: float
    requests: Counter[str]  # by kind, every request of the run
    chains: list[int]  # sequential round trips per write call
    last_call: list[Request]  # writer 0's last write call
    locked: list[int]  # sequential round trips per lock hold
    locked_requests: list[int]  # requests per lock hold
    server: Counter[str]  # seconds the S3 server spent on the run's requests, by kind
    cpu: dict[str, float]  # CPU seconds of the run: the writers' (over their calls), server's, proxy's
    turns: Turns  # the lock's turns, part by part
    phases: Phases  # where the write calls' time went, part by part

    @property
    def rate(self) -> float:
        return self.result.commits / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.result.latencies) or [float("nan")]
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    @property
    def per_commit(self) -> float:
        return sum(self.requests.values()) / max(1, self.result.commits)

    @property
    def spurious(self) -> int | str:
        return "-" if self.mode == "overlap" else self.result.conflicts + sum(self.result.errors.values())


def run(
    engine: str, mode: str, writers: int, commits: int, uri: str, proxy: DelayingProxy, server: Any
) -> Summary:
    target = {"cowrite": cowrite_worker, "delta-rs": delta_worker, **YARDSTICKS}[engine]
    before: list[Any] = []

    def start() -> None:  # the writers' start-up is not counted
        proxy.reset()
        before.extend((server.busy(), server.cpu(), proxy.cpu()))

    collected = {
        i: (r, w or Windows())  # the yardsticks time no lock
        for i, r, w in run_writers(
            target,
            writers,
            lambda i, ready, go, results: (uri, proxy.endpoint_url, i, commits, mode, ready, go, results),
            before_go=start,
        )
    }
    requests = proxy.requests()
    counts = proxy.reset()
    busy_before, server_cpu, proxy_cpu = before
    busy = server.busy() - busy_before
    cpu = {"S3 server": server.cpu() - server_cpu, "proxy": proxy.cpu() - proxy_cpu}
    merged = WriterResult()
    chains, locked, locked_requests = [], [], []
    for i, (part, windows) in collected.items():
        merged.commits += part.commits
        merged.conflicts += part.conflicts
        merged.errors.update(part.errors)
        merged.latencies.extend(part.latencies)
        mine = [r for r in requests if r.client == f"{engine}{i}"]
        chains += [sequential(inside(mine, window)) for window in windows.calls]
        for window in windows.held:
            held = lock_hold(mine, window)
            locked.append(sequential(held))
            locked_requests.append(len(held))
    parts = [part for part, _ in collected.values()]
    started = min((p.started for p in parts if p.started), default=0.0)
    ended = max(p.ended for p in parts)
    first = [r for r in requests if r.client == f"{engine}0"]
    last_call = inside(first, collected[0][1].calls[-1]) if collected[0][1].calls else []
    cpu = {"writers": sum(part.cpu for part in parts)} | cpu
    return Summary(engine, mode, writers, merged, max(0.0, ended - started), counts, chains, last_call,
                   locked, locked_requests, busy, cpu, lock_turns(requests),
                   phases([(w.calls, w.seen) for _, w in collected.values()]))


# -- tables ----------------------------------------------------------------------------------------


def writer_table(uri: str, mode: str, index: int) -> str:
    """The table writer ``index`` writes: ``uri``, or in the ``apart`` workload one of its own."""
    return f"{uri}-{index}" if mode == "apart" else uri


def create_cowrite_table(server: Any, uri: str, mode: str, writers: int, history: History | None) -> None:
    import pyarrow as pa

    from cowrite.format.table import Table
    from cowrite.local.writer import LocalWriter

    options = cowrite_options(server.endpoint_url, "setup")
    tables = [
        Table.create(at, name="bench", record_key_fields=["id"], partition_fields=["part"],
                     ordering_fields=["ts"], storage_options=options)
        for at in sorted({writer_table(uri, mode, i) for i in range(writers)})
    ]
    table = tables[0]
    if mode == "overlap":  # one file group holding every writer's keys
        LocalWriter(table).insert(pa.concat_tables([batch(i, "shared", -1) for i in range(writers)]))
    if history:
        add_history(server, table, history)


@dataclass(frozen=True)
class History:
    """A table's past: ``instants`` completed commits, all on the active timeline or, ``archived``, as the
    daemon's archival leaves them (the newest ``hoodie.keep.min.commits`` active, the rest archived)."""

    instants: int
    archived: bool

    def __str__(self) -> str:
        return f"history {self.instants} {'archived' if self.archived else 'active'}"


def add_history(server: Any, table: Any, history: History) -> None:
    """``history.instants`` completed commits before now, each with its requested and inflight files, copied
    from one real commit of partition ``history``, stored into the server at once (10,000 instants are
    30,000 files)."""
    from cowrite.format.config import LOCK_STANDING_MS
    from cowrite.format.instant import Instant, State, from_millis
    from cowrite.local.writer import LocalWriter
    from cowrite.protocol.transaction import WriteOptions

    # no turn stands after it: the lock directory is copied at once, to be archived on local disk
    alone = WriteOptions(config=table.config.with_values({LOCK_STANDING_MS.key: "0"}))
    seed = LocalWriter(table, alone).insert(batch(-1, "history", 0))
    payload = table.storage.read(table.instant_path(seed))
    start = int(time.time() * 1000) - 10 * history.instants - 60_000
    files = {}
    for n in range(history.instants):
        requested = Instant(from_millis(start + 10 * n), seed.action, State.REQUESTED)
        completed = requested.transition(State.COMPLETED, from_millis(start + 10 * n + 5))
        files |= {table.instant_path(requested): b"",
                  table.instant_path(requested.transition(State.INFLIGHT)): payload,
                  table.instant_path(completed): payload}
    if history.archived:
        files = archived(table, files)
    bucket, _, prefix = table.uri.split("://", 1)[1].partition("/")
    server.load(bucket, {f"{prefix}/{path}": data for path, data in files.items()})


def archived(table: Any, files: dict[str, bytes]) -> dict[str, bytes]:
    """The ``.hoodie`` files the table's archiver leaves of ``files`` added to its timeline: it runs on a
    copy on local disk, where moving 10,000 instants out takes seconds rather than 60,000 requests."""
    import tempfile

    from cowrite.cleaner import archive, service_lock
    from cowrite.format.table import Table

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch)
        present = {info.path: table.storage.read(info.path) for info in table.storage.walk_files(".hoodie")}
        for path, data in (present | files).items():
            (copy / path).parent.mkdir(parents=True, exist_ok=True)
            (copy / path).write_bytes(data)
        local = Table.load(str(copy))
        while archive(local, service_lock(local)):
            pass
        kept = (p for p in (copy / ".hoodie").rglob("*") if p.is_file())
        return {str(p.relative_to(copy)): p.read_bytes() for p in kept}


# -- reporting -------------------------------------------------------------------------------------

KINDS = ("GET", "LIST", "HEAD", "PUT", "POST", "DELETE")
HEADER = (f"{'engine':<9} {'workload':<22} {'writers':>7} {'commits/s':>9} {'p50 s':>6} {'p99 s':>6} "
          f"{'commits':>7} {'conflicts':>9} {'spurious':>8} {'req/commit':>10}  "
          f"{' / '.join(KINDS)}  {'sequential p50/max':>18}  {'in lock p50/max (req)':>21}  errors")


def _median(values: list[int]) -> str:
    return f"{statistics.median(values):.0f}/{max(values)}" if values else "-"


def line(s: Summary) -> str:
    commits = max(1, s.result.commits)
    kinds = " / ".join(f"{s.requests[k] / commits:.1f}" for k in KINDS)
    lock = f"{_median(s.locked)} ({statistics.fmean(s.locked_requests):.1f})" if s.locked else "-"
    errors = ", ".join(f"{k}: {v}" for k, v in s.result.errors.items()) or "-"
    return (f"{s.engine:<9} {s.mode:<22} {s.writers:>7} {s.rate:>9.2f} {s.percentile(0.5):>6.2f} "
            f"{s.percentile(0.99):>6.2f} {s.result.commits:>7} {s.result.conflicts:>9} {str(s.spurious):>8} "
            f"{s.per_commit:>10.1f}  {kinds}  {_median(s.chains):>18}  {lock:>21}  {errors}")


def server_time(s: Summary) -> str:
    """The server's time a commit, in all and by kind of request, the largest first."""
    commits = max(1, s.result.commits)
    kinds = ", ".join(f"{kind} {seconds / commits * 1000:.1f}" for kind, seconds in s.server.most_common())
    return f"{s.server.total() / commits * 1000:.0f} = {kinds}"


def cpu_time(s: Summary) -> str:
    """The CPU a commit took, of the writers, the server and the proxy, and the commits/s at which the
    machine's cores would be busy all the time: the ceiling where all three share them."""
    commits = max(1, s.result.commits)
    total = sum(s.cpu.values()) / commits
    parts = ", ".join(f"{part} {seconds / commits * 1000:.0f}" for part, seconds in s.cpu.items())
    ceiling = mp.cpu_count() / total if total else float("nan")
    return (f"{total * 1000:.0f} = {parts}; the {mp.cpu_count()} cores allow {ceiling:.1f} commits/s, "
            f"it made {s.rate:.2f} ({s.rate / ceiling:.0%})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.02, help="seconds each request is held (0.02)")
    parser.add_argument("--writers", default="1,2,4,8", help="comma-separated writer counts")
    parser.add_argument("--commits", type=int, default=8, help="commits per writer (8)")
    parser.add_argument("--workloads", default="disjoint,overlap", help="cowrite workloads to run")
    parser.add_argument("--history", default="", help="comma-separated archived histories, e.g. 100,10000")
    parser.add_argument("--active-history", default="", help="the same, all on the active timeline")
    parser.add_argument("--no-delta", action="store_true", help="skip delta-rs")
    parser.add_argument("--ceilings", action="store_true",
                        help="+ the yardsticks of bench/ceilings.py at the largest writer count")
    parser.add_argument("--trace", action="store_true", help="print the requests of writer 0's last call")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.writers.split(",")]
    histories = [History(int(n), archived=True) for n in args.history.split(",") if n]
    histories += [History(int(n), archived=False) for n in args.active_history.split(",") if n]
    summaries: list[Summary] = []
    os.environ[HANDOVER_HELD] = str(args.delay)  # for the writer processes
    with s3_server() as server, DelayingProxy(server.endpoint_url, delay=args.delay, trace=True) as proxy:
        print(f"{args.commits} commits of {ROWS} rows per writer; {args.delay * 1000:.0f} ms per request; "
              f"{mp.cpu_count()} CPUs")
        print(HEADER)

        def measure(engine: str, mode: str, writers: int, name: str, history: History | None = None) -> None:
            # A bucket of its own: moto lists a prefix by walking the whole bucket under the server's one
            # lock, so the tables of earlier configurations would slow every listing of this one.
            server.create_bucket(name)
            uri = f"s3://{name}/table"
            if engine == "cowrite":  # made directly on the server: the setup's requests are not timed
                create_cowrite_table(server, uri, mode, writers, history)
            summary = run(engine, mode, writers, args.commits, uri, proxy, server)
            if history:
                summary.mode = str(history)
            summaries.append(summary)
            print(line(summary), flush=True)
            if args.trace:
                origin = min((r.began for r in summary.last_call), default=0.0)
                for r in sorted(summary.last_call, key=lambda r: r.began):
                    print(f"    {(r.began - origin) * 1000:7.1f} {(r.ended - origin) * 1000:7.1f} ms  "
                          f"{r.kind:<6} {r.path}")

        for mode in args.workloads.split(","):
            for writers in counts:
                measure("cowrite", mode, writers, f"{mode}-{writers}")
        if args.ceilings:
            for yardstick in YARDSTICKS:
                measure(yardstick, "disjoint", max(counts), f"{yardstick}-{max(counts)}")
        if not args.no_delta:
            for writers in counts:
                measure("delta-rs", "disjoint", writers, f"delta-{writers}")
        for history in histories:
            measure("cowrite", "disjoint", max(counts), str(history).replace(" ", "-"), history)

    print("\nthe S3 server's own time a commit, ms (it answers one request at a time):")
    for s in summaries:
        print(f"  {s.engine} {s.mode} {s.writers}: {server_time(s)}")
    print("\nCPU a commit, ms (the writers over their calls, the S3 server and the proxy share the cores):")
    for s in summaries:
        print(f"  {s.engine} {s.mode} {s.writers}: {cpu_time(s)}")
    # the runs of writers sharing one lock (apart: a lock per table)
    shared = [s for s in summaries if s.engine == "cowrite" and s.writers > 1 and s.mode != "apart"]
    print("\nthe lock's turns, from one holder's create to the next one's (bench/lock_turns.py):")
    for s in shared:
        print(f"  {s.mode} {s.writers}: {s.turns.describe()}")
    print("\nwhere a write call's time goes, median ms (bench/commit_phases.py):")
    for s in shared:
        for kind in s.phases.describe():
            print(f"  {s.mode} {s.writers}, {kind}")

    by_key = {(s.engine, s.mode, s.writers): s for s in summaries}
    if not args.no_delta and "disjoint" in args.workloads:
        print("\ncowrite / delta-rs, commits/s (disjoint):")
        for writers in counts:
            ours, theirs = by_key[("cowrite", "disjoint", writers)], by_key[("delta-rs", "disjoint", writers)]
            print(f"  {writers} writers: {ours.rate:.2f} / {theirs.rate:.2f} = "
                  f"{ours.rate / theirs.rate if theirs.rate else float('nan'):.2f}")
        top, one = max(counts), min(counts)
        ours, theirs = by_key[("cowrite", "disjoint", top)], by_key[("delta-rs", "disjoint", top)]
        ceiling = by_key.get(("cowrite", "apart", top))
        if ceiling is not None and theirs.rate and ceiling.rate:
            print(f"  {top} writers, each on a table of its own (the ceiling of any commit protocol here): "
                  f"{ceiling.rate:.2f} / {theirs.rate:.2f} = {ceiling.rate / theirs.rate:.2f}; "
                  f"sharing one table / each on its own: {ours.rate / ceiling.rate:.2f}")
        for yardstick in YARDSTICKS:
            if (bound := by_key.get((yardstick, "disjoint", top))) is not None and theirs.rate:
                print(f"  {top} writers, the {yardstick} yardstick (bench/ceilings.py): {bound.rate:.2f} / "
                      f"{theirs.rate:.2f} = {bound.rate / theirs.rate:.2f}; "
                      f"cowrite / it: {ours.rate / bound.rate:.2f}")
        ratio_met = ours.rate >= TARGET_RATIO_TOP * theirs.rate
        checks = [
            (f"{top} writers >= {TARGET_RATIO_TOP:.0f}x delta-rs", ratio_met),
            (f"{top} writers p99 <= {TARGET_P99_S:.0f} s", ours.percentile(0.99) <= TARGET_P99_S),
            (f"{top} writers <= {TARGET_REQUESTS:.0f} requests a commit", ours.per_commit <= TARGET_REQUESTS),
            (f"{top} writers no spurious abort", ours.spurious == 0),
        ]
        if one == 1:
            mine, peer = by_key[("cowrite", "disjoint", 1)], by_key[("delta-rs", "disjoint", 1)]
            met = mine.rate >= TARGET_RATIO_ONE * peer.rate
            checks.append((f"1 writer >= {TARGET_RATIO_ONE:.0f}x delta-rs", met))
        alone = by_key[("cowrite", "disjoint", one)]
        flat = [(f"from {one} to {top} writers", alone, ours)] if top > one else []
        flat += [(f"with {s.mode}", ours, s) for s in summaries if s.mode.startswith("history")]
        for label, base, more in flat:
            grew = more.per_commit / base.per_commit
            shown = f"{base.per_commit:.1f} to {more.per_commit:.1f}, {grew:.2f}x"
            checks.append((f"requests a commit flat {label} ({shown})", grew <= TARGET_FLAT))
        print("\ntargets (object-storage issue, at 20 ms per request):")
        for label, met in checks:
            print(f"  {label}: {'met' if met else 'MISSED'}")
    crashed = [s for s in summaries if any(k.startswith("crash") for k in s.result.errors)]
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
