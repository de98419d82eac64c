"""Reads as Spark DataFrames: the same rows as cowrite's Arrow readers and hudi-rs, and partition pruning."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support import hudi_rs
from support.hudi_rs import rows
from support.tables import frame

from cowrite import process
from cowrite.cleaner import clean, service_lock
from cowrite.errors import BaseFileGoneError, CorruptTimelineError, TimeTravelCleanedError
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.transaction import WriteOptions
from cowrite.spark import incremental, plan_incremental, plan_snapshot, snapshot
from cowrite.storage.backend import Storage

IN_PROCESS = {"hoodie.write.lock.provider": "in-process"}




def writer(table: Table) -> LocalWriter:
    return LocalWriter(table, WriteOptions(config=table.config.with_values(IN_PROCESS)))


def spark_rows(df: Any, with_meta: bool = False) -> list[dict[str, Any]]:
    return rows(df.toArrow(), with_meta)


def test_snapshot_time_travel_and_incremental_match_the_arrow_readers(spark: Any, tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), name="t", record_key_fields=["id"], partition_fields=["p"],
                         ordering_fields=["ts"], hive_style_partitioning=True)  # fmt: skip
    write = writer(table)
    write.insert(frame((1, "a", 1, "a1"), (2, "b", 1, "b2"), (3, "c", 1, "c3")))
    write.upsert(frame((1, "a", 2, "a1-v2"), (4, "b", 1, "b4")))
    write.insert_overwrite(frame((5, "c", 1, "c5")))
    write.delete(pa.table({"id": [2]}))
    timeline = table.timeline()
    for with_meta in (False, True):
        assert spark_rows(snapshot(spark, table, with_meta=with_meta), with_meta) == rows(
            read.snapshot(table, with_meta=with_meta), with_meta
        )  # fmt: skip
    assert spark_rows(snapshot(spark, table)) == hudi_rs.snapshot(table.uri)
    for instant in timeline:
        time = instant.requested_time
        found = spark_rows(snapshot(spark, table, as_of=time, with_meta=True), True)
        assert found == rows(read.snapshot(table, as_of=time, with_meta=True), True)
        assert found == hudi_rs.as_of(table.uri, time, with_meta=True)
    completions = [i.completion_time for i in timeline.data_commits().in_completion_order()]
    for since, until in [*zip([None, *completions], completions, strict=False), (None, None)]:
        found = spark_rows(incremental(spark, table, since, until, with_meta=True), True)
        assert found == rows(read.incremental(table, since, until, with_meta=True), True), (since, until)
        assert found == hudi_rs.incremental(table.uri, since, until, with_meta=True)
    assert spark_rows(snapshot(spark, table, as_of="20000101000000000")) == []
    assert spark_rows(snapshot(spark, table, columns=["v", "id"])) == rows(
        read.snapshot(table, columns=["v", "id"])
    )
    clean(table, service_lock(table), commits_retained=1)  # the first versions of groups a and b go
    with pytest.raises(TimeTravelCleanedError, match="retain more commits"):
        snapshot(spark, table, as_of=min(timeline.requested_times))
    with pytest.raises(BaseFileGoneError, match="was deleted before it was read"):
        incremental(spark, table, None, completions[0])


def test_column_types_read_back_as_written(spark: Any, tmp_path: Path) -> None:
    from decimal import Decimal

    typed = pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "i8": pa.array([-128, None], pa.int8()),
        "i32": pa.array([2**31 - 1, None], pa.int32()),
        "f32": pa.array([1.5, None], pa.float32()),
        "s": pa.array(["größe ✓", None]),
        "b": pa.array([True, None]),
        "d": pa.array([dt.date(9999, 12, 31), None], pa.date32()),
        "ts_us": pa.array([dt.datetime(2026, 1, 1, 12, 0, 0, 123456), None], pa.timestamp("us")),
        "ts_ms_utc": pa.array([dt.datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=dt.UTC), None],
                              pa.timestamp("ms", tz="UTC")),
        "dec": pa.array([Decimal("-12345.67"), None], pa.decimal128(12, 2)),
    })  # fmt: skip
    table = Table.create(str(tmp_path), name="t", record_key_fields=["id"])
    writer(table).insert(typed)
    assert spark_rows(snapshot(spark, table)) == rows(typed)


def test_filters_prune_partitions_before_listing_and_reading(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = Table.create(
        str(tmp_path), name="t", record_key_fields=["id"], partition_fields=["region", "day"],
        hive_style_partitioning=True,
    )  # fmt: skip
    regions, days = ["eu", "us", "ap", None], [dt.date(2026, 1, d) for d in (1, 2, 3)]
    cells = [(r, d) for r in regions for d in days]
    batch = pa.table({
        "id": pa.array(range(len(cells)), pa.int64()), "region": [r for r, _ in cells],
        "day": pa.array([d for _, d in cells], pa.date32()), "v": [f"v{i % 2}" for i in range(len(cells))],
    })  # fmt: skip
    writer(table).insert(batch)
    everything = plan_snapshot(table)
    assert len(everything.files) == 12
    listed: list[str] = []
    kind = type(table.storage)
    original = kind.list

    def counting(self: Storage, directory: str = "") -> list[Any]:
        listed.append(directory)
        return original(self, directory)

    monkeypatch.setattr(kind, "list", counting)
    cases: list[tuple[list[Any], int]] = [
        ([("region", "=", "eu")], 3),
        ([("region", "in", ["eu", "us"]), ("day", ">=", dt.date(2026, 1, 2))], 4),
        ([("region", "is null")], 3),
        ([("day", "<", dt.date(2026, 1, 2)), ("region", "!=", "ap")], 2),
        ([("v", "=", "v1")], 12),  # not a partition column: nothing pruned, rows still filtered
    ]
    for filters, files in cases:
        listed.clear()
        scan = plan_snapshot(table, filters=filters)
        assert len(scan.files) == files, filters
        if files < 12:  # only the matching partitions' directories were listed for files
            partitions = {path.rsplit("/", 1)[0] for path in scan.files}
            assert {path for path in listed if not path.startswith(".hoodie")} == partitions
        df = snapshot(spark, table, filters=filters)
        assert df.rdd.getNumPartitions() == files  # one read task per file
        expected = [r for r in rows(batch) if all(_holds(r, f) for f in filters)]
        assert spark_rows(df) == expected, filters
    # incremental reads prune the same way
    scan = plan_incremental(table, filters=[("region", "=", "us")])
    assert len(scan.files) == 3
    assert spark_rows(incremental(spark, table, filters=[("region", "=", "us")])) == [
        r for r in rows(batch) if r["region"] == "us"
    ]


def _holds(row: dict[str, Any], rule: tuple[Any, ...]) -> bool:
    column, op, *rest = rule
    value = row[column]
    if op == "is null":
        return value is None
    if value is None:
        return False
    target = rest[0]
    checks = {
        "=": lambda: value == target, "!=": lambda: value != target, "<": lambda: value < target,
        ">=": lambda: value >= target, "in": lambda: value in target,
    }  # fmt: skip
    return bool(checks[op]())


def test_a_corrupt_commit_fails_every_spark_read(spark: Any, tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), name="t", record_key_fields=["id"], partition_fields=["p"])
    write = writer(table)
    write.insert(frame((1, "a", 1, "a1")))
    second = write.insert(frame((2, "b", 1, "b2")))
    write.insert(frame((3, "c", 1, "c3")))
    path = table.instant_path(second)
    table.storage.write(path, table.storage.read(path)[:20])
    process.forget()  # as a new process would read it
    first = min(table.timeline().requested_times)
    for read_it in (
        lambda: snapshot(spark, table),
        lambda: snapshot(spark, table, as_of=first),
        lambda: incremental(spark, table, None, None),
    ):
        with pytest.raises(CorruptTimelineError, match=second.file_name):
            read_it()
