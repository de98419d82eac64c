"""Clustering executed on Spark: the same result as in-process, read back exactly by hudi-rs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from support import hudi_rs

from cowrite import steps
from cowrite.cleaner import service_lock
from cowrite.engine.clustering import execute_clustering, schedule_clustering
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Action
from cowrite.format.table import Table
from cowrite.format.timeline import InstantRange
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.spark import SparkWriter
from cowrite.spark.clustering import map_on_spark
from cowrite.steps import Step


def test_clustering_runs_its_rewrites_as_spark_tasks(spark: Any, tmp_path: Path) -> None:
    table = Table.create(
        str(tmp_path / "t"),
        name="t",
        record_key_fields=["id"],
        partition_fields=["p"],
        properties={"hoodie.parquet.small.file.limit": "0"},
    )
    writer = LocalWriter(table)
    for part in ("a", "b"):
        for n in range(3):
            writer.insert(pa.table({"id": [f"{part}{n}"], "p": [part], "v": [n]}))
    before = read.snapshot(table, with_meta=True).sort_by("id")
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9, sort_columns=["v"])
    assert planned is not None
    done = execute_clustering(table, planned, map_on_spark(spark))
    view = FileSystemView.build(table)
    assert [len(view.in_partition(p)) for p in ("a", "b")] == [1, 1]
    assert table.commit_metadata(done).operation == "cluster"
    after = read.snapshot(table, with_meta=True).sort_by("id")
    kept = ["_hoodie_commit_time", "_hoodie_record_key", "id", "p", "v"]
    assert after.select(kept).to_pylist() == before.select(kept).to_pylist()
    assert hudi_rs.snapshot(table.uri) == hudi_rs.rows(read.snapshot(table))


def test_a_spark_upsert_that_lost_to_a_completed_clustering_reverts_it(spark: Any, tmp_path: Path) -> None:
    """RFC-22's example on the Spark engine: clustering f1,f2,f3 -> g1 is planned and completes while the
    upsert of f1, begun before, plans its files; under the default update strategy (allow) the upsert
    commits and reverts it, as the local engine's does (tests/test_clustering.py): one commit path."""
    table = Table.create(
        str(tmp_path / "t"),
        name="t",
        record_key_fields=["id"],
        partition_fields=["p"],
        ordering_fields=["v"],
        properties={"hoodie.parquet.small.file.limit": "0"},
    )
    writer = LocalWriter(table)
    for n in (0, 1, 2):
        writer.insert(pa.table({"id": [n], "p": ["a"], "v": [1]}))
    writer.insert(pa.table({"id": [50], "p": ["b"], "v": [1]}))
    start = table.timeline().latest_completion_time
    clustered: list[Any] = []

    def cluster_meanwhile(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.REQUESTED and not clustered:
            planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
            assert planned is not None
            clustered.append(execute_clustering(table, planned))

    with steps.observe(cluster_meanwhile):
        update = spark.createDataFrame([(1, "a", 2)], "id long, p string, v long")
        done = SparkWriter(table, spark).upsert(update)
    assert len(clustered) == 1
    after = table.timeline().completed_in(InstantRange.since(done.completion_time or ""))
    assert [(i.action, table.commit_metadata(i).operation) for i in after] == [
        (Action.REPLACE_COMMIT, "cluster_revert")
    ]
    expected = hudi_rs.rows(pa.table({"id": [0, 1, 2, 50], "p": ["a", "a", "a", "b"], "v": [1, 2, 1, 1]}))
    assert hudi_rs.rows(read.snapshot(table)) == hudi_rs.snapshot(table.uri) == expected
    assert len(FileSystemView.build(table).in_partition("a")) == 3  # 1 group back to 3
    assert hudi_rs.rows(read.incremental(table, since=start)) == [{"id": 1, "p": "a", "v": 2}]
