"""``import cowrite``: the public API end to end, the old import paths, a start that imports nothing slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from support import hudi_rs

import cowrite


def orders(ids: list[int], region: str, version: int) -> pa.Table:
    return pa.table({"id": ids, "region": [region] * len(ids), "version": [version] * len(ids)})


def test_a_table_written_and_read_through_the_public_api(tmp_path: Path) -> None:
    uri = str(tmp_path / "orders")
    table = cowrite.create(
        uri, name="orders", record_key_fields=["id"], partition_fields=["region"], ordering_fields=["version"]
    )
    first = cowrite.insert(table, orders([1, 2], "eu", 1))
    second = cowrite.upsert(uri, orders([2, 3], "eu", 2))  # a URI is loaded
    cowrite.insert_overwrite(table, orders([9], "us", 1))
    last = cowrite.delete(cowrite.load(uri), pa.table({"id": [1]}))
    expected = hudi_rs.rows(pa.concat_tables([orders([2, 3], "eu", 2), orders([9], "us", 1)]))
    assert hudi_rs.rows(cowrite.snapshot(table)) == hudi_rs.snapshot(uri) == expected
    assert hudi_rs.rows(cowrite.snapshot(table, as_of=first.requested_time)) == hudi_rs.rows(
        orders([1, 2], "eu", 1)
    )
    changed = cowrite.incremental(table, since=first.completion_time, until=second.completion_time)
    assert hudi_rs.rows(changed) == hudi_rs.rows(orders([2, 3], "eu", 2))
    pulled = cowrite.pull(table, None)
    assert pulled.checkpoint == last.completion_time
    assert [(i.action.value, i.is_completed) for i in cowrite.timeline(table)] == [
        ("commit", True), ("commit", True), ("replacecommit", True), ("commit", True)
    ]
    with pytest.raises(cowrite.SchemaError):
        cowrite.upsert(table, pa.table({"id": [4], "region": ["eu"], "version": ["not a number"]}))
    with pytest.raises(cowrite.TableNotFoundError):
        cowrite.load(str(tmp_path / "none"))
    assert issubclass(cowrite.WriteConflictError, cowrite.CowriteError)
    assert all(getattr(cowrite, name) is not None for name in cowrite.__all__)


def test_settings_apply_to_one_write(tmp_path: Path) -> None:
    table = cowrite.create(str(tmp_path / "t"), name="t", record_key_fields=["id"])
    with pytest.raises(cowrite.ConfigError):
        cowrite.insert(table, pa.table({"id": [1]}), settings={"hoodie.write.lock.provider": "nonsense"})
    assert cowrite.snapshot(table).num_rows == 0 and len(cowrite.timeline(table)) == 0


def test_the_import_paths_earlier_readmes_documented_still_work() -> None:
    from cowrite.timeline.errors import WriteConflictError
    from cowrite.timeline.table import Table
    from cowrite.writer import read
    from cowrite.writer.clustering import execute_clustering
    from cowrite.writer.local import LocalWriter

    assert Table is cowrite.Table and LocalWriter is cowrite.LocalWriter
    assert WriteConflictError is cowrite.WriteConflictError
    assert read.pull is not None and callable(execute_clustering)


def test_import_cowrite_loads_nothing_slow() -> None:
    """``python -m cowrite`` catches SIGTERM before anything slow is imported (test_daemon_startup)."""
    probe = (
        "import sys, cowrite, cowrite.shutdown; from cowrite import steps, process; "
        "print([m for m in ('pyarrow', 'fsspec', 'pyspark') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_daemon_command_loads_no_dataframe_engine() -> None:
    """What ``cowrite daemon`` imports (every command's module, the daemon's) leaves pyarrow and pandas
    out: they were most of a daemon's memory, and it reads no data."""
    probe = (
        "import sys, cowrite.cli, cowrite.daemon.service, cowrite.daemon.logs; "
        "print([m for m in ('pyarrow', 'pandas', 'pyspark') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
