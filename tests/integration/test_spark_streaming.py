"""Streaming writes: the ``cowrite`` sink (``writeStream.format("cowrite")``) and the ``foreachBatch``
helpers, each micro-batch one instant, exactly once across restarts, conflicts retried or fatal.

The queries read JSON files from a directory, one file per micro-batch (``maxFilesPerTrigger`` 1).
"Its commit landed, the checkpoint did not record it" is made the way a crash makes it: the checkpoint's
last ``commits/<batch>`` file is deleted before the query restarts, so Spark runs that batch again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from support import hudi_rs
from support.hudi_rs import rows
from support.spark import forget_commit
from support.tables import frame

from cowrite.cleaner.rollback import rollback_failed
from cowrite.format.fs_view import list_base_files
from cowrite.format.instant import Instant, State
from cowrite.format.markers import MARKER_DIR
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HEARTBEAT_DIR, HeartbeatPolicy, abort_reason
from cowrite.protocol.locks import InProcessLock, LockHolder
from cowrite.protocol.txn import TXN_APP_ID_KEY, TXN_VERSION_KEY
from cowrite.spark import delete_each_batch, register, upsert_each_batch
from cowrite.spark.handover import Settings
from cowrite.spark.sink import CLAIMS_DIR, MicroBatch, stream_writer
from cowrite.steps import Step, observe

WRITE = {
    "hoodie.datasource.write.recordkey.field": "id",
    "hoodie.datasource.write.partitionpath.field": "p",
    "hoodie.datasource.write.precombine.field": "ts",
    "hoodie.table.name": "orders",
}
SCHEMA = "id long, p string, ts long, v string"
FIRST = frame((1, "a", 1, "a1"), (2, "b", 1, "b2"), (3, "a", 1, "a3"))
SECOND = frame((4, "c", 1, "c4"), (1, "a", 2, "a1-again"))
THIRD = frame((5, "b", 1, "b5"))


def add_batch(source: Path, number: int, records: pa.Table) -> None:
    """One JSON file, one micro-batch of the queries below; written aside first, never read half-written."""
    temp = source.parent / f".{source.name}-{number}.json"
    temp.write_text("".join(json.dumps(r) + "\n" for r in records.to_pylist()))
    temp.rename(source / f"{number:03d}.json")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in"
    path.mkdir()
    return path


def stream(spark: Any, source: Path) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))


def sink(spark: Any, source: Path, path: str, checkpoint: Path, **options: str) -> Any:
    """Start the sink on every file of ``source`` (availableNow): returns the running query."""
    register(spark)
    return (
        stream(spark, source)
        .writeStream.format("cowrite")
        .options(**WRITE, **options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(path)
    )


def data_commits(table: Table) -> list[tuple[Instant, dict[str, str]]]:
    completed = table.timeline().data_commits().in_completion_order()
    return [(i, table.commit_metadata(i).extra) for i in completed]


def txns(table: Table) -> list[tuple[str, str, str]]:
    """(operation, application id, version) of every data commit, in completion order."""
    return [
        (table.commit_metadata(i).operation, extra.get(TXN_APP_ID_KEY, ""), extra.get(TXN_VERSION_KEY, ""))
        for i, extra in data_commits(table)
    ]


def leftovers(table: Table) -> list[str]:
    """What a write may leave behind under ``.hoodie``: markers, claims, heartbeats, pending instants."""
    found = [f.path for d in (MARKER_DIR, CLAIMS_DIR, HEARTBEAT_DIR) for f in table.storage.walk_files(d)]
    return found + [i.file_name for i in table.timeline().pending()]


def test_each_micro_batch_is_one_instant_and_a_replayed_batch_commits_nothing(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    path, checkpoint = str(tmp_path / "orders"), tmp_path / "checkpoint"
    add_batch(source, 0, FIRST)
    add_batch(source, 1, SECOND)
    query = sink(spark, source, path, checkpoint)
    query.awaitTermination()
    table = Table.load(path)
    qid = str(query.id)
    assert txns(table) == [("insert", qid, "0"), ("insert", qid, "1")]
    assert rows(read.snapshot(table)) == rows(pa.concat_tables([FIRST, SECOND])) == hudi_rs.snapshot(path)
    assert leftovers(table) == []

    # the commit of batch 1 landed, the checkpoint did not record it: the restart runs batch 1 again
    forget_commit(checkpoint, 1)
    add_batch(source, 2, THIRD)
    again = sink(spark, source, path, checkpoint)
    again.awaitTermination()
    assert str(again.id) == qid and str(again.runId) != str(query.runId)
    assert txns(table) == [("insert", qid, "0"), ("insert", qid, "1"), ("insert", qid, "2")]
    everything = rows(pa.concat_tables([FIRST, SECOND, THIRD]))
    assert rows(read.snapshot(table)) == everything == hudi_rs.snapshot(path)
    assert {s.path for i, _ in data_commits(table) for s in table.commit_metadata(i).write_stats} == {
        b.path for b in list_base_files(table)
    }  # fmt: skip
    assert leftovers(table) == []
    assert sorted(p.name for p in (checkpoint / "commits").glob("[0-9]*")) == ["0", "1", "2"]


def test_a_crashed_micro_batch_leaves_what_the_rollback_cleans_and_its_replay_commits_once(
    spark: Any, tmp_path: Path
) -> None:
    """The tasks' and the commit's work run here, in this process: the driver "dies" between them."""
    path = str(tmp_path / "orders")
    writer = stream_writer(Settings.of({"path": path, **WRITE}), spark.createDataFrame(FIRST).schema, False)
    table = Table.load(path)
    batch = MicroBatch(str(uuid.uuid4()), 0)
    crashed = writer.write_batch(iter(FIRST.to_batches()), batch)
    joined = writer.write_batch(iter(SECOND.to_batches()), batch)  # a second task joins the instant
    assert crashed.instant is not None and joined.instant == crashed.instant and crashed.stats
    (pending,) = table.timeline().pending()
    assert pending.requested_time == crashed.instant
    an_hour_later = time.time() + 3600  # the heartbeat is long stale by then
    lock = InProcessLock(table.uri, LockHolder())
    done = rollback_failed(table, lock, HeartbeatPolicy(), now=an_hour_later)
    assert [d.target for d in done] == [crashed.instant]
    assert list_base_files(table) == [] and rows(read.snapshot(table)) == [] == hudi_rs.snapshot(path)
    # the rollback left the batch's claim alone; the restarted query's tasks claim the batch anew
    assert leftovers(table) == [f"{CLAIMS_DIR}/{batch.query_id}/0.0"]
    replayed = writer.write_batch(iter(FIRST.to_batches()), batch)
    assert replayed.attempt == 1 and replayed.instant not in (None, crashed.instant)
    writer.commit([replayed], 0)
    assert txns(table) == [("insert", batch.query_id, "0")]
    assert rows(read.snapshot(table)) == rows(FIRST) == hudi_rs.snapshot(path)
    assert leftovers(table) == []
    # a task of the batch replayed once more writes nothing: the batch is committed
    late = writer.write_batch(iter(FIRST.to_batches()), batch)
    assert (late.instant, late.committed_by) == (None, replayed.instant)
    writer.commit([late], 0)
    assert len(txns(table)) == 1 and leftovers(table) == []


# -- conflicts: a rival commits while the sink's tasks hold their instant -----------------------------------
RIVAL_WINS = '''
from cowrite.protocol.conflict import Conflict


def rival_wins(mine, candidates):
    """Every upsert completed since the write began wins (the sink's new file groups never overlap)."""
    return [Conflict(c.instant, c.metadata.touched_file_groups) for c in candidates
            if c.metadata.operation == "upsert"]
'''
RIVAL = frame((9, "z", 1, "rival"))


@pytest.fixture
def rival_wins(spark: Any, tmp_path: Path) -> str:
    """A conflict strategy under which a completed upsert beats the sink, importable by Spark's workers."""
    name = f"rival_wins_{uuid.uuid4().hex}"
    module = tmp_path / f"{name}.py"
    module.write_text(RIVAL_WINS)
    spark.sparkContext.addPyFile(str(module))
    return f"{name}.rival_wins"


def held_sink(spark: Any, source: Path, path: str, checkpoint: Path, release: Path, **options: str) -> Any:
    """:func:`sink`, its tasks held (after their claim, before their first row) until ``release`` exists."""

    def hold(value: str) -> str:
        deadline = time.monotonic() + 120
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return value

    held = F.udf(hold, "string", useArrow=False)
    register(spark)
    return (
        stream(spark, source)
        .withColumn("v", held("v"))
        .writeStream.format("cowrite")
        .options(**WRITE, **options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(path)
    )


def claimed_instant(path: str) -> str:
    """The instant of the first claim the sink's tasks make (waits for it)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        claims = list(Path(path, CLAIMS_DIR).rglob("0.0"))
        if claims:
            for _ in range(100):  # created, perhaps not yet written
                text = claims[0].read_text()
                if text:
                    return str(json.loads(text)["instant"])
                time.sleep(0.05)
        time.sleep(0.05)
    raise AssertionError("the sink's tasks never claimed micro-batch 0")


def race_a_rival(spark: Any, tmp_path: Path, source: Path, strategy: str, retries: int) -> tuple[Any, str]:
    path, checkpoint, release = str(tmp_path / "orders"), tmp_path / "checkpoint", tmp_path / "release"
    add_batch(source, 0, FIRST)
    options = {
        "hoodie.write.lock.conflict.resolution.strategy": strategy,
        "hoodie.write.num.retries.on.conflict.failures": str(retries),
    }
    query = held_sink(spark, source, path, checkpoint, release, **options)
    try:
        lost = claimed_instant(path)
        LocalWriter(Table.load(path)).upsert(RIVAL)  # completes while the sink's instant is pending
    finally:
        release.touch()
    return query, lost


def test_a_micro_batch_that_loses_a_conflict_is_written_again_as_a_new_instant(
    spark: Any, tmp_path: Path, source: Path, rival_wins: str
) -> None:
    query, lost = race_a_rival(spark, tmp_path, source, rival_wins, retries=1)
    query.awaitTermination()
    path = str(tmp_path / "orders")
    table = Table.load(path)
    qid = str(query.id)
    assert txns(table) == [("upsert", "", ""), ("insert", qid, "0")]
    (_, _), (retried, _) = data_commits(table)
    assert retried.requested_time > lost
    assert table.timeline().get(lost) in (None, Instant(lost, retried.action, State.INFLIGHT))
    assert abort_reason(table.storage, lost) == "conflict"
    assert all(b.instant_time != lost for b in list_base_files(table))
    assert rows(read.snapshot(table)) == rows(pa.concat_tables([RIVAL, FIRST])) == hudi_rs.snapshot(path)
    assert not table.storage.walk_files(CLAIMS_DIR) and not table.storage.walk_files(MARKER_DIR)


def test_a_micro_batch_that_cannot_commit_stops_the_query_with_the_cause(
    spark: Any, tmp_path: Path, source: Path, rival_wins: str
) -> None:
    query, lost = race_a_rival(spark, tmp_path, source, rival_wins, retries=0)
    with pytest.raises(StreamingQueryException, match="lost a write conflict"):
        query.awaitTermination()
    path = str(tmp_path / "orders")
    table = Table.load(path)
    assert txns(table) == [("upsert", "", "")]
    assert abort_reason(table.storage, lost) == "conflict"
    assert all(b.instant_time != lost for b in list_base_files(table))
    assert rows(read.snapshot(table)) == rows(RIVAL) == hudi_rs.snapshot(path)
    assert not table.storage.walk_files(CLAIMS_DIR) and not table.storage.walk_files(MARKER_DIR)
    assert not (tmp_path / "checkpoint" / "commits" / "0").exists()  # Spark runs the batch again on restart


def test_the_sink_refuses_what_it_cannot_honour(spark: Any, tmp_path: Path, source: Path) -> None:
    add_batch(source, 0, FIRST)
    for options, message in (
        ({"hoodie.datasource.write.operation": "upsert"}, "upsert_each_batch"),
        ({"txnAppId": "app", "txnVersion": "1"}, "query's id and the batch id"),
    ):
        checkpoint = tmp_path / f"checkpoint-{len(message)}"
        query = sink(spark, source, str(tmp_path / "orders"), checkpoint, **options)
        with pytest.raises(StreamingQueryException, match=message):
            query.awaitTermination()


# -- the foreachBatch helpers: upserts and deletes --------------------------------------------------------
def each_batch(spark: Any, source: Path, checkpoint: Path, function: Callable[[Any, int], None]) -> Any:
    return (
        stream(spark, source)
        .writeStream.foreachBatch(function)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def create(path: str) -> Table:
    return Table.create(
        path, name="orders", record_key_fields=("id",), partition_fields=("p",), ordering_fields=("ts",)
    )


def latest(*batches: pa.Table, deleted: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """The latest record per key (by ts, then arrival) of ``batches``, without the ``deleted`` keys."""
    newest: dict[int, dict[str, Any]] = {}
    for record in pa.concat_tables(batches).to_pylist():
        if record["id"] not in newest or record["ts"] >= newest[record["id"]]["ts"]:
            newest[record["id"]] = record
    return rows(pa.Table.from_pylist([r for k, r in newest.items() if k not in deleted], FIRST.schema))


def test_upserts_and_deletes_each_batch_exactly_once_across_a_restart(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    path, checkpoint = str(tmp_path / "orders"), tmp_path / "checkpoint"
    table = create(path)
    add_batch(source, 0, FIRST)
    add_batch(source, 1, SECOND)
    upserts = upsert_each_batch(path)
    query = each_batch(spark, source, checkpoint, upserts)
    query.awaitTermination()
    qid = str(query.id)
    assert txns(table) == [("upsert", qid, "0"), ("upsert", qid, "1")]
    assert rows(read.snapshot(table)) == latest(FIRST, SECOND) == hudi_rs.snapshot(path)

    forget_commit(checkpoint, 1)  # committed, not recorded: batch 1 runs again
    add_batch(source, 2, frame((2, "b", 5, "b2-new")))
    again = each_batch(spark, source, checkpoint, upsert_each_batch(path))
    again.awaitTermination()
    assert txns(table) == [("upsert", qid, "0"), ("upsert", qid, "1"), ("upsert", qid, "2")]
    third = frame((2, "b", 5, "b2-new"))
    assert rows(read.snapshot(table)) == latest(FIRST, SECOND, third) == hudi_rs.snapshot(path)

    deletions, checkpoint_d = tmp_path / "deletions", tmp_path / "checkpoint-deletions"
    deletions.mkdir()
    add_batch(deletions, 0, frame((3, "a", 9, "")))
    add_batch(deletions, 1, frame((4, "c", 9, "")))
    deletes = delete_each_batch(Table.load(path), app_id="deletions")
    each_batch(spark, deletions, checkpoint_d, deletes).awaitTermination()
    forget_commit(checkpoint_d, 1)
    each_batch(spark, deletions, checkpoint_d, deletes).awaitTermination()
    assert txns(table)[3:] == [("delete", "deletions", "0"), ("delete", "deletions", "1")]
    expected = latest(FIRST, SECOND, third, deleted=(3, 4))
    assert rows(read.snapshot(table)) == expected == hudi_rs.snapshot(path)
    assert leftovers(table) == []


@contextmanager
def rival_at_commit(path: str) -> Iterator[list[str]]:
    """While the block runs, the first write of this process that reaches its commit first lets a rival
    upsert key 1 (the same file group) and commit; yields the instants that met the rival."""
    met: list[str] = []

    def interfere(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.WRITTEN and not met and instant is not None:
            met.append(instant)
            LocalWriter(Table.load(path)).upsert(frame((1, "a", 7, "rival")))

    with observe(interfere):
        yield met


def test_an_upsert_batch_that_loses_a_conflict_is_retried_or_stops_the_query(
    spark: Any, tmp_path: Path, source: Path
) -> None:
    path, checkpoint = str(tmp_path / "orders"), tmp_path / "checkpoint"
    table = create(path)
    LocalWriter(table).upsert(FIRST)
    add_batch(source, 0, frame((1, "a", 8, "streamed")))
    fatal = upsert_each_batch(path, settings={"hoodie.write.num.retries.on.conflict.failures": "0"})
    with rival_at_commit(path) as met, pytest.raises(StreamingQueryException, match="conflict"):
        each_batch(spark, source, checkpoint, fatal).awaitTermination()
    (lost,) = met
    assert [op for op, _, _ in txns(table)] == ["upsert", "upsert"]  # the first rows and the rival
    assert abort_reason(table.storage, lost) == "conflict"
    assert not (checkpoint / "commits" / "0").exists()

    retrying = upsert_each_batch(path, settings={"hoodie.write.num.retries.on.conflict.failures": "1"})
    with rival_at_commit(path) as met:  # the restarted query meets a rival again, and retries
        query = each_batch(spark, source, checkpoint, retrying)
        query.awaitTermination()
    (lost_again,) = met
    assert txns(table)[3:] == [("upsert", str(query.id), "0")]
    assert retrying.last is not None and retrying.last.requested_time > lost_again
    streamed = latest(FIRST, frame((1, "a", 8, "streamed")))
    assert rows(read.snapshot(table)) == streamed == hudi_rs.snapshot(path)
    # the two losers are left to the lazy rollback, marked aborted, as every writer's are
    losers = (lost, lost_again)
    assert sorted(leftovers(table)) == sorted([f"{HEARTBEAT_DIR}/{i}" for i in losers] + [
        f"{i}.inflight" for i in losers
    ])  # fmt: skip
    lock = InProcessLock(table.uri, LockHolder())
    rollback_failed(table, lock, HeartbeatPolicy(), now=time.time() + 3600)
    assert leftovers(table) == [] and rows(read.snapshot(table)) == streamed
