"""Commit throughput of concurrent writers on one table: cowrite (filesystem lock, local disk) vs delta-rs.

    .venv/bin/python bench/commit_throughput.py            # 1, 2, 4, 8 writers x 50 commits of 100 rows
    .venv/bin/python bench/commit_throughput.py --quick    # 1, 2, 4, 8 writers x 10 commits
    .venv/bin/python bench/commit_throughput.py --profile  # + a CPU-time profile of one disjoint writer

Each writer is a process of its own (multiprocessing "spawn"); all start together once every one has
imported and opened the table. Workloads:

- ``disjoint``: writer ``i`` upserts the same 100 keys of partition ``p<i>`` again and again: one file
  group of its own, so no commit may fail. Any failure is a *spurious abort* (must be 0).
- ``overlap``: every writer upserts its own 100 keys of one shared partition seeded as a single file group,
  so concurrent commits touch the same file group; write conflicts are expected and counted.
- ``apart`` (the largest writer count only): the disjoint workload with a table of its own per writer:
  what the same processes do on this machine when they share nothing (no lock waits, no one else's
  commits to check), the ceiling for ``disjoint``.
- ``key-check`` / ``no-check`` (the largest writer count, ``--key-check-turns`` turns of each in
  alternation): the disjoint workload with the record-key check on (the default) and off, and the ratio
  of their commits/s turn by turn: what the check costs.
- ``delta-rs``: the disjoint workload as ``write_deltalake(mode="append")`` into one Delta table (if
  ``deltalake`` is importable); failed commits are counted as conflicts.

Per configuration it prints commits/s over the whole run (commits / wall time from the common start to the
last writer's end), p50/p99 latency of one write call in ms (begin + write + commit, conflicts included),
commits, conflicts, spurious aborts, what creating a file beside the tables cost just before (the disk's
price, see ``file_create_us``) and the other errors; then the storage calls per commit cowrite made
(counted in every writer) with the sizes of the listings; and the ratio cowrite/delta-rs in commits/s.
This is a benchmark, not a test: it asserts nothing and exits 0 unless a writer crashed.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

ROWS = 100
TARGET_COMMITS_PER_S = 200.0
TARGET_P99_MS = 100.0


@dataclass
class WriterResult:
    latencies: list[float] = field(default_factory=list)  # seconds per write call
    commits: int = 0
    conflicts: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # other failures by exception type
    started: float = 0.0
    ended: float = 0.0
    cpu: float = 0.0  # CPU seconds of the process (all its threads) over the write calls
    calls: Counter[str] = field(default_factory=Counter)  # storage calls by kind
    call_seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # time in them
    lock_wait: list[float] = field(default_factory=list)  # seconds in TableLock.acquire
    lock_hold: list[float] = field(default_factory=list)  # seconds from acquired to released
    listed: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # dir -> sizes
    profile: str = ""


# -- storage call counting -------------------------------------------------------------------------


def _directory_kind(path: str) -> str:
    for prefix in (".hoodie/timeline", ".hoodie/locks", ".hoodie/.heartbeat"):
        if path.startswith(prefix):
            return prefix
    return "data" if path else "root"


def count_storage_calls(result: WriterResult, kind: type) -> None:
    """Wrap every operation of the storage class ``kind`` (in this process only) to count calls and the
    sizes of listings."""
    from cowrite.storage.backend import Storage

    def wrap(name: str) -> None:
        original = getattr(kind, name)

        def counted(self: Storage, path: str = "", *args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            value = original(self, path, *args, **kwargs)
            kind = _directory_kind(path)
            result.calls[f"{name} {kind}"] += 1
            result.call_seconds[f"{name} {kind}"] += time.perf_counter() - began
            if name in ("list", "names", "watched_names", "walk_files", "list_dirs"):
                result.listed[f"{name} {kind}"].append(len(value))
            return value

        setattr(kind, name, counted)

    for name in ("read", "write", "create_if_absent", "list", "names", "watched_names", "list_dirs",
                 "walk_files", "stat", "exists", "delete", "open_input", "open_output"):
        wrap(name)


def time_lock(result: WriterResult) -> None:
    """Record how long each acquire of the filesystem lock waited and how long the lock was held."""
    from cowrite.protocol.locks.filesystem import FileSystemLock

    acquire, release = FileSystemLock.acquire, FileSystemLock.release
    taken: dict[int, float] = {}

    def timed_acquire(self: FileSystemLock, timeout: float | None = None) -> None:
        began = time.perf_counter()
        acquire(self, timeout)
        now = time.perf_counter()
        result.lock_wait.append(now - began)
        taken[id(self)] = now

    def timed_release(self: FileSystemLock) -> None:
        began = taken.pop(id(self), None)
        release(self)
        if began is not None:
            result.lock_hold.append(time.perf_counter() - began)

    FileSystemLock.acquire = timed_acquire  # type: ignore[method-assign]
    FileSystemLock.release = timed_release  # type: ignore[method-assign]


# -- workers ---------------------------------------------------------------------------------------


def batch(index: int, partition: str, number: int) -> Any:
    """Writer ``index``'s batch ``number``: the same ``ROWS`` keys every time, new values."""
    import pyarrow as pa

    return pa.table(
        {
            "id": [f"w{index}-{j}" for j in range(ROWS)],
            "part": [partition] * ROWS,
            "ts": pa.array([number] * ROWS, pa.int64()),
            "value": [f"w{index}-b{number}-{j}" for j in range(ROWS)],
        }
    )


def timed_writes(
    result: WriterResult,
    batches: list[Any],
    write: Callable[[Any], object],
    conflicts: tuple[type[BaseException], ...] = (),
    profiler: cProfile.Profile | None = None,
) -> None:
    """Write every batch, recording each call's latency, the commits, conflicts and other failures (the run
    goes on), the CPU time and the wall-clock span."""
    result.started = time.time()
    cpu = time.process_time()
    if profiler is not None:
        profiler.enable()
    for data in batches:
        began = time.perf_counter()
        try:
            write(data)
            result.commits += 1
        except conflicts:
            result.conflicts += 1
        except Exception as exc:
            result.errors[type(exc).__name__] += 1
        result.latencies.append(time.perf_counter() - began)
    if profiler is not None:
        profiler.disable()
    result.cpu = time.process_time() - cpu
    result.ended = time.time()


def cowrite_worker(
    uri: str, index: int, commits: int, mode: str, ready: Any, go: Event, results: Any, profile: bool,
    settings: dict[str, str],
) -> None:
    result = WriterResult()
    try:
        from cowrite.errors import WriteConflictError
        from cowrite.format.table import Table
        from cowrite.local.writer import LocalWriter
        from cowrite.protocol.transaction import WriteOptions

        table = Table.load(uri)
        count_storage_calls(result, type(table.storage))
        time_lock(result)
        writer = LocalWriter(table, WriteOptions(config=table.config.with_values(settings)))
        partition = "shared" if mode == "overlap" else f"p{index}"
        batches = [batch(index, partition, b) for b in range(commits)]
        # CPU time: wall time would charge the writer's waits for the lock and for the cores to whatever
        # call it was in
        profiler = cProfile.Profile(time.process_time) if profile else None
        ready.put(index)
        go.wait()
        timed_writes(result, batches, writer.upsert, (WriteConflictError,), profiler)
        if profiler is not None:
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
            stats.print_stats(35)
            out.write("\n--- by own time ---\n")
            stats.sort_stats("tottime").print_stats(20)
            result.profile = out.getvalue()
    except BaseException:
        result.errors["crash: " + traceback.format_exc().strip().splitlines()[-1]] += 1
        ready.put(index)
    results.put((index, result))


def delta_worker(
    uri: str, index: int, commits: int, mode: str, ready: Any, go: Event, results: Any, profile: bool,
    settings: dict[str, str],
) -> None:
    result = WriterResult()
    try:
        from deltalake import write_deltalake

        batches = [batch(index, f"p{index}", b) for b in range(commits)]
        ready.put(index)
        go.wait()
        # delta-rs retries conflicting appends itself: whatever escapes is a failed commit (an error)
        timed_writes(result, batches, partial(write_deltalake, uri, mode="append", partition_by=["part"]))
    except BaseException:
        result.errors["crash: " + traceback.format_exc().strip().splitlines()[-1]] += 1
        ready.put(index)
    results.put((index, result))


# -- one configuration -----------------------------------------------------------------------------


@dataclass
class Summary:
    engine: str
    mode: str
    writers: int
    commits: int
    conflicts: int
    errors: Counter[str]
    seconds: float
    cpu: float
    latencies: list[float]
    calls: Counter[str]
    call_seconds: defaultdict[str, float]
    listed: dict[str, list[int]]
    lock_wait: list[float]
    lock_hold: list[float]
    profile: str

    @property
    def rate(self) -> float:
        return self.commits / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000

    @property
    def spurious(self) -> int | str:
        if self.mode == "overlap":
            return "-"
        return self.conflicts + sum(self.errors.values())


def create_cowrite_table(uri: str, mode: str, writers: int) -> None:
    import pyarrow as pa

    from cowrite.format.table import Table
    from cowrite.local.writer import LocalWriter

    table = Table.create(uri, name="bench", record_key_fields=["id"], partition_fields=["part"],
                         ordering_fields=["ts"])
    if mode == "overlap":  # one file group holding every writer's keys
        seed = pa.concat_tables([batch(i, "shared", -1) for i in range(writers)])
        LocalWriter(table).insert(seed)


def run_writers(
    target: Callable[..., None],
    writers: int,
    args: Callable[[int, Any, Event, Any], tuple[Any, ...]],
    before_go: Callable[[], object] = lambda: None,
) -> list[tuple[Any, ...]]:
    """Run ``writers`` processes of ``target`` (multiprocessing "spawn"), writer ``i`` with ``args(i, ready,
    go, results)``; once every one has put its index on ``ready``, call ``before_go`` and set ``go``. Each
    puts one tuple on ``results`` (its index first): these, in the order they came."""
    context = mp.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    processes = [context.Process(target=target, args=args(i, ready, go, results)) for i in range(writers)]
    for process in processes:
        process.start()
    for _ in processes:
        ready.get(timeout=300)
    before_go()
    go.set()
    collected = [results.get(timeout=1800) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return collected


def run(
    engine: str, mode: str, writers: int, commits: int, root: Path, profile: bool, settings: dict[str, str]
) -> Summary:
    uri = str(root / f"{engine}-{mode}-{writers}")
    uris = [f"{uri}-{i}" for i in range(writers)] if mode == "apart" else [uri] * writers
    if engine == "cowrite":
        for table_uri in dict.fromkeys(uris):
            create_cowrite_table(table_uri, mode, writers)
        target = cowrite_worker
    else:
        target = delta_worker
    collected = {
        i: result
        for i, result, *_ in run_writers(
            target,
            writers,
            lambda i, ready, go, results: (uris[i], i, commits, mode, ready, go, results, profile and i == 0,
                                           settings),
        )
    }
    parts = [collected[i] for i in range(writers)]
    started = min(p.started for p in parts if p.started) if any(p.started for p in parts) else 0.0
    ended = max(p.ended for p in parts)
    calls: Counter[str] = Counter()
    call_seconds: defaultdict[str, float] = defaultdict(float)
    listed: dict[str, list[int]] = defaultdict(list)
    errors: Counter[str] = Counter()
    for part in parts:
        calls.update(part.calls)
        for key, seconds in part.call_seconds.items():
            call_seconds[key] += seconds
        errors.update(part.errors)
        for key, sizes in part.listed.items():
            listed[key].extend(sizes)
    return Summary(
        engine, mode, writers,
        commits=sum(p.commits for p in parts),
        conflicts=sum(p.conflicts for p in parts),
        errors=+errors,
        seconds=max(0.0, ended - started),
        cpu=sum(p.cpu for p in parts),
        latencies=[latency for p in parts for latency in p.latencies],
        calls=calls, call_seconds=call_seconds, listed=listed,
        lock_wait=[t for p in parts for t in p.lock_wait],
        lock_hold=[t for p in parts for t in p.lock_hold],
        profile=next((p.profile for p in parts if p.profile), ""),
    )


# -- reporting -------------------------------------------------------------------------------------

HEADER = (f"{'engine':<9} {'workload':<9} {'writers':>7} {'commits/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'cpu ms':>7} {'commits':>8} {'conflicts':>9} {'spurious':>8} {'create µs':>9}  errors")


def line(summary: Summary, create_us: float) -> str:
    errors = ", ".join(f"{k}: {v}" for k, v in summary.errors.items()) or "-"
    cpu = summary.cpu / max(1, len(summary.latencies)) * 1000
    return (f"{summary.engine:<9} {summary.mode:<9} {summary.writers:>7} {summary.rate:>10.1f} "
            f"{summary.percentile(0.5):>8.1f} {summary.percentile(0.99):>8.1f} {cpu:>7.1f} "
            f"{summary.commits:>8} {summary.conflicts:>9} {str(summary.spurious):>8} {create_us:>9.0f}  "
            f"{errors}")


def file_create_us(root: Path, files: int = 200) -> float:
    """CPU µs to create one empty file beside the tables (and remove it): the disk's own price, which a
    commit pays about nine times. A quiet ext4 disk asks 10-40 µs; phases of 100-500 µs lasting minutes
    were seen after heavy churn nearby, and every figure of such a phase is worse, ``apart`` included."""
    probe = Path(tempfile.mkdtemp(dir=root))
    began = time.process_time()
    for i in range(files):
        os.close(os.open(probe / str(i), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    spent = time.process_time() - began
    shutil.rmtree(probe)
    return spent / files * 1e6


def _ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000


def storage_report(summary: Summary) -> str:
    attempts = max(1, len(summary.latencies))
    wall = sum(summary.latencies)
    rows = [
        f"cowrite {summary.mode}, {summary.writers} writers, {attempts} write calls, "
        f"{wall / attempts * 1000:.1f} ms per call on average:",
        f"  table lock: {len(summary.lock_wait) / attempts:.1f} acquisitions per call; waiting p50 "
        f"{_ms(summary.lock_wait, 0.5):.1f} ms, p99 {_ms(summary.lock_wait, 0.99):.1f} ms, "
        f"{sum(summary.lock_wait) / attempts * 1000:.1f} ms per call; holding p50 "
        f"{_ms(summary.lock_hold, 0.5):.1f} ms, p99 {_ms(summary.lock_hold, 0.99):.1f} ms",
        f"  {'storage call':<36} {'per call':>8} {'ms/call':>8}  listing sizes",
    ]
    for key, count in sorted(summary.calls.items(), key=lambda kv: -summary.call_seconds[kv[0]]):
        sizes = summary.listed.get(key)
        extra = f"mean {statistics.fmean(sizes):.0f}, max {max(sizes)} entries" if sizes else ""
        spent = summary.call_seconds[key] / attempts * 1000
        rows.append(f"  {key:<36} {count / attempts:>8.2f} {spent:>8.2f}  {extra}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 commits per writer instead of 50")
    parser.add_argument("--commits", type=int, help="commits per writer (default 50, 10 with --quick)")
    parser.add_argument("--writers", default="1,2,4,8", help="comma-separated writer counts")
    parser.add_argument("--no-delta", action="store_true", help="skip the delta-rs comparison")
    parser.add_argument("--profile", action="store_true", help="profile writer 0 of the largest disjoint run")
    parser.add_argument("--keep", action="store_true", help="keep the tables (printed path)")
    parser.add_argument("--key-check-turns", type=int, default=3,
                        help="turns of the largest disjoint run with the record-key check on, then off")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a cowrite write setting, e.g. hoodie.write.lock.wait_time_ms=60000")
    args = parser.parse_args(argv)
    settings = dict(pair.split("=", 1) for pair in args.option)
    commits = args.commits or (10 if args.quick else 50)
    counts = [int(n) for n in args.writers.split(",")]
    try:
        import deltalake  # noqa: F401

        with_delta = not args.no_delta
    except ImportError:
        with_delta = False
        print("deltalake is not importable: no delta-rs comparison")

    root = Path(tempfile.mkdtemp(prefix="cowrite-bench-"))
    print(f"{commits} commits of {ROWS} rows per writer; tables under {root}; {mp.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}; settings {settings or 'defaults'}")
    print(HEADER)
    summaries: list[Summary] = []
    key_check: dict[str, list[float]] = {"key-check": [], "no-check": []}
    try:
        for mode, writer_counts in (("disjoint", counts), ("overlap", counts), ("apart", [max(counts)])):
            for writers in writer_counts:
                profile = args.profile and mode == "disjoint" and writers == max(counts)
                create_us = file_create_us(root)
                summary = run("cowrite", mode, writers, commits, root, profile, settings)
                summaries.append(summary)
                print(line(summary, create_us), flush=True)
        # The record-key check (on by default) against none, at the largest writer count, in turns
        off = {**settings, "cowrite.write.conflict.record.keys": "false"}
        for turn in range(args.key_check_turns):
            pair = (("key-check", settings), ("no-check", off))
            for label, chosen in pair if turn % 2 == 0 else pair[::-1]:  # neither always goes first
                create_us = file_create_us(root)
                where = root / f"{label}{turn}"
                summary = run("cowrite", "disjoint", max(counts), commits, where, False, chosen)
                summary = replace(summary, mode=label)
                key_check[label].append(summary.rate)
                print(line(summary, create_us), flush=True)
        if with_delta:
            for writers in counts:
                create_us = file_create_us(root)
                summary = run("delta-rs", "disjoint", writers, commits, root, False, {})
                summaries.append(summary)
                print(line(summary, create_us), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    by_key = {(s.engine, s.mode, s.writers): s for s in summaries}
    if with_delta:
        print("\ncowrite/delta-rs, commits/s (disjoint workload):")
        for writers in counts:
            ours, theirs = by_key[("cowrite", "disjoint", writers)], by_key[("delta-rs", "disjoint", writers)]
            ratio = ours.rate / theirs.rate if theirs.rate else float("nan")
            print(f"  {writers} writers: {ours.rate:.1f} / {theirs.rate:.1f} = {ratio:.2f}")

    if args.key_check_turns:
        on, off = key_check["key-check"], key_check["no-check"]
        ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(on, off, strict=True) if b)
        print(f"\nrecord-key check on / off at {max(counts)} disjoint writers, commits/s, turn by turn: "
              f"{', '.join(f'{a:.1f}/{b:.1f}' for a, b in zip(on, off, strict=True))} (ratios {ratios}); "
              f"median ratio {statistics.median(a / b for a, b in zip(on, off, strict=True) if b):.2f}")

    top, apart = by_key[("cowrite", "disjoint", max(counts))], by_key[("cowrite", "apart", max(counts))]
    print(f"\n{max(counts)} writers sharing one table / each on its own, commits/s: {top.rate:.1f} / "
          f"{apart.rate:.1f} = {top.rate / apart.rate if apart.rate else float('nan'):.2f}")
    print("\nwhere a cowrite write call spends its time (storage calls include the lock's own):")
    for writers in counts:
        print(storage_report(by_key[("cowrite", "disjoint", writers)]))
    met = top.rate >= TARGET_COMMITS_PER_S and top.percentile(0.99) < TARGET_P99_MS
    print(f"\ntarget at {max(counts)} disjoint writers: >= {TARGET_COMMITS_PER_S:.0f} commits/s and p99 < "
          f"{TARGET_P99_MS:.0f} ms: {'met' if met else 'MISSED'} ({top.rate:.1f} commits/s, p99 "
          f"{top.percentile(0.99):.1f} ms)")
    if top.profile:
        print(f"\nprofile of writer 0 of {max(counts)} disjoint writers:\n{top.profile}")
    crashed = [s for s in summaries if any(k.startswith("crash") for k in s.errors)]
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
