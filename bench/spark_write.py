"""The Spark engine against plain ``df.write.parquet`` of the same data, in the same SparkSession.

    .venv/bin/python bench/spark_write.py                    # 1M rows, 10 % upsert, 3 rounds, local[2]
    .venv/bin/python bench/spark_write.py --rows 200000      # a quicker run
    .venv/bin/python bench/spark_write.py --master 'local[4]' --rounds 5
    .venv/bin/python bench/spark_write.py --s3 --delay 0.02   # on the S3 server, 20 ms a request

One SparkSession (``spark.driver.memory=2g``: in local mode driver and executors share that one JVM, so
the heap budget of the whole job is 2 GB). The input is generated, cached and counted before anything is
timed, so every write reads the same in-memory rows:

- ``parquet``: ``df.write.parquet(dir)`` of the 1M rows (the baseline);
- ``insert``: ``SparkWriter.insert`` of the same rows into a new table (partitioned by ``day``, key ``id``);
- ``upsert``: ``SparkWriter.upsert`` of 10 % of the keys, spread over every partition, into that table;
  a copy-on-write upsert rewrites every file group it touches — here all of them — so its baseline is
  the same plain write of the whole table; the plain write of the upsert batch alone is printed too.

Each round, on fresh directories after one warm-up round of the same size (the JVM compiles the paths
that a million rows take, Python workers start; a smaller warm-up left the first round 1.5-2.5x slower
for the plain write and the engine alike): the plain write, the insert, the plain write again, the
upsert, the plain write of the upsert batch. The figures are medians over the rounds (and the best
round), and each engine write is also compared with the plain write just before it: on a machine that
other work shares, the load drifts between rounds, and a ratio within a pair is the less disturbed one
(both ratios are printed, each with its verdict). The Spark jobs of each write are counted (job groups).
Memory: the JVM's peak heap (sum of the heap pools' peaks), the JVM's and the driver's peak resident
size, and the largest peak resident size of a Python worker — from /proc, the JVM's own management beans
and ``resource``, no extra packages. Targets: insert at most 1.5x, upsert at most 3x the plain write;
everything within the 2 GB heap.

``--s3`` writes to the tests' moto S3 server behind the object-store benchmark's delaying proxy
(``--delay`` seconds a request) instead of local disk. Spark's own ``s3a://`` needs hadoop-aws jars that no
package here provides, so the plain write there is the plainest job that writes the same rows to the same
server: ``mapInArrow``, each task one parquet file through s3fs. The requests each write made are printed
by kind.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

TARGET_INSERT = 1.5
TARGET_UPSERT = 3.0
HEAP_BUDGET = 2 * 1024**3


def start(master: str, shuffle_partitions: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("cowrite-bench-spark-write")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def generate(spark: Any, rows: int, days: int) -> Any:
    """The table's rows: key, partition, ordering field and a few payload columns of common types."""
    from pyspark.sql import functions as F

    return (
        spark.range(rows)
        .select(
            F.col("id"),
            F.date_format(
                F.date_add(F.lit("2026-01-01"), (F.col("id") % days).cast("int")), "yyyy-MM-dd"
            ).alias("day"),
            F.lit(1).cast("long").alias("ts"),
            F.sha1(F.col("id").cast("string")).alias("payload"),
            (F.col("id") % 1000 / 10.0).alias("amount"),
            (F.col("id") % 7).cast("int").alias("quantity"),
            F.concat(F.lit("category-"), (F.col("id") % 10).cast("string")).alias("category"),
        )
        .cache()
    )


def updates(spark: Any, data: Any, fraction: float) -> Any:
    """``fraction`` of the keys, chosen at random over all partitions, with a newer ts and new values."""
    from pyspark.sql import functions as F

    return (
        data.sample(fraction=fraction, seed=7)
        .withColumn("ts", F.lit(2).cast("long"))
        .withColumn("amount", F.col("amount") + 1)
        .cache()
    )


CLOCKS: list[Any] = []  # the Memory whose processes' CPU time is counted too
GROUPS = itertools.count()  # Spark job groups: one per timed write


def timed(action: Callable[[], Any], name: str, cpu: dict[str, float], jobs: dict[str, float]) -> float:
    """Wall seconds of ``action``; its CPU seconds (driver, JVM, Python workers) go to ``cpu[name]``,
    the number of Spark jobs it ran to ``jobs[name]``."""
    context = CLOCKS[0].spark.sparkContext if CLOCKS else None
    group = f"{name} {next(GROUPS)}"
    if context is not None:
        context.setJobGroup(group, name)
    before = CLOCKS[0].cpu_seconds() if CLOCKS else 0.0
    started = time.perf_counter()
    action()
    elapsed = time.perf_counter() - started
    cpu[name] = (CLOCKS[0].cpu_seconds() if CLOCKS else 0.0) - before
    if context is not None:
        jobs[name] = float(len(context.statusTracker().getJobIdsForGroup(group)))
        context.setLocalProperty("spark.jobGroup.id", None)
    return elapsed


# -- memory ----------------------------------------------------------------------------------------------
def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _status(int(entry.name)).get("PPid", "").strip() == str(pid):
            found.append(int(entry.name))
    return found


def _kib(value: str | None) -> int:
    return int(value.split()[0]) * 1024 if value else 0


class Memory:
    """Peak memory of the driver process, the JVM, and the Python workers (sampled after each write)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        jvm = [p for p in _children(os.getpid()) if "java" in _status(p).get("Name", "")]
        self.jvm_pid = jvm[0] if jvm else None
        self.worker_peak = 0
        self.workers_total_peak = 0

    def sample(self) -> None:
        if self.jvm_pid is None:
            return
        workers, pending = [], _children(self.jvm_pid)
        while pending:  # the pyspark daemon forks the workers
            pid = pending.pop()
            if "python" in _status(pid).get("Name", ""):
                workers.append(pid)
            pending.extend(_children(pid))
        peaks = [_kib(_status(p).get("VmHWM")) for p in workers]
        self.worker_peak = max([self.worker_peak, *peaks])
        self.workers_total_peak = max(
            self.workers_total_peak, sum(_kib(_status(p).get("VmRSS")) for p in workers)
        )

    def descendants(self) -> list[int]:
        found, pending = [], _children(self.jvm_pid) if self.jvm_pid else []
        while pending:
            pid = pending.pop()
            found.append(pid)
            pending.extend(_children(pid))
        return found

    def cpu_seconds(self) -> float:
        """CPU time used so far by this process, the JVM and every Python worker (reaped ones included)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in [self.jvm_pid, *self.descendants()] if self.jvm_pid else []:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return total / ticks + usage.ru_utime + usage.ru_stime

    def heap_peak(self) -> int:
        management = self.spark.sparkContext._jvm.java.lang.management.ManagementFactory
        total = 0
        for pool in management.getMemoryPoolMXBeans():
            if str(pool.getType().toString()) == "Heap memory":
                total += int(pool.getPeakUsage().getUsed())
        return total

    def heap_max(self) -> int:
        management = self.spark.sparkContext._jvm.java.lang.management.ManagementFactory
        return int(management.getMemoryMXBean().getHeapMemoryUsage().getMax())

    def jvm_rss_peak(self) -> int:
        return _kib(_status(self.jvm_pid).get("VmHWM")) if self.jvm_pid else 0

    @staticmethod
    def driver_rss_peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mib(value: float) -> str:
    return f"{value / 1024**2:,.0f} MiB"


# -- where a round writes ---------------------------------------------------------------------------------
class LocalDisk:
    """Directories under a temporary root; the plain write is ``df.write.parquet``."""

    storage_options: dict[str, Any] = {}

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cowrite-bench-spark-"))

    def uri(self, name: str) -> str:
        return str(self.root / name)

    def plain_write(self, frame: Any, name: str) -> None:
        frame.write.mode("overwrite").parquet(self.uri(name))

    def parquet_files(self, name: str) -> int:
        return len(list((self.root / name).rglob("*.parquet")))

    def requests(self) -> str:
        return ""

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class ObjectStore:
    """Keys of the tests' S3 server, reached through the delaying proxy; the plain write is one parquet
    file per task through s3fs (what ``df.write.parquet`` to ``s3a://`` would do with the jars)."""

    def __init__(self, delay: float) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from bench.bucket import BUCKET, cowrite_options, s3_server
        from bench.proxy import DelayingProxy

        self._running = ExitStack()
        server = self._running.enter_context(s3_server())
        self._proxy = self._running.enter_context(DelayingProxy(server.endpoint_url, delay=delay))
        self.storage_options = cowrite_options(self._proxy.endpoint_url, "spark")
        self.root = f"s3://{BUCKET}/spark-write"

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    def plain_write(self, frame: Any, name: str) -> None:
        write = _ParquetTasks(self.uri(name), self.storage_options)
        frame.mapInArrow(write, "files long").collect()

    def parquet_files(self, name: str) -> int:
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options)
        return len([p for p in fs.find(self.uri(name)) if p.endswith(".parquet")])

    def requests(self) -> str:
        """The requests since the last call, by kind."""
        counts = self._proxy.reset()
        return " ".join(f"{kind} {count}" for kind, count in sorted(counts.items()))

    def close(self) -> None:
        self._running.close()


class _ParquetTasks:
    """A ``mapInArrow`` function: the task's rows as one parquet file under ``uri``, through s3fs."""

    def __init__(self, uri: str, options: dict[str, Any]) -> None:
        self.uri, self.options = uri, options

    def __call__(self, batches: Any) -> Any:
        import uuid

        import fsspec
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = pa.Table.from_batches(list(batches))
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **self.options)
        with fs.open(f"{self.uri}/part-{uuid.uuid4().hex}.parquet", "wb") as out:
            pq.write_table(rows, out)
        yield pa.RecordBatch.from_pydict({"files": [1]})


# -- the rounds ------------------------------------------------------------------------------------------
def one_round(spark: Any, data: Any, batch: Any, place: Any, prefix: str, memory: Memory) -> dict[str, float]:
    from cowrite.format.table import Table
    from cowrite.spark import SparkWriter

    times: dict[str, float] = {}
    cpu: dict[str, float] = {}
    jobs: dict[str, float] = {}
    requests: dict[str, str] = {}

    def write(name: str, action: Callable[[], Any]) -> None:
        place.requests()
        times[name] = timed(action, name, cpu, jobs)
        requests[name] = place.requests()
        memory.sample()

    table = Table.create(
        place.uri(f"{prefix}/table"),
        name="bench",
        record_key_fields=["id"],
        partition_fields=["day"],
        ordering_fields=["ts"],
        storage_options=place.storage_options,
    )
    writer = SparkWriter(table, spark)
    write("parquet", lambda: place.plain_write(data, f"{prefix}/plain"))
    write("insert", lambda: writer.insert(data))
    write("parquet before upsert", lambda: place.plain_write(data, f"{prefix}/plain-2"))
    write("upsert", lambda: writer.upsert(batch))
    write("parquet batch", lambda: place.plain_write(batch, f"{prefix}/plain-batch"))
    times["files"] = float(place.parquet_files(f"{prefix}/table"))
    times.update({f"cpu {name}": seconds for name, seconds in cpu.items()})
    times.update({f"jobs {name}": count for name, count in jobs.items()})
    if any(requests.values()):
        print(f"{prefix}: requests " + "; ".join(f"{name}: {kinds}" for name, kinds in requests.items()))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--fraction", type=float, default=0.1, help="share of the keys the upsert changes")
    parser.add_argument("--days", type=int, default=8, help="partitions of the table")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--verbose", action="store_true", help="log the time of each Spark job of a write")
    parser.add_argument("--s3", action="store_true", help="write to the S3 server behind the delaying proxy")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds a request is held (--s3)")
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(format="%(relativeCreated)8.0f ms %(message)s")
        logging.getLogger("cowrite.spark").setLevel(logging.DEBUG)
        logging.getLogger("cowrite.protocol.transaction").setLevel(logging.DEBUG)

    load = os.getloadavg()
    where = f"S3 at {args.delay * 1000:.0f} ms a request" if args.s3 else "local disk"
    print(f"cpus {os.cpu_count()}, load average {load[0]:.2f} {load[1]:.2f}, master {args.master}, "
          f"{args.rows:,} rows in {args.days} partitions, upsert {args.fraction:.0%}, {where}")  # fmt: skip
    spark = start(args.master, args.shuffle_partitions)
    memory = Memory(spark)
    CLOCKS.append(memory)
    data = generate(spark, args.rows, args.days)
    batch = updates(spark, data, args.fraction)
    print(f"input cached: {data.count():,} rows in {data.rdd.getNumPartitions()} tasks; "
          f"upsert batch {batch.count():,} rows")  # fmt: skip
    place = ObjectStore(args.delay) if args.s3 else LocalDisk()
    try:
        one_round(spark, data, batch, place, "warm-up", memory)
        results = [one_round(spark, data, batch, place, f"round-{n}", memory) for n in range(args.rounds)]
    finally:
        place.close()

    columns = ("parquet", "insert", "parquet before upsert", "upsert", "parquet batch")
    print(
        f"\n{'round':<8}{'parquet':>16}{'insert':>16}{'parquet':>16}{'upsert':>16}{'batch pq':>16}"
        f"{'files':>7}   (wall / CPU)"
    )
    for number, r in enumerate(results):
        cells = "".join(f"{r[k]:>8.2f}/{r['cpu ' + k]:>6.2f}s" for k in columns)
        print(f"{number:<8}{cells}{int(r['files']):>7}")
    plain_walls = [r[k] for r in results for k in ("parquet", "parquet before upsert")]
    plain_cpus = [r["cpu " + k] for r in results for k in ("parquet", "parquet before upsert")]
    wall = {k: statistics.median(r[k] for r in results) for k in columns}
    cpu = {k: statistics.median(r["cpu " + k] for r in results) for k in columns}
    wall["parquet"], cpu["parquet"] = statistics.median(plain_walls), statistics.median(plain_cpus)
    print(
        f"\nmedians (wall): parquet {wall['parquet']:.2f} s, insert {wall['insert']:.2f} s, "
        f"upsert {wall['upsert']:.2f} s; plain write of the upsert batch alone {wall['parquet batch']:.2f} s"
    )
    print(
        f"medians (CPU, all processes): parquet {cpu['parquet']:.2f} s, insert {cpu['insert']:.2f} s, "
        f"upsert {cpu['upsert']:.2f} s"
    )
    best = {k: min(r[k] for r in results) for k in columns}
    best["parquet"] = min(plain_walls)
    print(
        f"best of {len(results)} (wall; the least disturbed run on a shared machine): parquet "
        f"{best['parquet']:.2f} s, insert {best['insert']:.2f} s, upsert {best['upsert']:.2f} s"
    )
    spark_jobs = {
        k: statistics.median(r["jobs " + k] for r in results) for k in ("parquet", "insert", "upsert")
    }
    print(
        f"Spark jobs per write: parquet {spark_jobs['parquet']:.0f}, insert {spark_jobs['insert']:.0f}, "
        f"upsert {spark_jobs['upsert']:.0f}"
    )
    for name, target, before in (
        ("insert", TARGET_INSERT, "parquet"),
        ("upsert", TARGET_UPSERT, "parquet before upsert"),
    ):
        by_wall, by_cpu, by_best = (
            wall[name] / wall["parquet"],
            cpu[name] / cpu["parquet"],
            best[name] / best["parquet"],
        )
        paired = statistics.median(r[name] / r[before] for r in results)
        print(
            f"{name} / parquet = {by_wall:.2f}x wall (medians; target <= {target}x: "
            f"{'met' if by_wall <= target else 'MISSED'}), {paired:.2f}x wall (median of each round's ratio "
            f"to the plain write just before: {'met' if paired <= target else 'MISSED'}), {by_cpu:.2f}x CPU, "
            f"{by_best:.2f}x best-of"
        )
    print(f"upsert / plain write of the batch = {wall['upsert'] / wall['parquet batch']:.2f}x wall")
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} (2 cores: above 2, other work shares them)")
    heap = memory.heap_peak()
    print(f"\nmemory: JVM heap peak {mib(heap)} of max {mib(memory.heap_max())} "
          f"(budget {mib(HEAP_BUDGET)}: {'met' if heap <= HEAP_BUDGET else 'MISSED'}); "
          f"JVM resident peak {mib(memory.jvm_rss_peak())}; driver Python resident peak "
          f"{mib(memory.driver_rss_peak())}; Python worker resident peak {mib(memory.worker_peak)} "
          f"(all workers together at most {mib(memory.workers_total_peak)} when sampled)")  # fmt: skip
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
