"""The Spark engine: every operation against the local engine's exact results, read back with hudi-rs.

Each scenario runs the same batches through :class:`LocalWriter` and :class:`SparkWriter` (the Spark
input is the local input as a DataFrame, so both engines see the same Arrow types) and compares the
row sets after every write, then time travel and incremental reads over the whole history, with cowrite's
readers and with hudi-rs. One SparkSession (local[2]) serves the whole run (the ``spark`` fixture).
"""

from __future__ import annotations

import json
import pickle
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from support import hudi_rs
from support.hudi_rs import Row, rows
from support.request_counts import ProxyProcess, sequential, what
from support.servers import S3Server
from support.tables import frame

from cowrite.cli import cli
from cowrite.engine.file_group import FileGroupWrite, read_base_file
from cowrite.engine.planning import FILE_ID, SizingPolicy, assign_inserts, estimate_record_bytes
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.errors import LeaseLostError, SchemaError, StorageError, WriteConflictError
from cowrite.format.fs_view import FileSystemView, list_base_files
from cowrite.format.instant import Action, Instant, State
from cowrite.format.markers import MARKER_DIR
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import Heartbeat, abort_reason
from cowrite.protocol.transaction import WriteOptions
from cowrite.spark import SparkJobError, SparkWriter, indexing, merging
from cowrite.spark import engine as engine_module
from cowrite.spark.batching import MAX_BYTES, MAX_RECORDS, UNCHECKED_BYTES, ArrowBatches
from cowrite.spark.errors import translate
from cowrite.spark.executor import BUCKET, POSITION, TASK, TableSpec, stamp
from cowrite.spark.plan import route_keys, spark_hash
from cowrite.spark.routing import AssignBuckets, AttachRoutes, Segments
from cowrite.spark.writing import BucketWrite, WriteContext

IN_PROCESS = {"hoodie.write.lock.provider": "in-process"}




def keys_only(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


def create(uri: str, storage_options: dict[str, Any] | None = None, **kwargs: Any) -> Table:
    arguments: dict[str, Any] = {"name": "t", "record_key_fields": ["id"]}
    return Table.create(uri, storage_options=storage_options, **{**arguments, **kwargs})


def twins(tmp_path: Path, **kwargs: Any) -> tuple[Table, Table]:
    """Two tables alike, one for the local engine and one for Spark, to compare what each writes."""
    return create(str(tmp_path / "local"), **kwargs), create(str(tmp_path / "spark"), **kwargs)


def local_writer(table: Table) -> LocalWriter:
    return LocalWriter(table, WriteOptions(config=table.config.with_values(IN_PROCESS)))


def snapshot(table: Table, **kwargs: Any) -> list[Row]:
    return rows(read.snapshot(table, **kwargs), kwargs.get("with_meta", False))


def assert_hudi_rs_agrees(table: Table, storage_options: dict[str, Any] | None = None) -> None:
    """hudi-rs and cowrite read the same rows (meta columns included) in every way, at every instant."""
    uri, options = table.uri, storage_options
    assert hudi_rs.snapshot(uri, options, with_meta=True) == rows(read.snapshot(table, with_meta=True), True)
    timeline = table.timeline()
    for instant in timeline:
        mine = rows(read.snapshot(table, as_of=instant.requested_time, with_meta=True), True)
        assert hudi_rs.as_of(uri, instant.requested_time, options, with_meta=True) == mine, instant
    completions = [i.completion_time for i in timeline.data_commits().in_completion_order()]
    for since, until in zip([None, *completions], completions, strict=False):
        mine = rows(read.incremental(table, since, until, with_meta=True), True)
        assert hudi_rs.incremental(uri, since, until, options, with_meta=True) == mine, (since, until)


def history(table: Table) -> list[Instant]:
    return list(table.timeline().data_commits().in_completion_order())


def assert_same_history(spark_table: Table, local_table: Table) -> None:
    """Same rows as of every instant and in every incremental step; same commit metadata shape."""
    mine, theirs = history(spark_table), history(local_table)
    assert [(i.action, i.state) for i in mine] == [(i.action, i.state) for i in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert snapshot(spark_table, as_of=a.requested_time) == snapshot(local_table, as_of=b.requested_time)
        ma, mb = spark_table.commit_metadata(a), local_table.commit_metadata(b)
        assert (ma.operation, ma.schema, sorted(ma.replaced_file_ids)) == (
            mb.operation, mb.schema, sorted(mb.replaced_file_ids)
        )  # fmt: skip
        totals = [
            tuple(sum(getattr(s, f) for s in m.write_stats) for f in ("num_writes", "num_inserts",
                  "num_update_writes", "num_deletes"))
            for m in (ma, mb)
        ]  # fmt: skip
        assert totals[0] == totals[1], a
    for (s1, u1), (s2, u2) in zip(steps(mine), steps(theirs), strict=True):
        assert rows(read.incremental(spark_table, s1, u1)) == rows(read.incremental(local_table, s2, u2))


def steps(instants: Sequence[Instant]) -> list[tuple[str | None, str | None]]:
    completions = [i.completion_time for i in instants]
    return list(zip([None, *completions], completions, strict=False))


def assert_stats_describe_files(table: Table) -> None:
    sizes = {i.path: i.size for i in table.storage.walk_files() if i.path.endswith(".parquet")}
    for instant in history(table):
        for stat in table.commit_metadata(instant).write_stats:
            assert stat.path in sizes and stat.file_size == sizes[stat.path], stat
            assert stat.path.endswith(f"_{instant.requested_time}.parquet")
            with table.storage.open_input(stat.path) as stream:
                assert pq.ParquetFile(stream).metadata.num_rows == stat.num_writes


BATCHES: list[tuple[str, pa.Table]] = [
    ("insert", frame((1, "a", 1, "a1"), (2, "a", 1, "a2"), (3, "b", 1, "b3"), (4, "b", 1, "b4"),
                     (5, "c", 1, "c5"))),
    ("upsert", frame((1, "a", 2, "a1-v2"), (3, "b", 0, "stale"), (6, "c", 1, "c6"), (6, "c", 1, "c6-tie"),
                     (7, "d", 3, "d7"), (7, "d", 2, "d7-smaller"))),
    ("delete", keys_only(2, 99)),  # without partition columns: found by key in every partition
    ("delete", frame((1, "b", 0, ""), (5, "c", 0, ""))),  # with them: only there (1 is not in b)
    ("insert", frame((8, "a", 1, "a8"), (9, "e", 1, "e9"))),
    ("insert_overwrite", frame((10, "d", 1, "d10"), (10, "d", 2, "d10-v2"))),
    ("upsert", frame((8, "a", 1, "a8-tie"), (4, "b", 5, "b4-v5"))),
]  # fmt: skip
EXPECTED = rows(frame((1, "a", 2, "a1-v2"), (3, "b", 1, "b3"), (4, "b", 5, "b4-v5"), (6, "c", 1, "c6-tie"),
                      (8, "a", 1, "a8-tie"), (9, "e", 1, "e9"), (10, "d", 2, "d10-v2")))  # fmt: skip


@pytest.mark.parametrize("routing", ["held-on-the-driver", "routed-on-the-driver", "in-tasks"])
def test_every_operation_matches_the_local_engine(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, routing: str
) -> None:
    if routing == "routed-on-the-driver":  # as for an input whose rows Spark does not know in advance
        monkeypatch.setattr(merging, "row_count", lambda df: None)
    options = {"partition_fields": ["p"], "ordering_fields": ["ts"]}
    local_table, spark_table = twins(tmp_path, **options)
    local, engine = local_writer(local_table), SparkWriter(spark_table, spark)
    for operation, batch in BATCHES:
        local.write(batch, operation)
        if routing == "in-tasks":  # as for inputs too large to broadcast: routed and joined in tasks
            spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
        try:
            instant = engine.write(spark.createDataFrame(batch), operation)
        finally:
            spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
        assert instant.is_completed
        merge = operation != "insert"
        assert engine.metrics.routed_on_driver is (routing != "in-tasks" and merge)
        assert engine.metrics.deduplicated_on_driver is (routing == "held-on-the-driver" and merge)
        assert snapshot(spark_table) == snapshot(local_table), operation
    assert snapshot(spark_table) == EXPECTED
    assert hudi_rs.snapshot(spark_table.uri) == EXPECTED
    assert_same_history(spark_table, local_table)
    assert_stats_describe_files(spark_table)
    assert_hudi_rs_agrees(spark_table)
    # meta columns as the local engine writes them: commit times of copied rows kept, files named
    by_key = {r["_hoodie_record_key"]: r for r in snapshot(spark_table, with_meta=True)}
    latest = {b.name for b in FileSystemView.build(spark_table).latest_base_files()}
    assert {r["_hoodie_file_name"] for r in by_key.values()} == latest
    first = history(spark_table)[0].requested_time
    assert by_key["3"]["_hoodie_commit_time"] == first  # the stale update lost: b3 is copied unchanged
    assert all(r["_hoodie_commit_seqno"].startswith(r["_hoodie_commit_time"] + "_") for r in by_key.values())


@pytest.mark.parametrize("held", [True, False], ids=["held-on-the-driver", "persisted"])
def test_empty_inputs_write_what_the_local_engine_writes(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    if not held:
        monkeypatch.setattr(merging, "row_count", lambda df: None)
    options = {"partition_fields": ["p"], "ordering_fields": ["ts"]}
    local_table, spark_table = twins(tmp_path, **options)
    local, engine = local_writer(local_table), SparkWriter(spark_table, spark)
    first = frame((1, "a", 1, "a1"), (2, "b", 1, "b2"))
    local.insert(first)
    engine.insert(spark.createDataFrame(first))
    for operation in ("insert", "upsert", "delete", "insert_overwrite"):
        local.write(frame(), operation)
        assert engine.write(spark.createDataFrame(frame()), operation).is_completed
        assert snapshot(spark_table) == snapshot(local_table) == rows(first), operation
    assert_same_history(spark_table, local_table)


def test_composite_keys_and_several_hive_style_partition_fields(spark: Any, tmp_path: Path) -> None:
    import datetime as dt

    options = {"record_key_fields": ["id", "v"], "partition_fields": ["p", "day"], "ordering_fields": ["ts"],
               "hive_style_partitioning": True}  # fmt: skip
    local_table, spark_table = twins(tmp_path, **options)
    day = [dt.date(2026, 1, 2), dt.date(2026, 1, 3)]

    def batch(*records: tuple[Any, ...]) -> pa.Table:
        ids, vs, ps, days, ts = zip(*records, strict=True)
        return pa.table({
            "id": pa.array(ids, pa.int64()), "v": pa.array(vs, pa.string()), "p": pa.array(ps, pa.string()),
            "day": pa.array([day[d] for d in days], pa.date32()), "ts": pa.array(ts, pa.int64()),
        })  # fmt: skip

    steps = [
        (
            "insert",
            batch((1, "x", "eu", 0, 1), (1, "y", "eu", 0, 1), (2, "x", None, 1, 1), (3, "x", "us", 1, 1)),
        ),
        ("upsert", batch((1, "y", "eu", 0, 5), (2, "x", None, 1, 0), (4, "z", "us", 1, 1))),
        ("delete", batch((3, "x", "us", 1, 0))),
    ]
    local, engine = local_writer(local_table), SparkWriter(spark_table, spark)
    for operation, data in steps:
        local.write(data, operation)
        engine.write(spark.createDataFrame(data), operation)
        assert _keyed(spark_table) == _keyed(local_table), operation
    paths = {r["_hoodie_partition_path"] for r in snapshot(spark_table, with_meta=True)}
    assert paths == {
        "p=eu/day=2026-01-02",
        "p=__HIVE_DEFAULT_PARTITION__/day=2026-01-03",
        "p=us/day=2026-01-03",
    }
    assert {r["_hoodie_record_key"] for r in snapshot(spark_table, with_meta=True)} == {
        "id:1,v:x", "id:1,v:y", "id:2,v:x", "id:4,v:z"
    }  # fmt: skip
    assert_hudi_rs_agrees(spark_table)


def _keyed(table: Table) -> list[Row]:
    """Rows with the meta columns two tables share (record key, partition path): not the instants."""
    varying = ["_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_file_name"]
    return rows(read.snapshot(table, with_meta=True).drop_columns(varying), True)


def test_bulk_insert_writes_new_file_groups_sorted_by_partition_and_key(spark: Any, tmp_path: Path) -> None:
    table = create(str(tmp_path / "t"), partition_fields=["p"])
    settings = {"hoodie.bulkinsert.shuffle.parallelism": "1"}  # one sort task: one file per partition
    engine = SparkWriter(table, spark, WriteOptions(config=table.config.with_values(settings)))
    engine.insert(spark.createDataFrame(frame((0, "a", 1, "small"))))
    small = {b.path for b in list_base_files(table)}
    batch = frame(*((i, "abc"[i % 3], 1, f"v{i}") for i in range(1, 31)))
    instant = engine.bulk_insert(spark.createDataFrame(batch).repartition(3))
    assert table.commit_metadata(instant).operation == "bulk_insert"
    assert snapshot(table) == rows(pa.concat_tables([frame((0, "a", 1, "small")), batch]))
    # no small file filling: the first file stays as it was, every file of the bulk insert is new
    stats = table.commit_metadata(instant).write_stats
    assert all(s.prev_commit == "null" and s.num_inserts == s.num_writes for s in stats)
    assert small <= {b.path for b in FileSystemView.build(table).latest_base_files()}
    # sorted by partition, the rows of each partition come together: one new file each, in key order
    assert sorted(s.partition_path for s in stats) == ["a", "b", "c"]
    for stat in stats:
        ids = read_base_file(table.storage, stat.path).column("id").to_pylist()
        assert ids == sorted(ids) and len(ids) == 10, stat.path
    assert_hudi_rs_agrees(table)


# -- the index ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tagging", ["held-on-the-driver", "in-place", "range-partitioned"])
def test_upsert_tags_keys_across_file_groups_and_prunes_by_footer_key_ranges(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tagging: str
) -> None:
    if tagging != "held-on-the-driver":  # as for an input whose rows Spark does not know in advance
        monkeypatch.setattr(merging, "row_count", lambda df: None)
    if tagging == "range-partitioned":  # as for a large table: every task reading every file costs too much
        monkeypatch.setattr(indexing, "IN_PLACE_INDEX_BYTES", -1)
    options = {"partition_fields": ["p"], "ordering_fields": ["ts"]}
    local_table, spark_table = twins(tmp_path, **options)
    # string keys, written in key order by one task: every file group holds one contiguous key range
    batch = pa.table({
        "id": [f"k{i:03d}" for i in range(40)], "p": ["x"] * 20 + ["y"] * 20,
        "ts": pa.array([1] * 40, pa.int64()), "v": [f"v{i}" for i in range(40)],
    })  # fmt: skip
    settings = {"hoodie.parquet.max.file.size": "80"}  # about 5 of these records per file
    local = LocalWriter(
        local_table, WriteOptions(config=local_table.config.with_values({**IN_PROCESS, **settings}))
    )
    engine = SparkWriter(spark_table, spark, WriteOptions(config=spark_table.config.with_values(settings)))
    local.insert(batch)
    engine.insert(spark.createDataFrame(batch).coalesce(1))
    keys_of = {
        (b.partition, b.file_id): set(read_file(spark_table, b.path).column("_hoodie_record_key").to_pylist())
        for b in FileSystemView.build(spark_table).latest_base_files()
    }
    assert len(keys_of) >= 6  # several file groups per partition

    upsert = pa.table({
        "id": ["k001", "k018", "k025", "k039", "k100"], "p": ["x", "x", "y", "y", "y"],
        "ts": pa.array([2, 2, 0, 2, 1], pa.int64()), "v": ["new1", "new18", "stale25", "new39", "new100"],
    })  # fmt: skip
    local.upsert(upsert)
    instant = engine.upsert(spark.createDataFrame(upsert).repartition(2))
    assert engine.metrics.deduplicated_on_driver is (tagging == "held-on-the-driver")
    assert engine.metrics.tagged_in_place is (tagging == "in-place")
    assert snapshot(spark_table) == snapshot(local_table)
    # each updated key's file group got a new slice; no other group was touched
    stats = spark_table.commit_metadata(instant).write_stats
    touched = {(s.partition_path, s.file_id) for s in stats if s.prev_commit != "null"}
    holding = {group for group, found in keys_of.items() if found & {"k001", "k018", "k025", "k039"}}
    assert touched == holding and len(touched) >= 3
    # the stale update lost to the stored record: its file group is rewritten with the old row
    assert sum(s.num_update_writes for s in stats) == 3 and sum(s.num_inserts for s in stats) == 1
    # keys k001..k039 sit in the x and y files; a batch within one file's range reads one file's keys
    pruned_batch = pa.table({"id": ["k001"], "p": ["x"], "ts": pa.array([3], pa.int64()), "v": ["again"]})
    engine.upsert(spark.createDataFrame(pruned_batch))
    files_in_x = [b for b in FileSystemView.build(spark_table).latest_base_files() if b.partition == "x"]
    assert engine.metrics.index_files == len(files_in_x) > 1
    assert engine.metrics.index_files_pruned == len(files_in_x) - 1
    assert engine.metrics.index_files_read == 1
    assert_hudi_rs_agrees(spark_table)


def read_file(table: Table, path: str) -> pa.Table:
    with table.storage.open_input(path) as stream:
        return pq.read_table(stream)


# -- file sizing -------------------------------------------------------------------------------------------
def numbered(start: int, count: int) -> pa.Table:
    return frame(*((i, "p", 1, f"value-{i:06d}") for i in range(start, start + count)))


def group_sizes(table: Table) -> list[int]:
    return sorted(
        pq.read_metadata(str(Path(table.uri) / b.path)).num_rows
        for b in FileSystemView.build(table).latest_base_files()
    )


def ten_records_size(tmp_path: Path) -> int:
    """The size of a base file of ten ``numbered`` records, to size the small file limits of a test by."""
    probe = create(str(tmp_path / "probe"))
    local_writer(probe).insert(numbered(0, 10))
    (base,) = list_base_files(probe)
    return base.size


def test_inserts_fill_small_file_groups_then_open_new_ones_of_the_target_size(
    spark: Any, tmp_path: Path
) -> None:
    size = ten_records_size(tmp_path)
    target = 2 * size + size // 20  # room for 10 more records of the first file's size, then 20
    properties = {"hoodie.parquet.max.file.size": str(target), "hoodie.parquet.small.file.limit": str(target)}
    local_table = create(str(tmp_path / "local"), properties=properties)
    spark_table = create(str(tmp_path / "spark"), properties=properties)
    local, engine = local_writer(local_table), SparkWriter(spark_table, spark)
    for start, count in ((0, 10), (10, 25)):
        local.insert(numbered(start, count))
        engine.insert(spark.createDataFrame(numbered(start, count)).coalesce(1))  # one task: one order
    assert group_sizes(spark_table) == group_sizes(local_table) == [15, 20]
    assert snapshot(spark_table) == snapshot(local_table)
    assert engine.metrics.routed_file_groups == 1  # the small file group; the new one stayed local
    # several tasks: small file groups are filled first, as assign_inserts decides for this table (file
    # ids are random, so which file the size estimate comes from differs between two tables); the rest
    # goes to new file groups, none over the target
    view = FileSystemView.build(spark_table)
    record_bytes = estimate_record_bytes(view, spark_table.storage, numbered(35, 40), [""])
    sizing = SizingPolicy(target, target, record_bytes)
    rows_of = {
        b.file_id: pq.read_metadata(str(Path(spark_table.uri) / b.path)).num_rows
        for b in view.latest_base_files()
    }
    decided = sorted(
        rows_of[f] + n for f, base, n in assign_inserts("", 40, view, sizing) if base is not None
    )
    local.insert(numbered(35, 40))
    second = engine.insert(spark.createDataFrame(numbered(35, 40)).repartition(2))
    stats = spark_table.commit_metadata(second).write_stats
    assert decided and sorted(s.num_writes for s in stats if s.prev_commit != "null") == decided
    assert sum(s.num_inserts for s in stats) == 40
    assert all(s.num_writes <= sizing.records_per_file for s in stats if s.prev_commit == "null")
    assert snapshot(spark_table) == snapshot(local_table) == rows(numbered(0, 75))
    assert_hudi_rs_agrees(spark_table)


def test_an_insert_fills_the_small_file_groups_of_the_partitions_it_writes_only(
    spark: Any, tmp_path: Path
) -> None:
    size = ten_records_size(tmp_path)
    target = 3 * size  # room for about 20 more records in each first file
    properties = {"hoodie.parquet.max.file.size": str(target), "hoodie.parquet.small.file.limit": str(target)}
    local_table = create(str(tmp_path / "local"), partition_fields=["p"], properties=properties)
    spark_table = create(str(tmp_path / "spark"), partition_fields=["p"], properties=properties)
    local, engine = local_writer(local_table), SparkWriter(spark_table, spark)

    def batch(start: int, partitions: str, count: int) -> pa.Table:
        return frame(
            *((i, partitions[i % len(partitions)], 1, f"value-{i:06d}") for i in range(start, start + count))
        )

    first = batch(0, "abc", 30)
    local.insert(first)
    engine.insert(spark.createDataFrame(first).coalesce(1))
    before = {b.partition: b for b in FileSystemView.build(spark_table).latest_base_files()}
    view = FileSystemView.build(spark_table)
    sizing = SizingPolicy(
        target, target, estimate_record_bytes(view, spark_table.storage, first, sorted(view.partitions))
    )
    (room,) = [n for _, b, n in assign_inserts("a", 1000, view, sizing) if b is not None]
    second = batch(30, "ad", 120)  # 60 records of a: more than its small file group takes; d is new
    local.insert(second)
    instant = engine.insert(spark.createDataFrame(second).repartition(3))
    stats = spark_table.commit_metadata(instant).write_stats
    filled = [s for s in stats if s.prev_commit != "null"]
    assert [(s.partition_path, s.file_id, s.num_inserts) for s in filled] == [
        ("a", before["a"].file_id, room)
    ]
    assert sum(s.num_inserts for s in stats) == 120 and {s.partition_path for s in stats} == {"a", "d"}
    assert all(s.num_writes <= sizing.records_per_file for s in stats if s.prev_commit == "null")
    after = {b.partition: b for b in FileSystemView.build(spark_table).latest_base_files()}
    assert after["b"] == before["b"] and after["c"] == before["c"]  # untouched partitions keep theirs
    assert snapshot(spark_table) == snapshot(local_table) == rows(pa.concat_tables([first, second]))
    assert not spark_table.storage.walk_files(MARKER_DIR)
    assert_stats_describe_files(spark_table)
    assert_hudi_rs_agrees(spark_table)


def test_two_inserts_filling_one_small_file_group_at_once_conflict(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An insert's plan names no file group (its tasks choose), so whether two inserts filled the same
    small file group is found at commit, from the stats: one commits, the other conflicts and leaves
    nothing; retried, it fills what the winner left."""
    import threading

    from cowrite.errors import WriteConflictError
    from cowrite.protocol.transaction import Transaction

    table = create(str(tmp_path / "t"), partition_fields=["p"])
    first = frame((1, "a", 1, "a1"))
    SparkWriter(table, spark).insert(spark.createDataFrame(first))
    barrier = threading.Barrier(2, timeout=120)
    commit = Transaction.commit

    def both_written_then_commit(self: Transaction, *args: Any, **kwargs: Any) -> Instant:
        barrier.wait()  # both inserts have written their files: their lifetimes overlap
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(Transaction, "commit", both_written_then_commit)
    batches = [frame((2, "a", 1, "a2")), frame((3, "a", 1, "a3"))]
    outcomes: list[Any] = [None, None]

    def insert(n: int) -> None:
        try:
            outcomes[n] = SparkWriter(table, spark).insert(spark.createDataFrame(batches[n]))
        except Exception as exc:
            outcomes[n] = exc
            barrier.abort()

    threads = [threading.Thread(target=insert, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [n for n in (0, 1) if isinstance(outcomes[n], Instant)]
    lost = [n for n in (0, 1) if isinstance(outcomes[n], WriteConflictError)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    (winner,) = won
    committed = {s.path for i in history(table) for s in table.commit_metadata(i).write_stats}
    assert {b.path for b in list_base_files(table)} == committed  # the loser's files are gone
    assert not table.storage.walk_files(MARKER_DIR)
    assert snapshot(table) == rows(pa.concat_tables([first, batches[winner]])) == hudi_rs.snapshot(table.uri)
    monkeypatch.setattr(Transaction, "commit", commit)
    SparkWriter(table, spark).insert(spark.createDataFrame(batches[lost[0]]))  # as a retry would
    assert snapshot(table) == rows(pa.concat_tables([first, *batches]))
    assert len({b.file_id for b in list_base_files(table)}) == 1  # one file group, a slice per commit


# -- appends where the records are -----------------------------------------------------------------------
def spark_jobs(spark: Any, action: Callable[[], Any]) -> int:
    """The Spark jobs ``action`` ran (counted by job group, as the benchmark counts them)."""
    context = spark.sparkContext
    group = f"jobs-{uuid.uuid4().hex}"
    context.setJobGroup(group, group)
    try:
        action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return len(context.statusTracker().getJobIdsForGroup(group))


def test_an_insert_without_small_file_groups_to_fill_is_one_spark_job(spark: Any, tmp_path: Path) -> None:
    table = create(str(tmp_path / "t"), partition_fields=["p"], ordering_fields=["ts"])
    engine = SparkWriter(table, spark)
    first = frame(*((i, "abc"[i % 3], 1, f"v{i}") for i in range(30)))
    cached = spark.createDataFrame(first).repartition(2).cache()
    cached.count()
    # a cached input: Spark knows the size of its rows, and nothing is persisted or counted first
    assert spark_jobs(spark, lambda: engine.insert(cached)) == 1
    assert engine.metrics.persisted == [] and engine.metrics.input_rows == 30
    (instant,) = list(table.timeline())
    assert (instant.action, instant.state) == (Action.COMMIT, State.COMPLETED)
    stats = table.commit_metadata(instant).write_stats
    assert engine.metrics.file_groups == len(stats) and sorted(s.partition_path for s in stats) == sorted(
        ["a", "b", "c"] * 2
    )  # each task wrote its own records: one file group per task and partition
    assert snapshot(table) == rows(first) == hudi_rs.snapshot(table.uri)
    assert not table.storage.walk_files(MARKER_DIR) and not table.storage.walk_files(".hoodie/.heartbeat")
    assert_stats_describe_files(table)
    cached.unpersist()

    # those file groups are small now: a job over the partition column finds the partitions to look in,
    # the next insert's tasks set aside their share for them, and a second stage, after a shuffle by
    # partition, fills them — still nothing counted or persisted first
    second = frame(*((i, "abc"[i % 3], 1, f"v{i}") for i in range(30, 40)))
    assert spark_jobs(spark, lambda: engine.insert(spark.createDataFrame(second))) == 3
    assert engine.metrics.routed_file_groups > 0 and engine.metrics.persisted == []
    # bulk_insert never fills: one job, whatever the table holds (GLOBAL_SORT: a range shuffle, whose
    # sampling and map stage are jobs of their own);
    # an input Spark knows nothing about is sampled when the table has no files to size by, not here
    third = frame(*((i, "abc"[i % 3], 1, f"v{i}") for i in range(40, 50)))
    for mode, jobs in (("NONE", 1), ("PARTITION_SORT", 1), ("GLOBAL_SORT", 3)):
        settings = {"hoodie.bulkinsert.sort.mode": mode}
        bulk = SparkWriter(table, spark, WriteOptions(config=table.config.with_values(settings)))
        assert spark_jobs(spark, partial(bulk.bulk_insert, spark.createDataFrame(third))) == jobs, mode
        assert bulk.metrics.persisted == [] and bulk.metrics.routed_file_groups == 0
    assert snapshot(table) == rows(pa.concat_tables([first, second, third, third, third]))
    assert_stats_describe_files(table)
    assert_hudi_rs_agrees(table)
    # and an upsert of a few cached rows: collected and deduplicated on the driver (one job of the JVM
    # alone), tagged by Python tasks, routed and written after a shuffle (two jobs)
    update = spark.createDataFrame(frame((100, "a", 2, "new"), (100, "a", 1, "older"))).cache()
    update.count()
    assert spark_jobs(spark, lambda: engine.upsert(update)) == 4
    assert engine.metrics.deduplicated_on_driver and engine.metrics.input_rows == 1
    update.unpersist()


def test_files_of_failed_task_attempts_are_deleted_before_the_commit(spark: Any, tmp_path: Path) -> None:
    """A task attempt that failed after writing left marked files nobody reports: the commit deletes them.

    Spark runs a local[2] task once, so the failed attempt is played by the input itself: before handing
    its rows on, each task writes them as files of the running instant, as an earlier attempt would have.
    """
    table = create(str(tmp_path / "t"), partition_fields=["p"])
    uri = table.uri
    strays = spark.sparkContext.accumulator(0)

    def as_a_failed_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from cowrite.spark.append import NewFileGroups
        from cowrite.spark.executor import TableSpec

        loaded = Table.load(uri)
        running = loaded.timeline().pending().last
        if running is None:  # the sample that sizes the batches, before the instant begins
            yield from batches
            return
        attempt = NewFileGroups(
            TableSpec.of(loaded, loaded.config),
            running.requested_time,
            "x",
            ("id", "p", "ts", "v"),
            1 << 20,
            None,
        )
        held = list(batches)
        strays.add(len(list(attempt.write(held, 0, "0-999-0"))))
        yield from held

    batch = frame(*((i, "ab"[i % 2], 1, f"v{i}") for i in range(20)))
    df = spark.createDataFrame(batch).repartition(2)
    instant = SparkWriter(table, spark).insert(df.mapInArrow(as_a_failed_attempt, df.schema))
    assert strays.value >= 2  # each task left files of the instant behind
    stats = table.commit_metadata(instant).write_stats
    on_disk = {b.path for b in list_base_files(table)}
    assert on_disk == {s.path for s in stats} and not any("_0-999-0_" in p for p in on_disk)
    assert not table.storage.walk_files(MARKER_DIR)
    assert snapshot(table) == rows(batch) == hudi_rs.snapshot(table.uri)


# -- failures ----------------------------------------------------------------------------------------------
def test_input_errors_are_the_local_engines_and_come_before_anything_is_written(
    spark: Any, tmp_path: Path
) -> None:
    options = {"partition_fields": ["p"], "ordering_fields": ["ts"]}
    local_table, spark_table = twins(tmp_path, **options)
    cases = [
        ("insert", frame((1, "a", 1, "x")).drop_columns(["id"])),
        ("insert", frame((1, "a", 1, "x")).drop_columns(["p"])),
        ("upsert", frame((1, "a", 1, "x")).drop_columns(["ts"])),
        ("upsert", pa.table({"id": pa.array([1, None], pa.int64()), "p": ["a", "a"],
                             "ts": pa.array([1, 1], pa.int64())})),
    ]  # fmt: skip
    for operation, batch in cases:
        with pytest.raises(SchemaError) as expected:
            local_writer(local_table).write(batch, operation)
        with pytest.raises(SchemaError) as found:
            SparkWriter(spark_table, spark).write(spark.createDataFrame(batch), operation)
        assert str(found.value) == str(expected.value)
    assert list(spark_table.timeline()) == [] and list_base_files(spark_table) == []


def test_data_frames_are_held_to_the_tables_schema_as_the_local_engine_holds_arrow_tables(
    spark: Any, tmp_path: Path
) -> None:
    local_table, spark_table = twins(tmp_path, partition_fields=["p"], ordering_fields=["ts"])
    def record(id_: int, p: str, ts: pa.Array, **more: list[Any]) -> pa.Table:
        return pa.table({"id": pa.array([id_], pa.int64()), "p": [p], "ts": ts, **more})

    seed = record(1, "a", pa.array([1], pa.int32()), v=["x"])
    # narrower (a short into an int) is cast, a missing column is null, a new one is added
    evolving = record(2, "a", pa.array([2], pa.int16()), w=[1.5])
    wider = record(3, "b", pa.array([2**40], pa.int64()))  # the ordering column widens to long
    for batch, operation in ((seed, "insert"), (evolving, "upsert"), (wider, "upsert")):
        local_writer(local_table).write(batch, operation)
        SparkWriter(spark_table, spark).write(spark.createDataFrame(batch), operation)
    assert snapshot(spark_table) == snapshot(local_table) == [
        {"id": 1, "p": "a", "ts": 1, "v": "x", "w": None},
        {"id": 2, "p": "a", "ts": 2, "v": None, "w": 1.5},
        {"id": 3, "p": "b", "ts": 2**40, "v": None, "w": None},
    ]
    # (time travel is not compared: before "w" existed, cowrite shows the table without it, hudi-rs with it)
    mine = rows(read.snapshot(spark_table, with_meta=True), True)
    assert hudi_rs.snapshot(spark_table.uri, with_meta=True) == mine
    misfit = record(4, "a", pa.array([1], pa.int64()), v=[7])
    with pytest.raises(SchemaError) as expected:
        local_writer(local_table).upsert(misfit)
    with pytest.raises(SchemaError) as found:
        SparkWriter(spark_table, spark).upsert(spark.createDataFrame(misfit))
    assert str(found.value) == str(expected.value)
    assert "column v of input does not fit the table: the table's type is string, the input's is long" in str(
        found.value
    )
    assert len(list(spark_table.timeline())) == 3


def test_a_spark_upsert_and_a_concurrent_upsert_of_one_new_key_conflict(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Spark engine records the keys it wrote as the local engine does; a local upsert that inserts the
    same new key while the Spark upsert writes wins, and the Spark upsert aborts naming the key."""
    table = create(  # no small file group to fill: each write opens a file group of its own
        str(tmp_path / "t"), partition_fields=["p"], ordering_fields=["ts"],
        properties={"hoodie.parquet.small.file.limit": "0"},
    )
    local_writer(table).insert(frame((1, "a", 1, "x")))
    merge = engine_module.SparkWriter._merge

    def merge_while_another_upserts(self: SparkWriter, *args: Any, **kwargs: Any) -> Any:
        metadata = merge(self, *args, **kwargs)
        # commits first, under the table's lock as the Spark writer does (every writer of a table must
        # use the same lock: it is what tells a committer what the others published)
        LocalWriter(table).upsert(frame((2, "a", 1, "local")))
        return metadata

    monkeypatch.setattr(engine_module.SparkWriter, "_merge", merge_while_another_upserts)
    with pytest.raises(WriteConflictError, match="records with the same keys.*a/2"):
        SparkWriter(table, spark).upsert(spark.createDataFrame(frame((2, "a", 1, "spark"))))
    assert sorted((r["id"], r["v"]) for r in read.snapshot(table).to_pylist()) == [(1, "x"), (2, "local")]
    assert sorted((r["id"], r["v"]) for r in hudi_rs.snapshot(table.uri)) == [(1, "x"), (2, "local")]


def test_input_errors_of_an_insert_come_from_its_tasks_and_abort_the_write(
    spark: Any, tmp_path: Path
) -> None:
    """An insert that writes where its records are has no pass before the instant to find bad rows in:
    its tasks raise the local engine's error, and the write aborts — nothing committed, nothing left."""
    from pyspark.sql import functions as F

    local_table = create(str(tmp_path / "local"), partition_fields=["p"])
    reserved = pa.table({"id": [1], "p": ["metadata"], "ts": pa.array([1], pa.int64())})
    with pytest.raises(SchemaError) as expected:
        local_writer(local_table).insert(reserved)
    table = create(str(tmp_path / "reserved"), partition_fields=["p"])
    with pytest.raises(SchemaError) as found:
        SparkWriter(table, spark).insert(spark.createDataFrame(reserved))
    assert str(found.value) == str(expected.value)
    assert_aborted_without_a_trace(table)

    # a null key in the task's third chunk of rows: base files of the first chunks are written by then
    table = create(str(tmp_path / "null-key"), partition_fields=["p"])
    settings = {"hoodie.parquet.max.file.size": str(256 << 10)}  # some thousand records per file
    engine = SparkWriter(table, spark, WriteOptions(config=table.config.with_values(settings)))
    rows_in_task = 300_000
    data = spark.range(rows_in_task, numPartitions=1).select(
        F.when(F.col("id") < rows_in_task - 1, F.col("id")).alias("id"),
        (F.col("id") % 3).cast("string").alias("p"),
        F.lit(1).cast("long").alias("ts"),
        F.sha1(F.col("id").cast("string")).alias("v"),
    )
    with pytest.raises(SchemaError, match="null"):
        engine.insert(data)
    assert_aborted_without_a_trace(table)


def assert_aborted_without_a_trace(table: Table) -> None:
    """One failed instant (published as inflight, marked aborted), no base file, no marker."""
    (instant,) = list(table.timeline())
    assert (instant.action, instant.state) == (Action.COMMIT, State.INFLIGHT)
    assert abort_reason(table.storage, instant.requested_time) == "error"
    assert list_base_files(table) == [] and not table.storage.walk_files(MARKER_DIR)
    assert snapshot(table) == [] == hudi_rs.snapshot(table.uri)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_write_task_judges_its_writers_lease_before_it_writes(
    where: str, tmp_path: Path, s3_server: S3Server
) -> None:
    """A task merging rows into a file group writes it while its writer's heartbeat is live; marked
    aborted, or gone, the task raises and writes nothing."""
    if where == "s3":
        uri, options = s3_server.new_uri(), s3_server.storage_options()
        table = create(uri, options, partition_fields=["p"])
    else:
        table = create(str(tmp_path / "t"), partition_fields=["p"])
    for lease, instant in (("live", "20261201000000001"), ("aborted", "20261201000000002"),
                           ("gone", "20261201000000003")):  # fmt: skip
        context, path, incoming = merge_task(table, instant)
        heartbeat = Heartbeat(table.storage, instant, context.spec.heartbeat, "test")
        heartbeat.renew()
        if lease == "aborted":
            heartbeat.mark_aborted("conflict")
        elif lease == "gone":
            heartbeat.stop(delete=True)
        if lease == "live":
            stat = context.write(table.storage, 0, incoming)
            assert stat.path == path and stat.num_update_writes == 1
            assert sorted(read_base_file(table.storage, path).column("v").to_pylist()) == ["x", "z"]
            continue
        with pytest.raises(LeaseLostError, match="aborted" if lease == "aborted" else "gone"):
            context.write(table.storage, 0, incoming)
        assert not table.storage.exists(path), lease


def test_a_write_task_on_s3_asks_for_its_lease_beside_reading_the_base_file(s3_server: S3Server) -> None:
    """On an object store the lease's two questions go with the base file's read: a task's file group
    costs two round trips one after the other, those three requests at once, then the write."""
    options = s3_server.storage_options()
    table = create(s3_server.new_uri(), options, partition_fields=["p"])
    instant = "20261201000000001"
    context, path, incoming = merge_task(table, instant)
    Heartbeat(table.storage, instant, context.spec.heartbeat, "test").renew()
    # A second a request: requests made at once reach the proxy well within it, even on a loaded machine,
    # where 0.2 s once let one of the three arrive after another was answered.
    with ProxyProcess(s3_server.endpoint_url, delay=1.0) as proxy:
        endpoint = {"endpoint_url": proxy.endpoint_url, "region_name": "us-east-1"}
        storage = Table.load(table.uri, key="task", secret="secret", client_kwargs=endpoint).storage
        proxy.reset()  # the table's properties, read on the driver
        context.write(storage, 0, incoming)
        made = [r for r in proxy.reset() if r.client == "task"]
    asked = [("GET", ".heartbeat"), ("GET", "a"), ("HEAD", ".heartbeat"), ("PUT", "a")]
    assert sorted(what(r) for r in made) == asked
    assert sequential(made) == 2
    assert sorted(read_base_file(table.storage, path).column("v").to_pylist()) == ["x", "z"]


def merge_task(table: Table, instant: str) -> tuple[WriteContext, str, pa.Table]:
    """A Spark write task of ``instant`` that upserts key 2 into the table's one file group, the file it
    writes, and its rows; the table first gets two rows (keys 1 and 2, partition ``a``)."""
    if not table.timeline().completed():
        local_writer(table).insert(frame((1, "a", 1, "x"), (2, "a", 1, "y")))
    [base] = FileSystemView.build(table).latest_base_files()
    spec = TableSpec.of(table, table.config)
    work = FileGroupWrite.create(base.partition, base.file_id, instant, "0-1-0", base, merge=True)
    context = WriteContext(spec, instant, {0: BucketWrite(work, task=0)}, ("id", "p", "ts", "v"))
    return context, work.new_path, stamp(frame((2, "a", 2, "z")), spec)


def test_a_failed_executor_write_aborts_and_leaves_nothing_visible(spark: Any, tmp_path: Path) -> None:
    table = create(str(tmp_path / "t"), partition_fields=["p"])
    engine = SparkWriter(table, spark)
    engine.insert(spark.createDataFrame(frame((1, "a", 1, "a1"))))
    (Path(table.uri) / "zz").write_text("a file where partition zz's directory would go")
    with pytest.raises(StorageError):
        engine.upsert(spark.createDataFrame(frame((1, "a", 2, "a1-v2"), (2, "zz", 1, "zz2"))))
    failed = table.timeline().pending()
    (instant,) = list(failed)
    assert instant.state is State.INFLIGHT and instant.action is Action.COMMIT
    assert abort_reason(table.storage, instant.requested_time) == "error"
    assert not [b for b in list_base_files(table) if b.instant_time == instant.requested_time]
    assert snapshot(table) == rows(frame((1, "a", 1, "a1"))) == hudi_rs.snapshot(table.uri)


def test_errors_of_spark_tasks_reach_the_driver_typed() -> None:
    text = (
        "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\ncowrite.timeline.errors.LeaseLostError: heartbeat gone\n'
    )
    error = translate(RuntimeError(text))
    assert isinstance(error, LeaseLostError) and str(error) == "heartbeat gone"
    other = translate(RuntimeError("Traceback:\nValueError: bad\n JVM stacktrace:"))
    assert isinstance(other, SparkJobError) and "ValueError: bad" in str(other)


def test_route_keys_spread_file_groups_evenly_over_the_write_tasks(spark: Any) -> None:
    from pyspark.sql import functions as F

    values = [0, 1, -1, 7, 2**31, -(2**40), 2**63 - 1, -(2**63)]
    found = spark.createDataFrame([(v,) for v in values], "v long").select(F.hash("v")).collect()
    assert [r[0] for r in found] == [spark_hash(v) for v in values]
    for count, tasks in ((5, 5), (7, 3)):
        keys = route_keys(count, tasks)
        assert len(set(keys)) == count
        placed = (
            spark.createDataFrame([(k, i) for i, k in enumerate(keys)], "k long, i long")
            .repartition(tasks, "k")
            .select("i", F.spark_partition_id().alias("task"))
            .collect()
        )
        assert sorted((r.i, r.task) for r in placed) == [(i, i % tasks) for i in range(count)]


def test_routes_of_new_records_of_many_partitions_travel_at_their_own_size() -> None:
    """New records are routed partition by partition, as slices of the task's rows: the routes pickled
    with the function that attaches them hold each row once, not every partition's rows per slice."""
    partitions = [f"p{n:02}" for n in range(50)]
    tagged = pa.table(
        {
            POSITION: pa.array(range(5000), pa.int64()),
            RECORD_KEY: [str(i) for i in range(5000)],
            PARTITION_PATH: [partitions[i % 50] for i in range(5000)],
            FILE_ID: pa.nulls(5000, pa.string()),
            TASK: pa.array([0] * 5000, pa.int32()),
        }
    )
    segments = {(0, p): Segments((100,), (n,)) for n, p in enumerate(partitions)}
    routes = AssignBuckets({}, segments).route_tasks(tagged)
    assert routes.column(0).num_chunks == 50 and len(pickle.dumps(routes)) > 20 * routes.nbytes
    columns = ("v", RECORD_KEY, PARTITION_PATH, BUCKET)
    attach = AttachRoutes.of(routes, columns)
    assert len(pickle.dumps(attach)) < 2 * routes.nbytes
    rows = pa.table({"v": pa.array(range(6000)), POSITION: pa.array(range(6000), pa.int64())})
    attached = pa.Table.from_batches(list(attach(iter(rows.to_batches(max_chunksize=700)))))
    assert attached.column_names == list(columns)
    assert sorted(zip(*(attached.column(c).to_pylist() for c in columns), strict=True)) == [
        (i, str(i), partitions[i % 50], i % 50) for i in range(5000)
    ]


def test_writes_bound_arrow_batches_by_rows_and_restore_the_sessions_settings(
    spark: Any, tmp_path: Path
) -> None:
    conf = spark.conf
    conf.set(MAX_RECORDS, "5000")
    try:
        with ArrowBatches(spark) as outer, ArrowBatches(spark) as inner:
            assert conf.get(MAX_BYTES) in (UNCHECKED_BYTES, f"{UNCHECKED_BYTES}b")
            assert conf.get(MAX_RECORDS) == "5000"
            assert outer.fit(1 << 20) == 64 and conf.get(MAX_RECORDS) == "64"  # 64 MiB of 1 MiB rows
            assert inner.fit(100) == 5000  # narrow rows: the session's row bound
        assert conf.get(MAX_RECORDS) == "5000" and conf.get(MAX_BYTES, None) is None
        with ArrowBatches(spark) as outer:
            with ArrowBatches(spark):
                pass
            assert conf.get(MAX_BYTES) in (UNCHECKED_BYTES, f"{UNCHECKED_BYTES}b")  # until the last ends
        table = create(str(tmp_path / "t"), partition_fields=["p"], ordering_fields=["ts"])
        engine = SparkWriter(table, spark)
        engine.insert(spark.createDataFrame(frame((1, "a", 1, "a1"), (2, "b", 1, "b2"))))
        engine.upsert(spark.createDataFrame(frame((1, "a", 2, "a1-v2"), (3, "b", 1, "b3"))))
        assert snapshot(table) == rows(frame((1, "a", 2, "a1-v2"), (2, "b", 1, "b2"), (3, "b", 1, "b3")))
        assert conf.get(MAX_RECORDS) == "5000" and conf.get(MAX_BYTES, None) is None
    finally:
        conf.unset(MAX_RECORDS)


# -- the CLI -----------------------------------------------------------------------------------------------
def test_cli_write_with_the_spark_engine_matches_the_local_engine(spark: Any, tmp_path: Path) -> None:
    runner = CliRunner()
    first, second = tmp_path / "first.parquet", tmp_path / "second.csv"
    pq.write_table(frame((1, "a", 1, "a1"), (2, "b", 1, "b2")), first)
    second.write_text("id,p,ts,v\n1,a,2,a1-v2\n3,c,1,c3\n")
    for engine in ("local", "spark"):
        path = str(tmp_path / engine)
        init = ["init", path, "--record-key", "id", "--partition-field", "p", "--ordering-field", "ts"]
        assert runner.invoke(cli, init).exit_code == 0
        for operation, source in (("insert", first), ("upsert", second)):
            result = runner.invoke(cli, ["write", path, "--input", str(source), "--operation", operation,
                                         "--engine", engine, "--master", "local[1]"])  # fmt: skip
            assert result.exit_code == 0, result.output
            assert f"({operation}, 2 records)" in result.output
    assert snapshot(Table.load(str(tmp_path / "spark"))) == snapshot(Table.load(str(tmp_path / "local")))
    usage = runner.invoke(
        cli, ["write", str(tmp_path / "local"), "--input", str(first), "--operation", "bulk_insert"]
    )
    assert usage.exit_code == 2 and "needs --engine spark" in usage.output
    assert spark.sparkContext._jsc is not None  # the CLI used the active session and left it running


# -- S3 ----------------------------------------------------------------------------------------------------
def test_spark_writes_and_reads_a_table_on_s3(spark: Any, s3_server: S3Server, tmp_path: Path) -> None:
    from cowrite.spark import register
    from cowrite.spark import snapshot as spark_snapshot

    options = s3_server.storage_options()
    uri = s3_server.new_uri("spark")
    table = create(uri, options, partition_fields=["p"], ordering_fields=["ts"])
    local_table = create(str(tmp_path / "local"), partition_fields=["p"], ordering_fields=["ts"])
    engine, local = SparkWriter(table, spark), local_writer(local_table)
    for operation, batch in BATCHES[:3]:
        engine.write(spark.createDataFrame(batch), operation)
        local.write(batch, operation)
    assert snapshot(table) == snapshot(local_table) == hudi_rs.snapshot(uri, options)
    assert_hudi_rs_agrees(table, options)
    # executors read it back through the same storage options
    assert rows(spark_snapshot(spark, table).toArrow()) == snapshot(local_table)
    register(spark)
    storage = {"cowrite.storage.options": json.dumps(options)}
    loaded = spark.read.format("cowrite").options(**storage).load(uri)
    assert rows(loaded.toArrow()) == snapshot(local_table)
    # the data source writes there too: its tasks and its commit get the storage options from the option
    more = frame((20, "f", 1, "f20"))
    spark.createDataFrame(more).write.format("cowrite").mode("append").options(**storage).save(uri)
    local.insert(more)
    assert snapshot(table) == snapshot(local_table) == hudi_rs.snapshot(uri, options)


def test_a_spark_insert_lists_only_the_partitions_it_touches(spark: Any, s3_server: S3Server) -> None:
    """Into a table of 1,000 partitions on S3, an insert touching 3 lists those 3 data directories to
    find small file groups, and no other."""
    from cowrite.format.fs_view import BaseFile

    name = f"spark-{uuid.uuid4().hex}"
    options = s3_server.storage_options()
    table = create(f"s3://{s3_server.bucket}/{name}", options, partition_fields=["p"], ordering_fields=["ts"])
    first = frame((1, "x", 1, "first"))
    LocalWriter(table).insert(first)
    old = "20261121000000000"  # before the table's first instant: files of archived commits
    paths = [f"{n}/{BaseFile.file_name(f'g{n}', '0-1-0', old)}" for n in range(1000)]
    s3_server.load(s3_server.bucket, {f"{name}/{path}": b"" for path in paths})  # one request
    before = s3_server.listed(name)
    second = frame((2, "x", 1, "second"), (3, "y", 1, "second"), (4, "z", 1, "second"))
    SparkWriter(table, spark).insert(spark.createDataFrame(second))
    listed = s3_server.listed(name) - before
    data = {prefix: n for prefix, n in listed.items() if not prefix.startswith(f"{name}/.hoodie/")}
    assert data == {f"{name}/{p}/": 1 for p in "xyz"}
    # the rest: the timeline (4), the lock directory (3) and the write's markers (2)
    assert sum(listed.values()) <= 12, sorted(listed.items())
    # the dummy files are no parquet, and a reader lists every partition: gone, both read the two commits
    table.storage.delete_all(paths)
    expected = rows(pa.concat_tables([first, second]))
    assert hudi_rs.snapshot(table.uri, options) == rows(read.snapshot(table)) == expected
