"""Bootstrap of a plain parquet dataset into a table, on Spark."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import hudi_rs

from cowrite.cleaner import rollback_failed, service_lock
from cowrite.errors import ConfigError, SchemaError
from cowrite.format.instant import Action, State
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.spark.bootstrap import bootstrap, hive_partition_fields
from cowrite.storage.backend import Storage


def dataset(root: Path) -> list[dict[str, object]]:
    """A hive-style parquet dataset: region=.../day=..., as a data platform already has it."""
    rows = []
    for region in ("eu", "us"):
        for day in (1, 2):
            part = root / f"region={region}" / f"day={day}"
            part.mkdir(parents=True)
            ids = [f"{region}-{day}-{n}" for n in range(3)]
            pq.write_table(
                pa.table({"id": ids, "amount": [n * 1.5 for n in range(3)]}), part / "part-0.parquet"
            )
            rows += [{"id": i, "amount": n * 1.5, "region": region, "day": day} for n, i in enumerate(ids)]
    return sorted(rows, key=lambda r: str(r["id"]))


def test_bootstrap_writes_every_record_once(spark: Any, tmp_path: Path) -> None:
    expected = dataset(tmp_path / "src")
    assert hive_partition_fields(Storage.for_uri(str(tmp_path / "src"))) == ["region", "day"]
    instant = bootstrap(spark, str(tmp_path / "src"), str(tmp_path / "t"), record_key_fields=["id"])
    table = Table.load(str(tmp_path / "t"))
    assert table.partition_fields == ("region", "day") and table.hive_style_partitioning
    assert [(i.action, i.state) for i in table.timeline()] == [(Action.COMMIT, State.COMPLETED)]
    assert table.commit_metadata(instant).operation == "bulk_insert"
    assert (
        hudi_rs.rows(read.snapshot(table))
        == hudi_rs.snapshot(table.uri)
        == hudi_rs.rows(pa.Table.from_pylist(expected))
    )
    LocalWriter(table).upsert(pa.table({"id": ["eu-1-0"], "amount": [9.0], "region": ["eu"], "day": [1]}))
    assert [r["amount"] for r in read.snapshot(table).to_pylist() if r["id"] == "eu-1-0"] == [9.0]


def test_bootstrap_refuses_a_table_with_instants(spark: Any, tmp_path: Path) -> None:
    dataset(tmp_path / "src")
    bootstrap(spark, str(tmp_path / "src"), str(tmp_path / "t"), record_key_fields=["id"])
    with pytest.raises(ConfigError, match="before any other writer"):
        bootstrap(spark, str(tmp_path / "src"), str(tmp_path / "t"), record_key_fields=["id"])


def test_a_dataset_with_a_column_of_an_extension_type_is_refused_with_nothing_made(
    spark: Any, tmp_path: Path
) -> None:
    dataset(tmp_path / "src")
    # a file written from pandas holds periods, which Spark would read as whole numbers; under a name
    # beginning with "_" it is a file Spark leaves out, and so does the check
    weeks = pa.Table.from_pandas(
        pd.DataFrame({"id": ["eu-1-9"], "amount": [1.0], "week": pd.period_range("2024-01-01", periods=1)})
    )
    hidden = tmp_path / "src" / "region=eu" / "day=1" / "_part-1.parquet"
    pq.write_table(weeks, hidden)
    bootstrap(spark, str(tmp_path / "src"), str(tmp_path / "first"), record_key_fields=["id"])
    assert read.snapshot(Table.load(str(tmp_path / "first"))).num_rows == 12

    late = hidden.rename(hidden.with_name("part-1.parquet"))
    refused = f"column week of {late} has the Arrow extension type pandas.period, which cowrite tables"
    with pytest.raises(SchemaError, match=re.escape(refused)):
        bootstrap(spark, str(tmp_path / "src"), str(tmp_path / "t"), record_key_fields=["id"])
    assert not (tmp_path / "t").exists()


def test_a_failed_bootstrap_is_rolled_back_lazily(spark: Any, tmp_path: Path) -> None:
    dataset(tmp_path / "src")
    script = (
        "import sys, os, signal\n"
        "from cowrite.protocol.transaction import Transaction\n"
        "Transaction.commit = lambda self, *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from cowrite.cli import main\n"
        "sys.argv = ['cowrite', 'bootstrap', *sys.argv[1:]]\n"
        "main()\n"
    )
    dest = str(tmp_path / "t")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(tmp_path / "src"),
            dest,
            "--record-key",
            "id",
            "--master",
            "local[1]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == -9, result.stderr
    table = Table.load(dest)
    assert [i.state for i in table.timeline()] == [State.INFLIGHT]
    assert read.snapshot(table).num_rows == 0 and hudi_rs.snapshot(dest) == []
    # The writer keeps its default heartbeat (a short one can lapse while Spark starts on a busy
    # machine); the rollback judges it from a clock moved past the tolerance.
    policy = HeartbeatPolicy.from_config(table.config)
    done = rollback_failed(table, service_lock(table), policy, now=time.time() + policy.tolerance + 1)
    assert len(done) == 1 and [i.action for i in table.timeline()] == [Action.ROLLBACK]
    assert [b for b in Storage.for_uri(dest).walk_files() if b.path.endswith(".parquet")] == []
    instant = bootstrap(spark, str(tmp_path / "src"), dest, record_key_fields=["id"])  # and again, afresh
    assert read.snapshot(table).num_rows == 12 and instant.requested_time > done[0].target
