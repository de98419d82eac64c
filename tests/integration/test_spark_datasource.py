"""The ``cowrite`` Spark data source: inserts and reads with Hudi's option names, and its crash safety."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support import hudi_rs
from support.hudi_rs import rows
from support.tables import frame

from cowrite.cleaner.rollback import rollback_failed
from cowrite.errors import LeaseLostError
from cowrite.format.fs_view import list_base_files
from cowrite.format.markers import MARKER_DIR, marked_files
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.protocol.heartbeat import HeartbeatPolicy, abort_reason, heartbeat_path
from cowrite.protocol.locks import InProcessLock, LockHolder
from cowrite.protocol.transaction import WriteOptions
from cowrite.protocol.txn import Committed, Txn, last_version
from cowrite.spark import SparkWriter, register
from cowrite.spark.datasource import CowriteWriter, _begin_write
from cowrite.spark.executor import stat_from_json
from cowrite.spark.handover import Settings

WRITE = {
    "hoodie.datasource.write.recordkey.field": "id",
    "hoodie.datasource.write.partitionpath.field": "p",
    "hoodie.datasource.write.precombine.field": "ts",
    "hoodie.table.name": "orders",
}




FIRST = frame((1, "a", 1, "a1"), (2, "b", 1, "b2"), (3, "a", 1, "a3"))
SECOND = frame((4, "c", 1, "c4"), (1, "a", 2, "a1-again"))  # an insert appends: key 1 twice


def test_inserts_and_reads_with_hudi_option_names(spark: Any, tmp_path: Path) -> None:
    register(spark)
    path = str(tmp_path / "orders")
    spark.createDataFrame(FIRST).repartition(2).write.format("cowrite").mode("append").options(**WRITE).save(
        path
    )
    table = Table.load(path)
    assert (table.name, table.record_key_fields, table.partition_fields, table.ordering_fields) == (
        "orders", ("id",), ("p",), ("ts",)
    )  # fmt: skip
    bulk = {"hoodie.datasource.write.operation": "bulk_insert"}
    spark.createDataFrame(SECOND).write.format("cowrite").mode("append").options(**bulk).save(path)
    first, second = table.timeline().data_commits().in_completion_order()
    assert [table.commit_metadata(i).operation for i in (first, second)] == ["insert", "bulk_insert"]
    everything = rows(pa.concat_tables([FIRST, SECOND]))
    assert rows(read.snapshot(table)) == everything == hudi_rs.snapshot(path)

    loaded = spark.read.format("cowrite").load(path)
    assert loaded.columns[:5] == ["_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key",
                                  "_hoodie_partition_path", "_hoodie_file_name"]  # fmt: skip
    assert rows(loaded.toArrow(), True) == hudi_rs.snapshot(path, with_meta=True)
    as_of = spark.read.format("cowrite").option("as.of.instant", first.requested_time).load(path)
    assert rows(as_of.toArrow()) == rows(FIRST)
    incremental = {"hoodie.datasource.query.type": "incremental"}
    since = spark.read.format("cowrite").options(**incremental).option(
        "hoodie.datasource.read.begin.instanttime", first.completion_time
    )  # fmt: skip
    assert rows(since.load(path).toArrow()) == rows(SECOND)
    until = spark.read.format("cowrite").options(**incremental).option(
        "hoodie.datasource.read.end.instanttime", first.completion_time
    )  # fmt: skip
    assert rows(until.load(path).toArrow(), True) == hudi_rs.incremental(
        path, None, first.completion_time, with_meta=True
    )  # fmt: skip
    # what a data source write leaves behind: no markers, no heartbeat, every stat a file
    assert not table.storage.walk_files(MARKER_DIR)
    assert not table.storage.exists(heartbeat_path(first.requested_time))
    assert {s.path for i in (first, second) for s in table.commit_metadata(i).write_stats} == {
        b.path for b in list_base_files(table)
    }  # fmt: skip


def test_operations_that_need_a_shuffle_are_refused_before_anything_is_written(
    spark: Any, tmp_path: Path
) -> None:
    register(spark)
    path = str(tmp_path / "orders")
    df = spark.createDataFrame(FIRST)
    df.write.format("cowrite").mode("append").options(**WRITE).save(path)
    table = Table.load(path)
    before = list(table.timeline())
    refused = [
        ({"hoodie.datasource.write.operation": "upsert"}, "append", "SparkWriter"),
        ({}, "overwrite", "append"),
        ({"hoodie.datasource.write.recordkey.field": "v"}, "append", "do not match"),
    ]
    for options, mode, message in refused:
        with pytest.raises(Exception, match=message):
            df.write.format("cowrite").mode(mode).options(**options).save(path)
    with pytest.raises(Exception, match="has no record key column id"):
        df.drop("id").write.format("cowrite").mode("append").save(path)
    assert list(table.timeline()) == before


def test_the_filters_option_prunes_partitions_and_filters_rows(spark: Any, tmp_path: Path) -> None:
    register(spark)
    path = str(tmp_path / "orders")
    spark.createDataFrame(FIRST).coalesce(1).write.format("cowrite").mode("append").options(**WRITE).save(
        path
    )
    filters = '[["p", "=", "a"], ["id", ">=", 2]]'  # p prunes partitions; id only filters rows
    pruned = spark.read.format("cowrite").option("cowrite.read.filters", filters).load(path)
    assert pruned.rdd.getNumPartitions() == 1  # the one base file of partition a
    assert rows(pruned.toArrow()) == [r for r in rows(FIRST) if r["p"] == "a" and r["id"] >= 2]
    assert spark.read.format("cowrite").load(path).rdd.getNumPartitions() == 2


# -- crash safety: the write's steps run here, in this process, without Spark jobs ---------------------------
def begin(spark: Any, path: str) -> CowriteWriter:
    settings = Settings.of({"path": path, **WRITE, "hoodie.write.lock.provider": "filesystem"})
    return _begin_write(settings, spark.createDataFrame(FIRST).schema, overwrite=False)


def test_markers_let_the_rollback_delete_the_files_of_a_crashed_data_source_write(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "orders")
    begin(spark, path).commit([])  # creates the table with an empty commit
    table = Table.load(path)
    writer = begin(spark, path)
    instant = writer.ticket.instant
    message = writer.write(iter(FIRST.to_batches()))  # a task; then the driver dies before commit
    files = sorted(stat_from_json(text).path for text in message.stats)
    assert files and files == marked_files(table.storage, instant)
    assert all(f.endswith(f"_{instant}.parquet") for f in files)
    pending = [i for i in table.timeline().pending() if i.requested_time == instant]
    assert pending and table.storage.exists(f"{MARKER_DIR}/{instant}/{files[0]}.marker.CREATE")
    lock = InProcessLock(table.uri, LockHolder())
    an_hour_later = time.time() + 3600  # the heartbeat is long stale by then
    done = rollback_failed(table, lock, HeartbeatPolicy(), now=an_hour_later)
    assert [d.target for d in done] == [instant] and set(files) <= set(done[0].deleted)
    assert not any(table.storage.exists(f) for f in files)
    assert marked_files(table.storage, instant) == []
    assert rows(read.snapshot(table)) == [] == hudi_rs.snapshot(path)


def test_the_commit_deletes_the_files_of_failed_task_attempts(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "orders")
    begin(spark, path).commit([])
    table = Table.load(path)
    writer = begin(spark, path)
    failed = writer.write(iter(FIRST.to_batches()))  # an attempt that wrote its files, then failed
    retried = writer.write(iter(FIRST.to_batches()))  # the attempt Spark ran again: its message counts
    leftovers = {stat_from_json(text).path for text in failed.stats}
    assert leftovers and all(table.storage.exists(f) for f in leftovers)
    writer.commit([retried])
    instant = table.timeline().data_commits().in_completion_order()[-1]
    assert instant.requested_time == writer.ticket.instant
    reported = {s.path for s in table.commit_metadata(instant).write_stats}
    assert {b.path for b in list_base_files(table)} == reported and not reported & leftovers
    assert not table.storage.walk_files(MARKER_DIR)
    assert rows(read.snapshot(table)) == rows(FIRST) == hudi_rs.snapshot(path)


def test_abort_deletes_marked_files_and_a_stale_lease_is_not_committed(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "orders")
    begin(spark, path).commit([])
    table = Table.load(path)
    aborted = begin(spark, path)
    aborted.write(iter(FIRST.to_batches()))
    aborted.abort([None])  # a task failed: no message, the markers still name its files
    assert abort_reason(table.storage, aborted.ticket.instant) == "error"
    assert [b for b in list_base_files(table) if b.instant_time == aborted.ticket.instant] == []
    late = begin(spark, path)
    message = late.write(iter(FIRST.to_batches()))
    table.storage.delete(heartbeat_path(late.ticket.instant))  # its lease is gone (judged failed)
    with pytest.raises(LeaseLostError):
        late.commit([message])
    assert rows(read.snapshot(table)) == []


def test_txn_options_make_data_source_and_spark_writer_writes_idempotent(spark: Any, tmp_path: Path) -> None:
    register(spark)
    path = str(tmp_path / "orders")
    txn = {"txnAppId": "stream", "txnVersion": "7"}
    spark.createDataFrame(FIRST).write.format("cowrite").mode("append").options(**WRITE, **txn).save(path)
    table = Table.load(path)
    (first,) = table.timeline().data_commits()
    assert last_version(table, "stream") == Committed(7, first.requested_time)
    files = sorted(p.relative_to(path).as_posix() for p in Path(path).rglob("*") if "locks" not in p.parts)

    spark.createDataFrame(SECOND).write.format("cowrite").mode("append").options(**txn).save(path)
    older = {"txnAppId": "stream", "txnVersion": "6"}
    spark.createDataFrame(SECOND).write.format("cowrite").mode("append").options(**older).save(path)
    after = sorted(p.relative_to(path).as_posix() for p in Path(path).rglob("*") if "locks" not in p.parts)
    assert after == files
    assert rows(read.snapshot(table)) == rows(FIRST) == hudi_rs.snapshot(path)

    replay = SparkWriter(table, spark, WriteOptions(config=table.config, txn=Txn("stream", 7)))
    assert replay.upsert(spark.createDataFrame(SECOND)) == first
    assert replay.refused is not None and replay.refused.committed_by == first.requested_time
    newer = SparkWriter(table, spark, WriteOptions(config=table.config, txn=Txn("stream", 8)))
    second = newer.upsert(spark.createDataFrame(SECOND))
    assert second is not None and newer.refused is None
    assert last_version(table, "stream") == Committed(8, second.requested_time)
    assert list(table.timeline().data_commits()) == [first, second]
    with pytest.raises(Exception, match="txnVersion must be a non-negative integer"):
        bad = {"txnAppId": "stream", "txnVersion": "seven"}
        spark.createDataFrame(SECOND).write.format("cowrite").mode("append").options(**bad).save(path)
