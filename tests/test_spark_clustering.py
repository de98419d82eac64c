"""Clustering executed on Spark: the same result as in-process, read back exactly by hudi-rs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from support import hudi_rs

from cowrite.cleaner import service_lock
from cowrite.engine.clustering import execute_clustering, schedule_clustering
from cowrite.format.fs_view import FileSystemView
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.spark.clustering import map_on_spark


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
