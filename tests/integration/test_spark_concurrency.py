"""Two Spark applications — an ingestion job and a backfill job, separate processes — write one table.

Each process has its own SparkSession and writes with ``cowrite write --engine spark``; a barrier before
each commit makes every two writes of a round overlap in time (``support/spark_writer.py``). Run twice:
``local[1]`` applications on local disk, and two applications on a standalone cluster writing to the S3
server — their drivers find the endpoint and keys in their AWS environment, the worker has none, so every
executor reaches S3 only with what the job carried to it.
Round 1: ingestion inserts a new partition while the backfill rewrites an old one — both commit.
Round 2: both upsert into the same file group — exactly one commits, the other exits 3 (write conflict)
and nothing it wrote is visible, to cowrite's readers or to hudi-rs, in a snapshot or incrementally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import TESTS, hudi_rs
from support.hudi_rs import rows
from support.servers import S3Server, SparkCluster
from support.tables import frame

from cowrite.format.fs_view import list_base_files
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter

INITIAL = frame((1, "old-1", 1, "initial"), (2, "old-1", 1, "initial"), (3, "old-2", 1, "initial"),
                (4, "old-2", 1, "initial"))  # fmt: skip
JOBS = {
    "ingestion": [
        ("insert", frame((100, "new-1", 1, "ingest-1"), (101, "new-1", 1, "ingest-1"))),
        ("upsert", frame((3, "old-2", 2, "ingest-2"), (102, "old-2", 1, "ingest-2"))),
    ],
    "backfill": [
        ("insert_overwrite", frame((1, "old-1", 1, "backfill-1"), (5, "old-1", 1, "backfill-1"))),
        ("upsert", frame((4, "old-2", 2, "backfill-2"), (6, "old-2", 1, "backfill-2"))),
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "cluster-s3"])
def test_ingestion_and_backfill_commit_concurrently_and_a_conflict_aborts_cleanly(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    uri, master, storage_options, aws = str(tmp_path / "table"), "local[1]", {}, {}
    if where == "cluster-s3":
        server: S3Server = request.getfixturevalue("s3_server")
        cluster: SparkCluster = request.getfixturevalue("spark_cluster")
        uri, master = server.new_uri("spark"), cluster.master_url
        storage_options, aws = server.storage_options(), server.env()
    table = Table.create(
        uri, name="t", record_key_fields=["id"], partition_fields=["p"], ordering_fields=["ts"],
        storage_options=storage_options,
    )  # fmt: skip
    LocalWriter(table).insert(INITIAL)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    processes = {}
    for name, rounds in JOBS.items():
        commands = []
        for number, (operation, batch) in enumerate(rounds):
            source = tmp_path / f"{name}-{number}.parquet"
            pq.write_table(batch, source)
            command = ["write", uri, "--input", str(source), "--operation", operation, "--engine", "spark",
                       "--master", master]  # fmt: skip
            commands += ["--round", json.dumps(command)]
        result = tmp_path / f"{name}.json"
        argv = [sys.executable, "-m", "support.spark_writer", "--name", name, "--peers", "2",
                "--barrier-dir", str(barrier), "--result", str(result), "--master", master,
                *commands]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(TESTS), **aws}
        processes[name] = (subprocess.Popen(argv, cwd=TESTS, env=env, stderr=subprocess.PIPE), result)
    results = {}
    for name, (process, result) in processes.items():
        _, stderr = process.communicate(timeout=400)
        assert process.returncode == 0, stderr.decode()[-3000:]
        results[name] = json.loads(result.read_text())["rounds"]

    # round 1: disjoint file groups, both committed
    assert [results[name][0]["exit"] for name in JOBS] == [0, 0]
    # round 2: the same file group of old-2: exactly one committed, the other lost with exit code 3
    codes = {name: results[name][1]["exit"] for name in JOBS}
    assert sorted(codes.values()) == [0, 3], codes
    winner = next(name for name, code in codes.items() if code == 0)
    loser = next(name for name, code in codes.items() if code == 3)
    lost_instant = results[loser][1]["instant"]

    written = [batch for name in JOBS for number, (_, batch) in enumerate(JOBS[name])
               if number == 0 or name == winner]  # fmt: skip
    expected = _apply(INITIAL, written)
    assert rows(read.snapshot(table)) == expected == hudi_rs.snapshot(uri, storage_options)
    lost_values = {f"{loser}-2"}
    everything_seen = rows(read.incremental(table))
    everything_seen += hudi_rs.incremental(uri, storage_options=storage_options)
    everything_seen += [
        r for i in table.timeline() for r in hudi_rs.as_of(uri, i.requested_time, storage_options)
    ]
    assert not [r for r in everything_seen if r["v"] in lost_values]
    # the loser's instant never completed and its files were deleted when it aborted
    lost = table.timeline().get(lost_instant)
    assert lost is not None and not lost.is_completed
    assert not [b for b in list_base_files(table) if b.instant_time == lost_instant]
    # every other instant completed: four commits after the initial insert... minus the loser
    assert len(table.timeline().data_commits()) == 4


def _apply(initial: pa.Table, batches: list[pa.Table]) -> list[dict[str, Any]]:
    """The expected rows: round 1's insert_overwrite replaces old-1; upserts replace by key."""
    by_key = {r["id"]: r for r in rows(initial)}
    for batch in batches:
        found = rows(batch)
        if any(r["v"] == "backfill-1" for r in found):
            by_key = {k: r for k, r in by_key.items() if r["p"] != "old-1"}
        for row in found:
            by_key[row["id"]] = row
    return rows(pa.Table.from_pylist(list(by_key.values())))
