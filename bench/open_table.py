"""How long opening a table takes after 1k and after 100k commits, with archival keeping the timeline short.

Builds the history synthetically but validly (completed commit files with one write stat each, written
straight through the storage layer), archives it as the daemon would, then times what every writer
and reader does first: load ``hoodie.properties``, list the timeline, build the file system view.
Prints both times and their ratio (the target: about 1).

    .venv/bin/python bench/open_table.py [--commits 1000,100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import pyarrow as pa

from cowrite.cleaner import archive, service_lock
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Action, Instant, State, from_millis
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter


def build(commits: int) -> Table:
    table = Table.create(
        tempfile.mkdtemp(prefix="cowrite-open-") + "/t",
        name="t",
        record_key_fields=["id"],
        partition_fields=["p"],
    )
    LocalWriter(table).insert(pa.table({"id": ["seed"], "p": ["a"]}))  # one real base file
    start = int(time.time() * 1000) - commits * 10 - 60_000
    for n in range(commits):
        requested = from_millis(start + n * 10)
        completed = Instant(requested, Action.COMMIT, State.COMPLETED, from_millis(start + n * 10 + 5))
        stat = WriteStat(
            f"g{n % 100}-0", f"a/g{n % 100}-0_0-0-1_{requested}.parquet", "a", "null", 1, 1, 0, 0, 1
        )
        table.storage.create_if_absent(
            table.instant_path(completed), CommitMetadata("insert", (stat,)).to_bytes(Action.COMMIT)
        )
    archive(table, service_lock(table))
    return table


def time_open(table: Table, rounds: int = 20) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        opened = Table.load(table.uri)
        FileSystemView.build(opened, opened.timeline())
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", default="1000,100000")
    args = parser.parse_args()
    sizes = [int(n) for n in args.commits.split(",")]
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    results = {}
    for size in sizes:
        started = time.perf_counter()
        table = build(size)
        built = time.perf_counter() - started
        results[size] = time_open(table)
        active = len(table.timeline())
        print(
            f"{size:>7} commits: built+archived in {built:.1f} s, active instants {active}, "
            f"open + timeline + file system view: {results[size] * 1000:.2f} ms (median of 20)"
        )
    if len(sizes) >= 2:
        print(f"ratio {sizes[-1]} / {sizes[0]} commits: {results[sizes[-1]] / results[sizes[0]]:.2f}")


if __name__ == "__main__":
    main()
