"""The ``cowrite`` streaming source (``readStream.format("cowrite")``): offsets are completion times, each
micro-batch holds the rows of the commits completed since the previous one, exactly once.

The queries run with ``Trigger.AvailableNow`` into a ``foreachBatch`` collector that keeps each batch's
rows by batch id, so a batch Spark runs again replaces its first run. Every query restarts from the same
checkpoint location; "its batch ran, the checkpoint did not record it" is made as the sink's tests make it
(:func:`forget_commit`). Batches are compared with the batch reader's incremental reads of their ranges.
What cannot be seen from a Spark query — the source's warnings, a cleaned file — is checked by planning a
micro-batch in this process (:func:`~cowrite.spark.source.plan_micro_batch`), as the source's process does.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.pandas.types import from_arrow_schema
from support.daemon import Processes, Target, serving, writer
from support.spark import forget_commit
from support.tables import rows

from cowrite.cleaner import service_lock
from cowrite.cleaner.archive import archive
from cowrite.cleaner.clean import clean
from cowrite.daemon.config import TableEntry
from cowrite.errors import StreamDataLossError
from cowrite.format.instant import Instant
from cowrite.format.overlay import OVERLAY_DIR
from cowrite.spark import register
from cowrite.spark.handover import Settings
from cowrite.spark.reader import plan_snapshot
from cowrite.spark.source import plan_micro_batch, stream_reader

Row = tuple[str, str, str]  # id, value, _hoodie_commit_time
COLUMNS = ("id", "value", "_hoodie_commit_time")


def consume(spark: Any, path: str, checkpoint: Path, **options: str) -> dict[int, list[Row]]:
    """Run the stream from ``checkpoint`` over what is available now; the batches run, by batch id."""
    register(spark)
    batches: dict[int, list[Row]] = {}

    def collect(frame: Any, batch_id: int) -> None:
        batches[batch_id] = sorted(tuple(r) for r in frame.select(*COLUMNS).collect())

    query = (
        spark.readStream.format("cowrite")
        .options(**options)
        .load(path)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return batches


def ranges(checkpoint: Path) -> dict[int, tuple[str | None, str | None]]:
    """Each batch's ``(start, end]`` as Spark recorded it: the end offsets of its offset log."""
    ends = {
        int(f.name): json.loads(f.read_text().splitlines()[-1])["completion_time"]
        for f in (checkpoint / "offsets").iterdir()
        if f.name.isdigit()
    }
    return {n: (ends.get(n - 1), ends[n]) for n in sorted(ends)}


def incremental(spark: Any, path: str, since: str | None, until: str | None) -> list[Row]:
    """The batch reader's incremental read of completion times ``(since, until]``."""
    frame = (
        spark.read.format("cowrite")
        .option("hoodie.datasource.query.type", "incremental")
        .option("hoodie.datasource.read.begin.instanttime", since or "")
        .option("hoodie.datasource.read.end.instanttime", until or "")
        .load(path)
    )
    return sorted(tuple(r) for r in frame.select(*COLUMNS).collect())


def written(instant: Instant | None, ids: list[str], value: str) -> list[Row]:
    assert instant is not None
    return [(i, value, instant.requested_time) for i in ids]


def completion(instant: Instant | None) -> str:
    assert instant is not None and instant.completion_time is not None
    return instant.completion_time


def same_as_batch_reads(spark: Any, path: str, checkpoint: Path, batches: dict[int, list[Row]]) -> None:
    for number, (since, until) in ranges(checkpoint).items():
        if number in batches:
            assert batches[number] == incremental(spark, path, since, until), number


def test_micro_batches_hold_the_commits_completed_since_the_last_exactly_once_across_restarts(
    spark: Any, tmp_path: Path
) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    path, checkpoint = target.uri, tmp_path / "checkpoint"
    first = writer(target.table()).insert(rows(["a1", "a2"], part="a", value="one"))
    second = writer(target.table()).insert(rows(["b1"], part="b", value="two"))

    first_batch = consume(spark, path, checkpoint)
    assert first_batch == {0: written(first, ["a1", "a2"], "one") + written(second, ["b1"], "two")}
    assert ranges(checkpoint) == {0: (None, completion(second))}

    # an upsert rewrites a1's file group, copying a2 with its own commit time: a2 is not read again
    third = writer(target.table()).upsert(rows(["a1"], part="a", ts=2, value="three"))
    fourth = writer(target.table()).insert(rows(["c1"], part="c", value="four"))
    expected = sorted(written(third, ["a1"], "three") + written(fourth, ["c1"], "four"))
    batches = consume(spark, path, checkpoint)
    assert batches == {1: expected}
    assert ranges(checkpoint)[1] == (completion(second), completion(fourth))
    same_as_batch_reads(spark, path, checkpoint, {**first_batch, **batches})

    # batch 1 ran, the checkpoint did not record it: the restart runs the same range again, same rows
    forget_commit(checkpoint, 1)
    assert consume(spark, path, checkpoint) == {1: expected}
    assert consume(spark, path, checkpoint) == {}  # nothing new

    # every version each commit wrote, once; the newest of each key is the snapshot's
    assert sorted(first_batch[0] + batches[1]) == sorted(
        written(first, ["a1", "a2"], "one")
        + written(second, ["b1"], "two")
        + written(third, ["a1"], "three")
        + written(fourth, ["c1"], "four")
    )
    snapshot = spark.read.format("cowrite").load(path).select(*COLUMNS).collect()
    newest = written(first, ["a2"], "one") + written(second, ["b1"], "two") + expected
    assert sorted(tuple(r) for r in snapshot) == sorted(newest)


def test_a_slow_commit_that_completes_after_a_faster_later_one_is_read_once(
    spark: Any, tmp_path: Path, processes: Processes
) -> None:
    """A backfill begins first and commits last: the batch run before it completes does not hold it, the
    next one does. A consumer that checkpointed by requested time would have passed it by."""
    target = Target(str(tmp_path / "orders"), interval_ms=500, misses=3)  # the paused writer stays live
    target.create()
    path, checkpoint = target.uri, tmp_path / "checkpoint"
    early = writer(target.table()).insert(rows(["e1"], part="e", value="early"))
    slow = processes.writer(
        target,
        [{"partition": "s", "keys": ["s1", "s2"], "value": "slow", "ts": 1}],
        "slow",
        "written",
        release_by_file=True,
    )
    slow_time = processes.paused(slow, "slow")["instant"]
    fast = writer(target.table()).insert(rows(["f1"], part="f", value="fast"))
    assert fast is not None and slow_time < fast.requested_time

    assert consume(spark, path, checkpoint) == {
        0: written(early, ["e1"], "early") + written(fast, ["f1"], "fast")
    }

    (processes.directory / "slow.go").touch()
    assert slow.wait(30) == 0, processes.stderr("slow")
    (done,) = [i for i in target.table().timeline().data_commits() if i.requested_time == slow_time]
    assert completion(done) > completion(fast)
    batches = consume(spark, path, checkpoint)
    assert batches == {1: [("s1", "slow", slow_time), ("s2", "slow", slow_time)]}
    assert ranges(checkpoint) == {0: (None, completion(fast)), 1: (completion(fast), completion(done))}
    same_as_batch_reads(spark, path, checkpoint, batches)


def test_a_query_starts_at_the_earliest_the_latest_or_a_given_completion_time(
    spark: Any, tmp_path: Path
) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    path = target.uri
    commits = [writer(target.table()).insert(rows([f"k{n}"], part=f"p{n}", value=f"v{n}")) for n in range(3)]
    start = "hoodie.datasource.streaming.startOffset"

    # latest: the first batch holds nothing, and records where the query stands, so that a restart does
    # not move its start past what completed meanwhile
    assert consume(spark, path, tmp_path / "latest", **{start: "latest"}) == {0: []}
    later = writer(target.table()).insert(rows(["k3"], part="p3", value="v3"))
    assert consume(spark, path, tmp_path / "latest", **{start: "latest"}) == {1: written(later, ["k3"], "v3")}

    given = consume(spark, path, tmp_path / "given", **{start: completion(commits[0])})
    assert given == {
        0: sorted(
            written(commits[1], ["k1"], "v1")
            + written(commits[2], ["k2"], "v2")
            + written(later, ["k3"], "v3")
        )
    }

    everything = sorted(r for n, c in enumerate([*commits, later]) for r in written(c, [f"k{n}"], f"v{n}"))
    assert consume(spark, path, tmp_path / "earliest", **{start: "earliest"}) == {0: everything}

    failed = (
        spark.readStream.format("cowrite").option(start, "yesterday").load(path).writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "bad")).start()
    )  # fmt: skip
    with pytest.raises(StreamingQueryException, match="startoffset"):
        failed.awaitTermination()


def test_commits_archived_before_the_stream_read_them_stop_it_or_are_skipped_with_a_warning(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    path, checkpoint = target.uri, tmp_path / "checkpoint"
    first = writer(target.table()).insert(rows(["a"], part="p0", value="first"))
    assert consume(spark, path, checkpoint) == {0: written(first, ["a"], "first")}

    behind = [writer(target.table()).insert(rows([f"x{n}"], part=f"q{n}", value="x")) for n in range(3)]
    table = target.table()
    archived = archive(table, service_lock(table), keep_min=1, keep_max=1)
    assert archived is not None
    gone = [i.requested_time for i in behind[:2] if i is not None]
    assert [t for t in archived.instants if t in gone] == gone

    with pytest.raises(StreamingQueryException, match="failOnDataLoss=true") as failure:
        consume(spark, path, checkpoint)
    assert all(t in str(failure.value) for t in gone)
    assert "archived" in str(failure.value)

    # the same batch, planned here: failOnDataLoss=false skips the archived commits and says which
    schema = plan_snapshot(table, with_meta=True).schema
    since, until = completion(first), completion(behind[2])
    with caplog.at_level(logging.WARNING, logger="cowrite.spark.source"):
        scan = plan_micro_batch(table, since, until, (), schema, fail_on_data_loss=False)
    assert scan.commit_times == (behind[2].requested_time,)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "cowrite.spark.source"]
    assert all(t in warning for t in gone) and "failOnDataLoss=false" in warning

    # the restarted query runs the batch that failed, reading what is left of it
    batches = consume(spark, path, checkpoint, failOnDataLoss="false")
    assert batches == {1: written(behind[2], ["x2"], "x")}
    assert ranges(checkpoint)[1] == (since, until)


def test_commits_whose_files_were_cleaned_are_data_loss_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch reads the newest file each file group got from its commits. Once a later commit (of a later
    batch) rewrote the group and the cleaner deleted the older version, the earlier commit is lost."""
    target = Target(str(tmp_path / "orders"))
    target.create()
    table = target.table()
    before = writer(table).insert(rows(["a"], part="p", value="before"))
    lost = writer(table).upsert(rows(["b"], part="p", value="lost"))  # rewrites a's file group
    other = writer(table).insert(rows(["c"], part="q", value="other"))
    writer(table).upsert(rows(["b"], part="p", ts=2, value="later"))  # and again
    cleaned = clean(table, service_lock(table), 1)
    assert cleaned is not None and any(lost.requested_time in p for p in cleaned.deleted)
    schema = plan_snapshot(table, with_meta=True).schema

    with pytest.raises(StreamDataLossError, match=f"{lost.requested_time} .*base files cleaned"):
        plan_micro_batch(table, completion(before), completion(other), (), schema)
    with caplog.at_level(logging.WARNING, logger="cowrite.spark.source"):
        scan = plan_micro_batch(
            table, completion(before), completion(other), (), schema, fail_on_data_loss=False
        )
    assert scan.commit_times == (other.requested_time,)
    assert len(scan.files) == 1 and "base files cleaned" in caplog.text and lost.requested_time in caplog.text


def test_the_watermark_comes_from_the_daemons_overlay_only_while_it_is_fresh(tmp_path: Path) -> None:
    target = Target(str(tmp_path / "orders"))
    table = target.create()
    first = writer(table).insert(rows(["a"], value="first"))
    with serving(TableEntry(target.uri)):  # its first poll logs the first commit
        pass
    second = writer(table).insert(rows(["b"], part="p1", value="second"))  # the daemon has not looked yet
    schema = from_arrow_schema(plan_snapshot(table, with_meta=True).schema)

    def newest(**options: str) -> str | None:
        reader = stream_reader(Settings.of({"path": target.uri, **options}), schema)
        return reader.latestOffset({"completion_time": None})["completion_time"]

    max_age = "cowrite.streaming.overlay.max.age.ms"
    assert newest() == completion(second)  # from the timeline
    assert newest(**{max_age: "60000"}) == completion(first)  # from the fresh overlay: behind, never ahead
    an_hour_ago = time.time() - 3600
    for name in table.storage.names(OVERLAY_DIR):
        os.utime(table.storage.full_path(f"{OVERLAY_DIR}/{name}"), (an_hour_ago, an_hour_ago))
    assert newest(**{max_age: "60000"}) == completion(second)  # stale: from the timeline again
