"""Clustering under the lock, its priority against ingestion, and the revert of RFC-22's example."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from support import TESTS, hudi_rs
from support.tables import new_table

from cowrite.cleaner import clean, rollback_failed, service_lock
from cowrite.engine.clustering import execute_clustering, schedule_clustering
from cowrite.errors import CommitFailedError, WriteConflictError
from cowrite.format.fs_view import FileSystemView, list_base_files
from cowrite.format.instant import Action
from cowrite.format.table import Table
from cowrite.format.timeline import InstantRange
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.transaction import Transaction, WriteOptions


def make_table(tmp_path: Path, strategy: str = "allow") -> Table:
    return Table.create(
        str(tmp_path / "t"),
        name="t",
        record_key_fields=["id"],
        partition_fields=["p"],
        ordering_fields=["v"],
        properties={"hoodie.clustering.updates.strategy": strategy, "hoodie.parquet.small.file.limit": "0"},
    )


def rows(ids: list[int], p: str = "a", v: int = 1) -> pa.Table:
    return pa.table({"id": ids, "p": [p] * len(ids), "v": [v] * len(ids), "s": [f"{p}{i}.{v}" for i in ids]})


def small_groups(table: Table, count: int = 3) -> None:
    """``count`` single-record file groups in partition a (small-file filling is off), one in b."""
    writer = LocalWriter(table)
    for n in range(count):
        writer.insert(rows([n]))
    writer.insert(rows([50], "b"))


def exact(table: Table) -> list[dict[str, object]]:
    mine = hudi_rs.rows(read.snapshot(table))
    assert hudi_rs.snapshot(table.uri) == mine
    return mine


def groups(table: Table, partition: str = "a") -> int:
    return len(FileSystemView.build(table).in_partition(partition))


def test_small_file_groups_become_one_keeping_meta_columns(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    small_groups(table)
    before = read.snapshot(table, with_meta=True)
    checkpoint = table.timeline().latest_completion_time
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9, sort_columns=["s"])
    assert planned is not None and planned.action is Action.REPLACE_COMMIT
    assert schedule_clustering(table, service_lock(table), small_file_limit=10**9) is None  # all planned
    done = execute_clustering(table, planned)
    assert groups(table) == 1 and groups(table, "b") == 1  # b had one group: nothing to cluster there
    after = read.snapshot(table, with_meta=True)
    keep = ["_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "id", "p", "v", "s"]
    assert hudi_rs.rows(after.select(keep)) == hudi_rs.rows(before.select(keep))
    assert exact(table) == hudi_rs.rows(
        before.drop_columns([c for c in before.column_names if c.startswith("_")])
    )
    assert read.incremental(table, since=checkpoint).num_rows == 0  # clustered rows are not new changes
    assert done.is_completed and table.commit_metadata(done).operation == "cluster"


def test_pending_clustering_yields_to_ingestion_by_default(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    small_groups(table)
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    LocalWriter(table).upsert(rows([1], v=2))  # ingestion first: commits despite the pending plan
    with pytest.raises(WriteConflictError):
        execute_clustering(table, planned)
    assert exact(table) == hudi_rs.rows(pa.concat_tables([rows([0, 2]), rows([1], v=2), rows([50], "b")]))
    assert groups(table) == 3


def test_a_clustering_keeps_a_column_added_while_it_ran(tmp_path: Path) -> None:
    """A clustering planned before an ingestion added a column commits after it: its replacecommit records
    the table's schema with that column, not the one it was planned on, and both readers read it."""
    table = make_table(tmp_path)
    small_groups(table)
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    added = rows([60], "b").append_column("n", pa.array([7], pa.int64()))
    LocalWriter(table).insert(added)
    execute_clustering(table, planned)
    assert groups(table) == 1
    [*_, clustering] = table.timeline().data_commits().in_completion_order()
    names = [f["name"] for f in json.loads(table.commit_metadata(clustering).schema)["fields"]]
    assert names == ["id", "p", "v", "s", "n"]
    without = pa.concat_tables([rows([0, 1, 2]), rows([50], "b")]).append_column("n", pa.nulls(4, pa.int64()))
    assert exact(table) == hudi_rs.rows(pa.concat_tables([without, added]))


def test_clustering_first_makes_the_ingestion_abort(tmp_path: Path) -> None:
    table = make_table(tmp_path, strategy="reject")
    small_groups(table)
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    with pytest.raises(WriteConflictError) as caught:
        LocalWriter(table).upsert(rows([1], v=2))
    assert caught.value.winner == planned.requested_time
    execute_clustering(table, planned)
    assert exact(table) == hudi_rs.rows(pa.concat_tables([rows([0, 1, 2]), rows([50], "b")]))


@pytest.mark.parametrize("adds_a_column", [False, True])
def test_an_ingestion_that_lost_to_a_completed_clustering_reverts_it(
    tmp_path: Path, adds_a_column: bool
) -> None:
    """RFC-22's example: clustering f1,f2,f3 -> g1 completes while an ingestion updating f1 runs. A column
    the ingestion adds stays in the table's schema, which the revert, completed last, records."""
    table = make_table(tmp_path)
    small_groups(table)
    start = table.timeline().latest_completion_time
    ingestion = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    clustering = execute_clustering(table, planned)
    assert groups(table) == 1
    # the ingestion, begun before, now writes f1 from its own (pre-clustering) view and commits
    writer = LocalWriter(table)
    original_begin = Transaction.begin
    Transaction.begin = classmethod(lambda cls, *a, **k: ingestion)  # type: ignore[method-assign,assignment]
    update = rows([1], v=2)
    if adds_a_column:
        update = update.append_column("n", pa.array([7], pa.int64()))
    try:
        done = writer.upsert(update)
    finally:
        Transaction.begin = original_begin  # type: ignore[method-assign]
    assert done.requested_time == ingestion.instant_time
    timeline = table.timeline()
    revert = timeline.completed_in(InstantRange.since(done.completion_time or ""))
    assert [(i.action, table.commit_metadata(i).operation) for i in revert] == [
        (Action.REPLACE_COMMIT, "cluster_revert")
    ]
    others = pa.concat_tables([rows([0, 2]), rows([50], "b")])
    if adds_a_column:
        others = others.append_column("n", pa.nulls(3, pa.int64()))
        assert json.loads(table.commit_metadata(revert[0]).schema)["fields"][-1]["name"] == "n"
    expected = hudi_rs.rows(pa.concat_tables([others, update]))
    assert exact(table) == expected  # the update is there, no row lost, none twice
    assert groups(table) == 3  # the whole mapping reversed: 1 group back to 3
    reverted = table.commit_metadata(revert[0])
    assert set(reverted.replaced_file_ids["a"]) >= {
        s.file_id for s in table.commit_metadata(clustering).write_stats
    }
    changes = read.incremental(table, since=start)
    assert hudi_rs.rows(changes) == hudi_rs.rows(update)
    assert hudi_rs.incremental(table.uri, start, None) == hudi_rs.rows(update)


def test_no_revert_once_the_clustered_group_was_changed(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    small_groups(table)
    ingestion = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    execute_clustering(table, planned)
    LocalWriter(table).upsert(rows([2], v=7))  # changes the clustered group g1
    original_begin = Transaction.begin
    Transaction.begin = classmethod(lambda cls, *a, **k: ingestion)  # type: ignore[method-assign,assignment]
    try:
        with pytest.raises(WriteConflictError):
            LocalWriter(table).upsert(rows([1], v=2))
    finally:
        Transaction.begin = original_begin  # type: ignore[method-assign]
    assert exact(table) == hudi_rs.rows(pa.concat_tables([rows([0, 1]), rows([2], v=7), rows([50], "b")]))


def test_cleaning_keeps_clustering_inputs_while_a_revert_is_possible(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    small_groups(table)
    ingestion = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    execute_clustering(table, planned)
    LocalWriter(table).insert(rows([60], "b"))
    inputs = {b.path for b in list_base_files(table) if b.partition == "a"}
    clean(table, service_lock(table), commits_retained=1)
    assert all(table.storage.exists(p) for p in inputs)
    ingestion.abort()  # then rolled back: no writer is left that could revert the clustering
    rollback_failed(table, service_lock(table), HeartbeatPolicy.from_config(table.config))
    done = clean(table, service_lock(table), commits_retained=1)
    assert done is not None and len(set(done.deleted) & inputs) == 3  # once no writer can revert


def test_a_writer_process_reverts_a_clustering_that_completed_while_it_wrote(tmp_path: Path) -> None:
    """The same example with a real writer process: it begins, the clustering plans and completes,
    then the writer writes its update and commits."""
    table = new_table(tmp_path / "t", properties={"hoodie.parquet.small.file.limit": "0"})
    writer = LocalWriter(table)
    for key in ("k0", "k1", "k2"):
        writer.insert(pa.table({"id": [key], "part": ["a"], "ts": [1], "value": ["old"]}))
    ready, go = tmp_path / "ready", tmp_path / "go"
    batch = json.dumps({"partition": "a", "keys": ["k1"], "value": "new", "ts": 2})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "support.writer_process",
            table.uri,
            "--batch",
            batch,
            "--pause-at",
            "requested",
            "--ready-file",
            str(ready),
            "--go-file",
            str(go),
        ],
        cwd=TESTS,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not ready.exists():
        assert time.time() < deadline and process.poll() is None, (
            process.stderr.read() if process.stderr else ""
        )
        time.sleep(0.05)
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    execute_clustering(table, planned)
    go.touch()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    expected = [{"id": k, "part": "a", "ts": 1, "value": "old"} for k in ("k0", "k2")]
    expected.append({"id": "k1", "part": "a", "ts": 2, "value": "new"})
    assert exact(table) == hudi_rs.rows(pa.Table.from_pylist(expected))
    operations = [
        table.commit_metadata(i).operation for i in table.timeline().data_commits().in_completion_order()
    ]
    assert operations[-3:] == ["cluster", "upsert", "cluster_revert"]


def test_only_one_executor_runs_a_plan(tmp_path: Path) -> None:
    table = make_table(tmp_path)
    small_groups(table)
    planned = schedule_clustering(table, service_lock(table), small_file_limit=10**9)
    assert planned is not None
    plan = table.service_plan(planned)
    assert plan is not None
    seen = table.timeline()
    first = Transaction.adopt(table, planned, plan, seen)
    with pytest.raises(CommitFailedError, match="already being executed"):
        Transaction.adopt(table, planned, plan, seen)
    assert first.heartbeat is not None and first.heartbeat.remaining() > 0  # the first one is untouched
    first.abort()
