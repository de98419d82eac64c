"""Conformance with hudi-rs: every scenario table reads the same with hudi-rs and with cowrite.

For each scenario: the snapshot (compared with the scenario's exact expected rows too, since a broken
table reads as zero rows in both readers), time travel as of every instant's requested time, and
incremental reads between consecutive completion times and over the whole range — all with the
``_hoodie_*`` meta columns. Scenarios with an instant that never completed prove its data files exist
on storage and are invisible to both readers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support import hudi_rs
from support.hudi_rs import Row, rows
from support.servers import S3Server
from support.tables import frame

from cowrite.engine.file_group import FileGroupWrite, read_base_file, write_file_group
from cowrite.engine.planning import new_file_id
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.engine.schema import avro_schema
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Action
from cowrite.format.table import Table
from cowrite.format.timeline import InstantRange
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.transaction import Transaction, WriteOptions

IN_PROCESS = {"hoodie.write.lock.provider": "in-process"}


class SimulatedCrash(Exception):
    """The writer process died after writing its data files, before publishing."""


@dataclass
class Scenario:
    table: Table
    expected: list[Row]  # the data rows of the final snapshot
    storage_options: dict[str, Any] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)  # data files of instants that never completed
    orphan_rows: list[Row] = field(default_factory=list)  # rows only those files hold




def writer(table: Table) -> LocalWriter:
    return LocalWriter(table, WriteOptions(config=table.config.with_values(IN_PROCESS)))


def create(uri: str, storage_options: dict[str, Any] | None = None, **kwargs: Any) -> Table:
    arguments: dict[str, Any] = {"name": "conformance", "record_key_fields": ["id"]}
    return Table.create(uri, storage_options=storage_options, **{**arguments, **kwargs})


# -- scenarios ---------------------------------------------------------------------------------------------
def partitioned(uri: str, storage_options: dict[str, Any] | None = None) -> Scenario:
    table = create(uri, storage_options, partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    write.insert(frame((1, "a", 1, "a1"), (2, "a", 1, "a2"), (3, "b", 1, "b3"), (4, "b", 1, "b4")))
    write.upsert(frame((1, "a", 2, "a1-v2"), (3, "b", 0, "stale"), (5, "c", 1, "c5")))
    write.delete(pa.table({"id": [2]}))
    write.insert(frame((6, "a", 1, "a6"), (7, "d", 1, "d7")))
    write.upsert(frame((6, "a", 3, "a6-v2"), (4, "b", 1, "b4-tie")))
    expected = rows(frame((1, "a", 2, "a1-v2"), (3, "b", 1, "b3"), (4, "b", 1, "b4-tie"), (5, "c", 1, "c5"),
                          (6, "a", 3, "a6-v2"), (7, "d", 1, "d7")))  # fmt: skip
    return Scenario(table, expected, dict(storage_options or {}))


def non_partitioned(path: Path) -> Scenario:
    table = create(str(path), ordering_fields=["ts"])
    write = writer(table)
    write.insert(frame((1, "x", 1, "one"), (2, "x", 1, "two"), (3, "x", 1, "three")))
    write.upsert(frame((2, "x", 2, "two-v2"), (4, "x", 1, "four")))
    write.delete(pa.table({"id": [1]}))
    write.upsert(frame((5, "x", 1, "five")))
    return Scenario(table, rows(frame((2, "x", 2, "two-v2"), (3, "x", 1, "three"), (4, "x", 1, "four"),
                                      (5, "x", 1, "five"))))  # fmt: skip


def hive_style_composite(path: Path) -> Scenario:
    table = create(str(path), record_key_fields=["id", "v"], partition_fields=["p", "day"],
                   ordering_fields=["ts"], hive_style_partitioning=True)  # fmt: skip
    write = writer(table)

    def batch(*records: tuple[Any, ...]) -> pa.Table:
        ids, vs, ps, days, ts = zip(*records, strict=True)
        return pa.table({
            "id": pa.array(ids, pa.int64()), "v": pa.array(vs, pa.string()), "p": pa.array(ps, pa.string()),
            "day": pa.array(days, pa.date32()), "ts": pa.array(ts, pa.int64()),
        })  # fmt: skip

    d1, d2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)
    write.insert(
        batch((1, "x", "eu", d1, 1), (1, "y", "eu", d1, 1), (2, "x", "us", d2, 1), (3, "x", None, d1, 1))
    )
    write.upsert(batch((1, "y", "eu", d1, 5), (4, "z", "us", d2, 1), (3, "x", None, d1, 2)))
    write.delete(batch((2, "x", "us", d2, 0)))
    expected = rows(
        batch((1, "x", "eu", d1, 1), (1, "y", "eu", d1, 5), (3, "x", None, d1, 2), (4, "z", "us", d2, 1))
    )
    return Scenario(table, expected)


def overwrite(path: Path) -> Scenario:
    table = create(str(path), partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    write.insert(frame((1, "a", 1, "a1"), (2, "b", 1, "b2"), (3, "c", 1, "c3")))
    write.insert_overwrite(frame((4, "a", 1, "a4"), (5, "b", 1, "b5")))
    write.upsert(frame((3, "c", 2, "c3-v2"), (4, "a", 2, "a4-v2")))
    write.insert_overwrite(frame((6, "b", 1, "b6")))
    return Scenario(table, rows(frame((3, "c", 2, "c3-v2"), (4, "a", 2, "a4-v2"), (6, "b", 1, "b6"))))


def many_file_groups(path: Path) -> Scenario:
    table = create(str(path), partition_fields=["p"], properties={"hoodie.parquet.max.file.size": "1"})
    write = writer(table)
    write.insert(frame(*((i, "ab"[i % 2], 1, f"v{i}") for i in range(8))))
    write.upsert(frame((0, "a", 2, "v0-new"), (3, "b", 2, "v3-new"), (8, "a", 1, "v8")))
    expected = [(i, "ab"[i % 2], 1, f"v{i}") for i in range(8) if i not in (0, 3)]
    return Scenario(
        table, rows(frame(*expected, (0, "a", 2, "v0-new"), (3, "b", 2, "v3-new"), (8, "a", 1, "v8")))
    )


TYPED = pa.table({
    "id": pa.array([1, 2], pa.int64()),
    "i32": pa.array([-(2**31), None], pa.int32()),
    "f32": pa.array([1.5, None], pa.float32()),
    "f64": pa.array([-2.5e-300, None], pa.float64()),
    "s": pa.array(["größe ✓", None]),
    "b": pa.array([True, None]),
    "d": pa.array([dt.date(2026, 1, 2), None], pa.date32()),
    "ts": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC), None],
                   pa.timestamp("us", tz="UTC")),
    "dec": pa.array([Decimal("-12345.67"), None], pa.decimal128(12, 2)),
})  # fmt: skip


def typed(path: Path) -> Scenario:
    table = create(str(path))
    writer(table).insert(TYPED)
    writer(table).upsert(TYPED.slice(1, 1))
    return Scenario(table, rows(TYPED))


def _begin_and_write(
    table: Table, partition: str, records: pa.Table, reuse_group: bool = True
) -> tuple[Transaction, list[WriteStat]]:
    """Begin an upsert, plan it, and write its base files: a new file group, and with ``reuse_group`` a new
    slice of the partition's first file group too. The caller decides whether it ever commits."""
    options = WriteOptions(config=table.config.with_values(IN_PROCESS))
    transaction = Transaction.begin(table, "upsert", Action.COMMIT, options)
    keys = pc.cast(records.column("id"), pa.string())
    incoming = records.append_column(RECORD_KEY, keys).append_column(PARTITION_PATH, records.column("p"))
    groups = FileSystemView.build(table, transaction.begin_timeline).in_partition(partition)
    groups = groups if reuse_group else []
    instant = transaction.instant_time
    works = [
        *(FileGroupWrite.create(partition, g.file_id, instant, "0-0-1", g.latest, True) for g in groups[:1]),
        FileGroupWrite.create(partition, new_file_id(), instant, "1-0-1", None, True),
    ]
    transaction.plan(CommitMetadata("upsert", tuple(WriteStat(w.file_id, w.new_path, partition,
                                                              w.base_instant or "null", 0, 0, 0, 0, 0)
                                                    for w in works)))  # fmt: skip
    stats = [
        write_file_group(table.storage, work, instant, incoming, ordering=("ts",), task=task)
        for task, work in enumerate(works)
    ]
    return transaction, stats


def _failed_upsert(table: Table, partition: str, records: pa.Table) -> list[str]:
    """An upsert whose process dies after writing its files: the instant never completes."""
    transaction, stats = _begin_and_write(table, partition, records)
    assert transaction.heartbeat is not None
    transaction.heartbeat.stop(delete=False)  # the process is gone; its heartbeat goes stale
    return [s.path for s in stats]


def interleaved(path: Path) -> Scenario:
    """A slow writer begins first and completes last: completion order differs from requested order."""
    table = create(str(path), partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    write.insert(frame((0, "z", 1, "z0"), (1, "a", 1, "a1")))
    slow_rows = frame((4, "a", 1, "a4-slow"), (5, "a", 1, "a5-slow"))
    slow, stats = _begin_and_write(table, "a", slow_rows, reuse_group=False)
    write.upsert(frame((3, "b", 1, "b3-fast")))  # begins after the slow one, completes before it
    schema = avro_schema(slow_rows.schema, table.name)
    slow_done = slow.commit(CommitMetadata("upsert", tuple(stats), schema=schema))
    fast = table.timeline().completed_in(InstantRange.all())[-2]
    assert fast.requested_time > slow_done.requested_time and fast.completion_time < slow_done.completion_time
    write.upsert(frame((3, "b", 2, "b3-v2"), (0, "z", 2, "z0-v2")))
    return Scenario(
        table,
        rows(frame((0, "z", 2, "z0-v2"), (1, "a", 1, "a1"), (3, "b", 2, "b3-v2"), (4, "a", 1, "a4-slow"),
                   (5, "a", 1, "a5-slow"))),
    )  # fmt: skip


def failed_instant(path: Path) -> Scenario:
    table = create(str(path), partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    write.insert(frame((1, "a", 1, "a1"), (2, "b", 1, "b2")))
    orphans = _failed_upsert(table, "a", frame((1, "a", 9, "ghost-update"), (3, "a", 9, "ghost-insert")))
    write.upsert(frame((2, "b", 2, "b2-v2")))
    return Scenario(
        table,
        rows(frame((1, "a", 1, "a1"), (2, "b", 2, "b2-v2"))),
        orphans=orphans,
        orphan_rows=rows(frame((1, "a", 9, "ghost-update"), (3, "a", 9, "ghost-insert"))),
    )


def failed_first_instant(path: Path) -> Scenario:
    """The failed instant is the first on the timeline: its files are not 'older than the first instant'."""
    table = create(str(path), partition_fields=["p"])
    orphans = _failed_upsert(table, "a", frame((1, "a", 1, "ghost")))
    writer(table).insert(frame((2, "a", 1, "real")))
    return Scenario(
        table,
        rows(frame((2, "a", 1, "real"))),
        orphans=orphans,
        orphan_rows=rows(frame((1, "a", 1, "ghost"))),
    )


def crashed_writer(path: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    """LocalWriter dies after its data files are written, before it commits."""
    table = create(str(path), partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    write.insert(frame((1, "a", 1, "a1"), (2, "b", 1, "b2")))
    before = {i.path for i in table.storage.walk_files() if i.path.endswith(".parquet")}

    def crash(self: Transaction, metadata: CommitMetadata, **_: object) -> None:
        assert self.heartbeat is not None
        self.heartbeat.stop(delete=False)
        raise SimulatedCrash(self.instant_time)

    with monkeypatch.context() as patch:
        patch.setattr(Transaction, "commit", crash)
        with pytest.raises(SimulatedCrash):
            write.upsert(frame((1, "a", 5, "ghost-update"), (3, "c", 1, "ghost-insert")))
    orphans = sorted({i.path for i in table.storage.walk_files() if i.path.endswith(".parquet")} - before)
    assert len(orphans) == 2  # a new slice of a's file group, a new file group in c
    write.upsert(frame((2, "b", 2, "b2-v2")))
    return Scenario(
        table,
        rows(frame((1, "a", 1, "a1"), (2, "b", 2, "b2-v2"))),
        orphans=orphans,
        orphan_rows=rows(frame((1, "a", 5, "ghost-update"), (3, "c", 1, "ghost-insert"))),
    )


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "partitioned": lambda path, _: partitioned(str(path)),
    "non_partitioned": lambda path, _: non_partitioned(path),
    "hive_style_composite": lambda path, _: hive_style_composite(path),
    "insert_overwrite": lambda path, _: overwrite(path),
    "many_file_groups": lambda path, _: many_file_groups(path),
    "typed": lambda path, _: typed(path),
    "interleaved": lambda path, _: interleaved(path),
    "failed_instant": lambda path, _: failed_instant(path),
    "failed_first_instant": lambda path, _: failed_first_instant(path),
    "crashed_writer": crashed_writer,
}


# -- the comparison ----------------------------------------------------------------------------------------
def assert_conforms(scenario: Scenario) -> None:
    table, options = scenario.table, scenario.storage_options
    uri = table.uri

    # snapshot: exact expected data rows, and identical rows (meta columns included) in both readers
    assert hudi_rs.snapshot(uri, options) == scenario.expected
    assert rows(read.snapshot(table)) == scenario.expected
    assert hudi_rs.snapshot(uri, options, with_meta=True) == rows(read.snapshot(table, with_meta=True), True)

    timeline = table.timeline()
    # time travel as of every instant's requested time, pending ones included
    for instant in timeline:
        time = instant.requested_time
        mine = rows(read.snapshot(table, as_of=time, with_meta=True), True)
        assert hudi_rs.as_of(uri, time, options, with_meta=True) == mine, f"as of {instant}"

    # incremental between consecutive completion times, and over the whole range
    completions = [i.completion_time for i in timeline.data_commits().in_completion_order()]
    assert completions
    for since, until in zip([None, *completions], completions, strict=False):
        mine = rows(read.incremental(table, since, until, with_meta=True), True)
        assert hudi_rs.incremental(uri, since, until, options, with_meta=True) == mine, f"({since}, {until}]"
    whole = rows(read.incremental(table, None, completions[-1], with_meta=True), True)
    assert hudi_rs.incremental(uri, None, completions[-1], options, with_meta=True) == whole
    assert hudi_rs.incremental(uri, None, None, options, with_meta=True) == whole

    # data files of instants that never completed exist, hold their rows, and nobody sees them
    pending = {i.requested_time for i in timeline.pending()}
    for orphan in scenario.orphans:
        assert table.storage.exists(orphan), orphan
        assert orphan.rsplit("_", 1)[-1].removesuffix(".parquet") in pending
    if scenario.orphans:
        held = [r for path in scenario.orphans for r in rows(read_base_file(table.storage, path))]
        assert all(r in held for r in scenario.orphan_rows)
        seen = hudi_rs.snapshot(uri, options) + hudi_rs.incremental(uri, None, None, options)
        seen += [r for i in timeline for r in hudi_rs.as_of(uri, i.requested_time, options)]
        assert not [r for r in scenario.orphan_rows if r in seen]


@pytest.mark.parametrize("name", SCENARIOS)
def test_hudi_rs_reads_what_cowrite_reads(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_conforms(SCENARIOS[name](tmp_path / name, monkeypatch))


def test_an_empty_table_reads_as_empty(tmp_path: Path) -> None:
    table = create(str(tmp_path), partition_fields=["p"])
    assert hudi_rs.snapshot(table.uri) == [] == rows(read.snapshot(table))
    assert hudi_rs.incremental(table.uri) == [] == rows(read.incremental(table))


def test_hudi_rs_reads_a_table_on_s3(s3_server: S3Server) -> None:
    uri = s3_server.new_uri("conformance")
    assert_conforms(partitioned(uri, s3_server.storage_options()))
