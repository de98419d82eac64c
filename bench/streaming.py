"""Streaming into and out of a cowrite table, against Spark's own file sink and source on the same data.

    .venv/bin/python bench/streaming.py                          # 20 micro-batches of 10,000 rows, local[2]
    .venv/bin/python bench/streaming.py --batches 10 --commits 20   # a quicker run

**The sink.** The input is ``--batches`` parquet files of ``--rows`` rows each, written before anything
is timed; each query reads them one file per micro-batch (``maxFilesPerTrigger`` 1) as fast as it can
(``availableNow``), on fresh output each time, in turn:

- ``parquet``: ``writeStream.format("parquet")``, Spark's file sink (the baseline);
- ``cowrite``: ``writeStream.format("cowrite")``, each micro-batch one insert instant;
- ``upsert``: ``foreachBatch(upsert_each_batch(...))`` into the table the ``cowrite`` query filled, every
  batch updating the keys of the same-numbered batch of that table.

Printed per query: wall time, micro-batches and rows a second, the p50/p99 of a micro-batch's duration
(Spark's ``triggerExecution``), and the ratio of its wall time to the file sink's.

**The source.** A writer in this process commits ``--commits`` inserts of ``--commit-rows`` rows, one
every ``--every`` seconds, while a ``readStream.format("cowrite")`` query (trigger as fast as possible)
hands each micro-batch to ``foreachBatch``. Once both queries ran their first batch (a query's start is
not latency), a commit's latency is the time from its completion (the writer's call returning) to the
micro-batch that holds its rows. The baseline is Spark's file source
(``readStream.parquet``) over a directory into which the same rows are moved, one file a commit at the same
cadence: the time from the file's rename to its micro-batch. Printed: p50/p99/max latency of each and
their ratio, and whether each source delivered every row exactly once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cowrite.format.table import Table  # noqa: E402
from cowrite.local.writer import LocalWriter  # noqa: E402

WRITE = {
    "hoodie.datasource.write.recordkey.field": "id",
    "hoodie.datasource.write.partitionpath.field": "day",
    "hoodie.datasource.write.precombine.field": "ts",
    "hoodie.table.name": "events",
}
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("day", pa.string()),
        ("ts", pa.int64()),
        ("payload", pa.string()),
        ("amount", pa.float64()),
    ]
)


def start(master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("cowrite-bench-streaming")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rows(first: int, count: int, ts: int = 1, days: int = 4) -> pa.Table:
    ids = range(first, first + count)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "day": pa.array([f"2026-01-0{1 + i % days}" for i in ids]),
            "ts": pa.array([ts] * count, pa.int64()),
            "payload": pa.array([f"payload-{i}-{ts}" for i in ids]),
            "amount": pa.array([i / 10 for i in ids], pa.float64()),
        },
        schema=SCHEMA,
    )


# -- the sink --------------------------------------------------------------------------------------------
def run_sink(spark: Any, source: Path, write: Callable[[Any], Any], checkpoint: Path) -> dict[str, float]:
    """Run one query over every file of ``source`` (one a micro-batch); its timings."""
    stream = spark.readStream.schema(_spark_schema()).option("maxFilesPerTrigger", 1).parquet(str(source))
    writer = write(stream).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    wall = time.perf_counter() - started
    durations = [
        p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress if p["numInputRows"]
    ]
    return {"wall": wall, "batches": len(durations), **_percentiles(durations)}


def bench_sink(spark: Any, work: Path, batches: int, size: int) -> None:
    from cowrite.spark import register, upsert_each_batch

    register(spark)
    inserts, updates = work / "inserts", work / "updates"
    for directory, ts in ((inserts, 1), (updates, 2)):
        directory.mkdir()
        for number in range(batches):
            pq.write_table(rows(number * size, size, ts), directory / f"{number:04d}.parquet")
    table = str(work / "events")
    plain = run_sink(
        spark,
        inserts,
        lambda s: s.writeStream.format("parquet").option("path", str(work / "plain")),
        work / "c0",
    )
    sink = run_sink(
        spark,
        inserts,
        lambda s: s.writeStream.format("cowrite").options(**WRITE).option("path", table),
        work / "c1",
    )
    upsert = run_sink(
        spark, updates, lambda s: s.writeStream.foreachBatch(upsert_each_batch(table)), work / "c2"
    )

    print(f"\nsink: {batches} micro-batches of {size:,} rows, one file each, as fast as possible")
    header = ("query", "wall s", "batches/s", "rows/s", "batch p50 s", "p99 s", "vs parquet")
    print("{:<10} {:>8} {:>10} {:>10} {:>12} {:>7} {:>11}".format(*header))
    for name, figures in (("parquet", plain), ("cowrite", sink), ("upsert", upsert)):
        wall, count = figures["wall"], figures["batches"]
        print(
            f"{name:<10} {wall:8.2f} {count / wall:10.2f} {count * size / wall:10,.0f} "
            f"{figures['p50']:12.2f} {figures['p99']:7.2f} {wall / plain['wall']:10.2f}x"
        )


# -- the source ------------------------------------------------------------------------------------------
class Arrivals:
    """When each key first reached a ``foreachBatch`` call, and how often each came."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.seen: dict[int, int] = {}
        self.calls = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        now = time.time()
        self.calls += 1
        for row in df.select("id").where("id >= 0").collect():
            self.seen[row.id] = self.seen.get(row.id, 0) + 1
            self.first.setdefault(row.id, now)


def bench_source(spark: Any, work: Path, commits: int, size: int, every: float) -> None:
    from cowrite.spark import register

    register(spark)
    table = Table.create(
        str(work / "feed"),
        name="feed",
        record_key_fields=("id",),
        partition_fields=("day",),
        ordering_fields=("ts",),
    )
    writer = LocalWriter(table)
    writer.insert(rows(-1, 1))  # a stream starts from a table with a schema: this row is not counted
    landing = work / "landing"
    landing.mkdir()
    pq.write_table(rows(-1, 1), landing / "warm-up.parquet")
    cowrite_arrivals, file_arrivals = Arrivals(), Arrivals()
    queries = [
        spark.readStream.format("cowrite")
        .load(table.uri)
        .writeStream.foreachBatch(cowrite_arrivals)
        .option("checkpointLocation", str(work / "s0"))
        .trigger(processingTime="0 seconds")
        .start(),
        spark.readStream.schema(_spark_schema())
        .parquet(str(landing))
        .writeStream.foreachBatch(file_arrivals)
        .option("checkpointLocation", str(work / "s1"))
        .trigger(processingTime="0 seconds")
        .start(),
    ]
    deadline = time.monotonic() + 120
    while not (cowrite_arrivals.calls and file_arrivals.calls) and time.monotonic() < deadline:
        time.sleep(0.1)
    committed: dict[int, float] = {}  # first key of a commit -> when it completed
    landed: dict[int, float] = {}

    def produce() -> None:
        for number in range(commits):
            batch = rows(number * size, size)
            writer.insert(batch)
            committed[number * size] = time.time()
            staged = work / f".{number}.parquet"
            pq.write_table(batch, staged)
            staged.rename(landing / f"{number:04d}.parquet")
            landed[number * size] = time.time()
            time.sleep(every)

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join()
    deadline = time.monotonic() + 120
    total = commits * size
    while (
        len(cowrite_arrivals.first) < total or len(file_arrivals.first) < total
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    for query in queries:
        query.stop()

    print(f"\nsource: {commits} commits of {size:,} rows, one every {every} s, read as fast as possible")
    print(f"{'source':<10} {'latency p50 s':>14} {'p99 s':>7} {'max s':>7} {'rows once':>10}")
    results = {}
    for name, arrivals, done in (
        ("parquet", file_arrivals, landed),
        ("cowrite", cowrite_arrivals, committed),
    ):
        latencies = [arrivals.first[key] - at for key, at in done.items() if key in arrivals.first]
        figures = _percentiles(latencies)
        once = len(arrivals.seen) == total and set(arrivals.seen.values()) == {1}
        results[name] = figures
        print(
            f"{name:<10} {figures['p50']:14.2f} {figures['p99']:7.2f} {figures['max']:7.2f} {str(once):>10}"
        )
    print(f"cowrite / parquet latency p50: {results['cowrite']['p50'] / results['parquet']['p50']:.2f}x")


# -- helpers ---------------------------------------------------------------------------------------------
def _spark_schema() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(SCHEMA)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20, help="micro-batches of the sink")
    parser.add_argument("--rows", type=int, default=10_000, help="rows a micro-batch of the sink")
    parser.add_argument("--commits", type=int, default=30, help="commits the source reads")
    parser.add_argument("--commit-rows", type=int, default=1_000, help="rows a commit the source reads")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between two commits")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cowrite-bench-streaming-"))
    spark = start(args.master)
    try:
        for part in ("sink", "source"):
            (work / part).mkdir()
        bench_sink(spark, work / "sink", args.batches, args.rows)
        bench_source(spark, work / "source", args.commits, args.commit_rows, args.every)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
