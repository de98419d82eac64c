"""The local engine and cowrite's readers: every operation, exact row sets, exact timelines and files."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import wait_until
from support.hudi_rs import Row, rows

from cowrite.engine.file_group import RecentFiles, read_base_file
from cowrite.format.fs_view import BaseFile, FileSystemView, list_base_files
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.locks.lock_files import LOCK_DIR, is_release
from cowrite.protocol.transaction import WriteOptions

IN_PROCESS = {"hoodie.write.lock.provider": "in-process"}


def writer(table: Table) -> LocalWriter:
    return LocalWriter(table, WriteOptions(config=table.config.with_values(IN_PROCESS)))


def new_table(path: Path | str, **kwargs: Any) -> Table:
    arguments: dict[str, Any] = {"name": "t", "record_key_fields": ["id"]}
    return Table.create(str(path), **{**arguments, **kwargs})


def data(*records: tuple[Any, ...], names: tuple[str, ...] = ("id", "p", "ts", "v")) -> pa.Table:
    columns = list(zip(*records, strict=True)) if records else [() for _ in names]
    types = {"id": pa.int64(), "p": pa.string(), "ts": pa.int64(), "v": pa.string()}
    return pa.table({n: pa.array(list(c), types.get(n)) for n, c in zip(names, columns, strict=True)})


def expect(*records: tuple[Any, ...], names: tuple[str, ...] = ("id", "p", "ts", "v")) -> list[Row]:
    return rows(data(*records, names=names))


def snapshot(table: Table, **kwargs: Any) -> list[Row]:
    return rows(read.snapshot(table, **kwargs), kwargs.get("with_meta", False))


def incremental(table: Table, since: str | None, until: str | None) -> list[Row]:
    return rows(read.incremental(table, since, until))


def file_groups(table: Table) -> dict[str, dict[str, list[str]]]:
    """partition -> file id -> instant times of its base files on storage (visible or not), sorted."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for base in list_base_files(table):
        found[base.partition][base.file_id].append(base.instant_time)
    return {p: {f: sorted(times) for f, times in groups.items()} for p, groups in found.items()}


def shapes(table: Table) -> dict[str, list[list[str]]]:
    """file_groups without the random file ids: partition -> sorted lists of instant times per group."""
    return {p: sorted(groups.values()) for p, groups in file_groups(table).items()}


def timeline_files(table: Table) -> set[str]:
    return {i.name for i in table.storage.list(TIMELINE_DIR)}


def expected_timeline_files(*instants: Instant) -> set[str]:
    names = set()
    for instant in instants:
        assert instant.completion_time is not None
        requested = Instant(instant.requested_time, instant.action, State.REQUESTED)
        names |= {requested.file_name, requested.transition(State.INFLIGHT).file_name, instant.file_name}
    return names


# -- one scenario, every backend, the default (filesystem) lock --------------------------------------------
def test_insert_upsert_delete_overwrite_time_travel_incremental(
    storage_uri: str, storage_options: dict[str, Any]
) -> None:
    table = Table.create(
        storage_uri,
        name="t",
        record_key_fields=["id"],
        partition_fields=["p"],
        ordering_fields=["ts"],
        storage_options=storage_options,
    )
    write = LocalWriter(table)  # default options: the filesystem lock
    snapshots: list[list[Row]] = []

    c1 = write.insert(data((1, "a", 1, "a1"), (2, "a", 1, "a2"), (3, "b", 1, "b3"), (4, "b", 1, "b4")))
    snapshots.append(expect((1, "a", 1, "a1"), (2, "a", 1, "a2"), (3, "b", 1, "b3"), (4, "b", 1, "b4")))
    assert snapshot(table) == snapshots[-1]

    c2 = write.upsert(data((1, "a", 2, "a1-v2"), (5, "b", 1, "b5")))
    snapshots.append(
        expect(
            (1, "a", 2, "a1-v2"), (2, "a", 1, "a2"), (3, "b", 1, "b3"), (4, "b", 1, "b4"), (5, "b", 1, "b5")
        )
    )
    assert snapshot(table) == snapshots[-1]

    c3 = write.delete(pa.table({"id": [2]}))
    snapshots.append(expect((1, "a", 2, "a1-v2"), (3, "b", 1, "b3"), (4, "b", 1, "b4"), (5, "b", 1, "b5")))
    assert snapshot(table) == snapshots[-1]

    c4 = write.insert_overwrite(data((9, "b", 1, "b9")))
    snapshots.append(expect((1, "a", 2, "a1-v2"), (9, "b", 1, "b9")))
    assert snapshot(table) == snapshots[-1]

    # exact timeline: one completed instant per write, in order, with increasing completion times
    instants = [c1, c2, c3, c4]
    assert [(i.action, i.state) for i in instants] == [(Action.COMMIT, State.COMPLETED)] * 3 + [
        (Action.REPLACE_COMMIT, State.COMPLETED)
    ]
    assert list(table.timeline()) == instants
    assert timeline_files(table) == expected_timeline_files(*instants)
    times = [t for i in instants for t in (i.requested_time, i.completion_time)]
    assert times == sorted(times) and len(set(times)) == 8

    # exact files: group a rewritten by c2 (update) and c3 (delete); b filled by c2, then a new group by c4
    r1, r2, r3, r4 = (i.requested_time for i in instants)
    assert shapes(table) == {"a": [[r1, r2, r3]], "b": [[r1, r2], [r4]]}
    replaced_group = next(f for f, times in file_groups(table)["b"].items() if times == [r1, r2])
    metadata = table.commit_metadata(c4)
    assert metadata.replaced_file_ids == {"b": (replaced_group,)}
    assert [(s.partition_path, s.num_inserts, s.num_writes) for s in metadata.write_stats] == [("b", 1, 1)]
    assert [
        (s.partition_path, s.num_deletes, s.num_writes) for s in table.commit_metadata(c3).write_stats
    ] == [("a", 1, 1)]

    # time travel as of each instant's requested time
    for instant, expected in zip(instants, snapshots, strict=True):
        assert snapshot(table, as_of=instant.requested_time) == expected
    assert snapshot(table, as_of="20000101000000000") == []

    # incremental by completion time: (previous completion, this completion]
    assert incremental(table, None, c1.completion_time) == snapshots[0]
    assert incremental(table, c1.completion_time, c2.completion_time) == expect(
        (1, "a", 2, "a1-v2"), (5, "b", 1, "b5")
    )
    assert incremental(table, c2.completion_time, c3.completion_time) == []  # a delete writes no records
    assert incremental(table, c3.completion_time, c4.completion_time) == expect((9, "b", 1, "b9"))
    assert incremental(table, None, c3.completion_time) == snapshots[2]
    assert incremental(table, c4.completion_time, None) == []

    # the filesystem lock was taken for the writes and every turn released (on S3 the last stands a moment)
    def ended() -> set[str] | None:
        locks = {i.name for i in table.storage.list(LOCK_DIR)}
        acquired = {n.split(".")[0] for n in locks if n.endswith(".acquired")}
        released = {n.split(".")[0] for n in locks if is_release(n)}  # a .released file or a turn's note
        return acquired if acquired == released else None

    assert wait_until(ended, "every turn of the lock to end")


def test_incremental_skips_file_groups_replaced_in_the_range(tmp_path: Path) -> None:
    """hudi-rs, like Hudi's Spark incremental relation, skips file groups replaced within the range."""
    table = new_table(tmp_path, partition_fields=["p"])
    write = writer(table)
    c1 = write.insert(data((1, "a", 1, "a1"), (2, "b", 1, "b2")))
    c2 = write.insert_overwrite(data((3, "a", 1, "a3")))
    assert incremental(table, None, c2.completion_time) == expect((2, "b", 1, "b2"), (3, "a", 1, "a3"))
    assert incremental(table, None, c1.completion_time) == expect((1, "a", 1, "a1"), (2, "b", 1, "b2"))
    assert incremental(table, c1.completion_time, c2.completion_time) == expect((3, "a", 1, "a3"))


# -- upsert ------------------------------------------------------------------------------------------------
def test_ordering_field_decides_within_one_batch(tmp_path: Path) -> None:
    table = new_table(tmp_path, ordering_fields=["ts"])
    writer(table).upsert(
        data(
            (1, "x", 5, "k1-ts5"), (1, "x", 3, "k1-ts3"),  # larger wins, whatever the order
            (2, "x", 3, "k2-ts3"), (2, "x", 7, "k2-ts7"),
            (3, "x", 4, "k3-first"), (3, "x", 4, "k3-second"),  # tie: the later row wins
        )
    )  # fmt: skip
    assert snapshot(table) == expect((1, "x", 5, "k1-ts5"), (2, "x", 7, "k2-ts7"), (3, "x", 4, "k3-second"))


def test_ordering_field_decides_against_the_stored_record(tmp_path: Path) -> None:
    table = new_table(tmp_path, ordering_fields=["ts"])
    write = writer(table)
    first = write.insert(data((1, "x", 5, "old"), (2, "x", 5, "old"), (3, "x", 5, "old")))
    second = write.upsert(data((1, "x", 4, "smaller"), (2, "x", 5, "tie"), (3, "x", 6, "larger")))
    assert snapshot(table) == expect((1, "x", 5, "old"), (2, "x", 5, "tie"), (3, "x", 6, "larger"))
    commit_times = {r["id"]: r["_hoodie_commit_time"] for r in snapshot(table, with_meta=True)}
    assert commit_times == {1: first.requested_time, 2: second.requested_time, 3: second.requested_time}
    stats = table.commit_metadata(second).write_stats
    assert [(s.num_writes, s.num_update_writes, s.num_inserts) for s in stats] == [(3, 2, 0)]


def test_an_upsert_counts_one_update_for_a_key_the_base_file_holds_twice(tmp_path: Path) -> None:
    table = new_table(tmp_path, ordering_fields=["ts"])
    write = writer(table)
    write.insert(data((1, "x", 1, "a"), (1, "x", 1, "b"), (2, "x", 1, "c")))  # inserts keep duplicates
    upsert = write.upsert(data((1, "x", 2, "new"), (3, "x", 2, "inserted")))
    assert snapshot(table) == expect((1, "x", 2, "new"), (2, "x", 1, "c"), (3, "x", 2, "inserted"))
    stats = table.commit_metadata(upsert).write_stats
    assert [(s.num_writes, s.num_update_writes, s.num_inserts) for s in stats] == [(3, 1, 1)]


def test_a_merge_keeps_the_base_files_order_and_appends_new_keys(tmp_path: Path) -> None:
    """As Hudi's merge: an update takes its stored row's place, a new key follows the stored rows."""
    table = new_table(tmp_path, ordering_fields=["ts"])
    write = writer(table)
    write.insert(data(*[(key, "x", 1, "old") for key in (5, 1, 4, 2, 3)]))
    stored = read_base_file(table.storage, list_base_files(table)[0].path).column("id").to_pylist()
    assert stored == [5, 1, 4, 2, 3]  # an insert keeps its input's order
    write.upsert(data((9, "x", 2, "new"), (4, "x", 2, "up"), (2, "x", 0, "loses"), (0, "x", 2, "new")))
    latest = FileSystemView.build(table).latest_base_files()
    merged = read_base_file(table.storage, next(iter(latest)).path)
    assert list(zip(merged.column("id").to_pylist(), merged.column("v").to_pylist(), strict=True)) == [
        (5, "old"), (1, "old"), (4, "up"), (2, "old"), (3, "old"), (9, "new"), (0, "new")
    ]  # fmt: skip


def test_without_ordering_field_the_latest_write_wins(tmp_path: Path) -> None:
    table = new_table(tmp_path)
    write = writer(table)
    write.insert(data((1, "x", 9, "stored")))
    write.upsert(data((1, "x", 1, "first"), (1, "x", 0, "second"), (2, "x", 0, "new")))
    assert snapshot(table) == expect((1, "x", 0, "second"), (2, "x", 0, "new"))


def test_a_writer_merges_its_own_last_files_without_reading_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = new_table(tmp_path, partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    write.insert(data((1, "x", 1, "a"), (2, "x", 1, "a")))
    opened: list[str] = []
    open_input = table.storage.open_input
    monkeypatch.setattr(table.storage, "open_input", lambda path: opened.append(path) or open_input(path))
    write.upsert(data((1, "x", 2, "b"), (3, "x", 2, "b")))
    write.upsert(data((2, "x", 3, "c")))
    assert opened == []
    expected = expect((1, "x", 2, "b"), (2, "x", 3, "c"), (3, "x", 2, "b"))
    assert snapshot(table) == expected
    opened.clear()
    other = writer(table)  # another writer reads the file (and finds the same rows)
    other.upsert(data((3, "x", 4, "d")))
    assert len(opened) == 3  # the base file: its keys for the index, its footer for sizing, its rows
    assert snapshot(table) == expect((1, "x", 2, "b"), (2, "x", 3, "c"), (3, "x", 4, "d"))


def test_recent_files_keep_the_most_recently_used_within_their_budget() -> None:
    tables = {name: pa.table({"v": pa.array(range(1000), pa.int64())}) for name in "abcd"}  # 8000 bytes each
    recent = RecentFiles(max_bytes=32_000)
    recent.put("huge", pa.table({"v": pa.array(range(1001), pa.int64())}))  # over a quarter: not kept
    for name in "abc":
        recent.put(name, tables[name])
    assert recent.get("a") is tables["a"]  # now the most recently used
    recent.put("d", tables["d"])
    recent.put("e", tables["d"])  # 5 x 8000 bytes: the least recently used, b, goes
    assert [n for n in "abcde" if recent.get(n) is not None] == ["a", "c", "d", "e"]
    assert recent.get("huge") is None


def test_insert_does_not_look_up_keys(tmp_path: Path) -> None:
    table = new_table(tmp_path)
    write = writer(table)
    write.insert(data((1, "x", 1, "one")))
    write.insert(data((1, "x", 2, "again")))
    assert snapshot(table) == expect((1, "x", 1, "one"), (1, "x", 2, "again"))


def test_meta_columns_in_the_input_are_replaced(tmp_path: Path) -> None:
    table = new_table(tmp_path)
    batch = data((1, "x", 1, "one")).append_column("_hoodie_commit_time", pa.array(["19990101000000000"]))
    instant = writer(table).insert(batch)
    assert [r["_hoodie_commit_time"] for r in snapshot(table, with_meta=True)] == [instant.requested_time]


# -- delete ------------------------------------------------------------------------------------------------
@pytest.fixture
def two_partitions(tmp_path: Path) -> Table:
    table = new_table(tmp_path, partition_fields=["p"], ordering_fields=["ts"])
    writer(table).insert(
        data((1, "a", 1, "a1"), (2, "a", 1, "a2"), (3, "b", 1, "b3"), (1, "b", 1, "b1"), (4, "b", 1, "b4"))
    )
    return table


def test_delete_by_key_without_partition_columns_finds_every_partition(two_partitions: Table) -> None:
    writer(two_partitions).delete(pa.table({"id": [1, 3, 99]}))
    assert snapshot(two_partitions) == expect((2, "a", 1, "a2"), (4, "b", 1, "b4"))


def test_delete_with_partition_columns_deletes_only_there(two_partitions: Table) -> None:
    instant = writer(two_partitions).delete(data((1, "b", 0, ""), (2, "b", 0, "")))  # key 2 is not in b
    assert snapshot(two_partitions) == expect((1, "a", 1, "a1"), (2, "a", 1, "a2"), (3, "b", 1, "b3"),
                                              (4, "b", 1, "b4"))  # fmt: skip
    stats = two_partitions.commit_metadata(instant).write_stats
    assert [(s.partition_path, s.num_deletes, s.num_writes) for s in stats] == [("b", 1, 2)]


def test_delete_of_unknown_keys_commits_nothing(two_partitions: Table) -> None:
    before = snapshot(two_partitions)
    files = file_groups(two_partitions)
    instant = writer(two_partitions).delete(pa.table({"id": [42]}))
    assert snapshot(two_partitions) == before
    assert file_groups(two_partitions) == files
    assert instant.is_completed and two_partitions.commit_metadata(instant).write_stats == ()


def test_delete_ignores_columns_the_table_does_not_have(two_partitions: Table) -> None:
    writer(two_partitions).delete(pa.table({"id": [2], "p": ["a"], "reason": ["gdpr"]}))
    assert snapshot(two_partitions) == expect((1, "a", 1, "a1"), (3, "b", 1, "b3"), (1, "b", 1, "b1"),
                                              (4, "b", 1, "b4"))  # fmt: skip
    for base in FileSystemView.build(two_partitions).latest_base_files():
        assert "reason" not in pq.read_schema(str(Path(two_partitions.uri) / base.path)).names


def test_delete_with_composite_key(tmp_path: Path) -> None:
    table = new_table(tmp_path, record_key_fields=["id", "v"])
    write = writer(table)
    write.insert(data((1, "x", 1, "a"), (1, "x", 1, "b"), (2, "x", 1, "a")))
    write.delete(pa.table({"id": [1], "v": ["b"]}))
    assert snapshot(table) == expect((1, "x", 1, "a"), (2, "x", 1, "a"))


# -- insert_overwrite --------------------------------------------------------------------------------------
def test_insert_overwrite_replaces_only_the_partitions_in_the_input(tmp_path: Path) -> None:
    table = new_table(tmp_path, partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    first = write.insert(data((1, "a", 1, "a1"), (2, "b", 1, "b2"), (3, "c", 1, "c3")))
    before = file_groups(table)
    replace = write.insert_overwrite(data((7, "a", 1, "a7"), (8, "b", 1, "b8"), (8, "b", 2, "b8-v2")))
    assert snapshot(table) == expect((3, "c", 1, "c3"), (7, "a", 1, "a7"), (8, "b", 2, "b8-v2"))
    assert replace.action is Action.REPLACE_COMMIT
    metadata = table.commit_metadata(replace)
    assert metadata.operation == "insert_overwrite"
    assert dict(metadata.replaced_file_ids) == {p: tuple(before[p]) for p in ("a", "b")}
    # the replaced files stay on storage (the cleaner removes them), invisible
    r1, r2 = first.requested_time, replace.requested_time
    assert shapes(table) == {"a": [[r1], [r2]], "b": [[r1], [r2]], "c": [[r1]]}
    visible = {(b.partition, b.instant_time) for b in FileSystemView.build(table).latest_base_files()}
    assert visible == {("a", r2), ("b", r2), ("c", r1)}
    assert snapshot(table, as_of=r1) == expect((1, "a", 1, "a1"), (2, "b", 1, "b2"), (3, "c", 1, "c3"))


def test_insert_overwrite_of_a_non_partitioned_table_replaces_everything(tmp_path: Path) -> None:
    table = new_table(tmp_path)
    write = writer(table)
    write.insert(data((1, "x", 1, "one"), (2, "x", 1, "two")))
    write.insert_overwrite(data((3, "x", 1, "three")))
    assert snapshot(table) == expect((3, "x", 1, "three"))
    write.upsert(data((1, "x", 1, "back")))
    assert snapshot(table) == expect((1, "x", 1, "back"), (3, "x", 1, "three"))


# -- keys and partition paths ------------------------------------------------------------------------------
@pytest.mark.parametrize("hive_style", [False, True])
def test_composite_keys_and_several_partition_fields(tmp_path: Path, hive_style: bool) -> None:
    table = new_table(
        tmp_path,
        record_key_fields=["id", "v"],
        partition_fields=["p", "day"],
        hive_style_partitioning=hive_style,
    )
    batch = pa.table({
        "id": pa.array([1, 1, 2], pa.int64()),
        "v": ["x", "y", "x"],
        "p": ["eu", "eu", None],
        "day": pa.array([dt.date(2026, 1, 2), dt.date(2026, 1, 2), dt.date(2026, 1, 3)]),
    })  # fmt: skip
    first = writer(table).insert(batch)
    found = {(r["_hoodie_record_key"], r["_hoodie_partition_path"]) for r in snapshot(table, with_meta=True)}
    if hive_style:
        paths = ["p=eu/day=2026-01-02", "p=__HIVE_DEFAULT_PARTITION__/day=2026-01-03"]
    else:
        paths = ["eu/2026-01-02", "__HIVE_DEFAULT_PARTITION__/2026-01-03"]
    assert found == {("id:1,v:x", paths[0]), ("id:1,v:y", paths[0]), ("id:2,v:x", paths[1])}
    assert sorted(file_groups(table)) == sorted(paths)
    for path in paths:
        assert (tmp_path / path).is_dir()
    assert snapshot(table) == rows(batch)
    # upserts find composite keys again in their partition
    second = writer(table).upsert(
        pa.table({"id": [1], "v": ["y"], "p": ["eu"], "day": [dt.date(2026, 1, 2)]})
    )
    assert snapshot(table) == rows(batch)
    assert shapes(table) == {paths[0]: [[first.requested_time, second.requested_time]],
                             paths[1]: [[first.requested_time]]}  # fmt: skip


def test_single_key_field_is_the_value_itself(tmp_path: Path) -> None:
    table = new_table(tmp_path, record_key_fields=["v"], partition_fields=["p"])
    writer(table).insert(data((1, "a", 1, "k1"), (2, "b", 1, "k2")))
    found = {(r["_hoodie_record_key"], r["_hoodie_partition_path"]) for r in snapshot(table, with_meta=True)}
    assert found == {("k1", "a"), ("k2", "b")}


def test_null_partition_values_go_to_the_default_partition(tmp_path: Path) -> None:
    table = new_table(tmp_path, partition_fields=["p"], ordering_fields=["ts"])
    write = writer(table)
    write.insert(data((1, None, 1, None), (2, "a", None, "x"), (3, None, None, None)))
    assert snapshot(table) == expect((1, None, 1, None), (2, "a", None, "x"), (3, None, None, None))
    assert sorted(file_groups(table)) == ["__HIVE_DEFAULT_PARTITION__", "a"]
    write.upsert(data((1, None, 2, "set")))
    write.delete(data((3, None, 0, None)))
    assert snapshot(table) == expect((1, None, 2, "set"), (2, "a", None, "x"))


# -- types -------------------------------------------------------------------------------------------------
TYPED = pa.table({
    "id": pa.array([1, 2, 3], pa.int64()),
    "i8": pa.array([-128, 127, None], pa.int8()),
    "i16": pa.array([-32768, 32767, None], pa.int16()),
    "i32": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
    "i64": pa.array([-(2**63), 2**63 - 1, None], pa.int64()),
    "f32": pa.array([1.5, -0.25, None], pa.float32()),
    "f64": pa.array([1e300, -2.5e-300, None], pa.float64()),
    "s": pa.array(["", "größe ✓", None], pa.string()),
    "b": pa.array([True, False, None], pa.bool_()),
    "d": pa.array([dt.date(1970, 1, 1), dt.date(9999, 12, 31), None], pa.date32()),
    "ts_us": pa.array([dt.datetime(2026, 1, 1, 12, 0, 0, 123456), dt.datetime(1900, 1, 1), None],
                      pa.timestamp("us")),
    "ts_ms_utc": pa.array([dt.datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=dt.UTC), None, None],
                          pa.timestamp("ms", tz="UTC")),
    "dec": pa.array([Decimal("12345678.90"), Decimal("-0.01"), None], pa.decimal128(10, 2)),
})  # fmt: skip


def test_column_types_round_trip_exactly(storage_uri: str, storage_options: dict[str, Any]) -> None:
    table = new_table(storage_uri, ordering_fields=["i32"], storage_options=storage_options)
    write = writer(table)
    instant = write.insert(TYPED)
    result = read.snapshot(table)
    assert result.schema == TYPED.schema
    assert rows(result) == rows(TYPED)
    avro = json.loads(table.commit_metadata(instant).schema)
    kinds = {f["name"]: f["type"][1] for f in avro["fields"]}
    assert kinds == {
        "id": "long", "i8": "int", "i16": "int", "i32": "int", "i64": "long", "f32": "float", "f64": "double",
        "s": "string", "b": "boolean", "d": {"type": "int", "logicalType": "date"},
        "ts_us": {"type": "long", "logicalType": "local-timestamp-micros"},
        "ts_ms_utc": {"type": "long", "logicalType": "timestamp-millis"},
        "dec": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
    }  # fmt: skip
    # a merge (upsert into the same file group) keeps every type and value of the copied rows
    write.upsert(TYPED.slice(2, 1))
    merged = read.snapshot(table)
    assert merged.schema == TYPED.schema
    assert rows(merged) == rows(TYPED)


@pytest.mark.parametrize(
    "column",
    [
        pa.array([dt.date(2026, 1, 2)], pa.date32()),
        pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 6)], pa.timestamp("us")),
        pa.array([Decimal("1.50")], pa.decimal128(5, 2)),
        pa.array([True], pa.bool_()),
        pa.array([7], pa.int32()),
    ],
)
def test_typed_keys_and_partitions(tmp_path: Path, column: pa.Array) -> None:
    table = new_table(tmp_path, record_key_fields=["k"], partition_fields=["k"])
    batch = pa.table({"k": column, "v": ["x"]})
    writer(table).insert(batch)
    writer(table).upsert(pa.table({"k": column, "v": ["y"]}))
    assert snapshot(table) == [{"k": column[0].as_py(), "v": "y"}]


# -- meta columns ------------------------------------------------------------------------------------------
def test_meta_columns(tmp_path: Path) -> None:
    table = new_table(tmp_path, record_key_fields=["id", "v"], partition_fields=["p"])
    write = writer(table)
    first = write.insert(data((1, "a", 1, "x"), (2, "a", 1, "y"), (3, "b", 1, "z")))
    second = write.upsert(data((1, "a", 2, "x")))
    by_key = {r["_hoodie_record_key"]: r for r in snapshot(table, with_meta=True)}
    assert sorted(by_key) == ["id:1,v:x", "id:2,v:y", "id:3,v:z"]
    assert {k: r["_hoodie_commit_time"] for k, r in by_key.items()} == {
        "id:1,v:x": second.requested_time,
        "id:2,v:y": first.requested_time,  # copied into the new base file, keeps its commit time
        "id:3,v:z": first.requested_time,
    }
    assert {k: r["_hoodie_partition_path"] for k, r in by_key.items()} == {
        "id:1,v:x": "a", "id:2,v:y": "a", "id:3,v:z": "b"
    }  # fmt: skip
    for key, row in by_key.items():
        assert row["_hoodie_commit_seqno"].startswith(row["_hoodie_commit_time"] + "_"), key
    # the copied row keeps its sequence number too
    first_rows = {
        r["_hoodie_record_key"]: r
        for r in rows(read.snapshot(table, as_of=first.requested_time, with_meta=True), with_meta=True)
    }
    assert by_key["id:2,v:y"]["_hoodie_commit_seqno"] == first_rows["id:2,v:y"]["_hoodie_commit_seqno"]
    assert len({r["_hoodie_commit_seqno"] for r in first_rows.values()}) == 3
    # every row of every base file names that file
    files = list_base_files(table)
    assert len(files) == 3
    for base in files:
        names = read_base_file(table.storage, base.path).column("_hoodie_file_name").to_pylist()
        assert names and set(names) == {base.name}
        assert base.name == BaseFile.file_name(base.file_id, base.write_token, base.instant_time)
        assert "_" not in base.file_id
    latest = {b.name for b in FileSystemView.build(table).latest_base_files()}
    assert {r["_hoodie_file_name"] for r in by_key.values()} == latest
    columns = read.snapshot(table, with_meta=True).column_names
    assert columns[:5] == [
        "_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path",
        "_hoodie_file_name",
    ]  # fmt: skip
    assert all(read.snapshot(table, with_meta=True).schema.field(c).type == pa.string() for c in columns[:5])


def test_write_stats_describe_the_files(tmp_path: Path) -> None:
    table = new_table(tmp_path, partition_fields=["p"])
    write = writer(table)
    first = write.insert(data((1, "a", 1, "x"), (2, "a", 1, "y"), (3, "b", 1, "z")))
    second = write.upsert(data((1, "a", 2, "x2"), (4, "a", 1, "w")))
    sizes = {i.path: i.size for i in table.storage.walk_files() if i.path.endswith(".parquet")}
    for instant in (first, second):
        for s in table.commit_metadata(instant).write_stats:
            assert s.path in sizes and s.file_size == sizes[s.path]
            assert s.path.startswith(f"{s.partition_path}/{s.file_id}_") and s.path.endswith(
                f"_{instant.requested_time}.parquet"
            )
            assert pq.read_metadata(str(tmp_path / s.path)).num_rows == s.num_writes
    (stat,) = table.commit_metadata(second).write_stats
    assert (stat.prev_commit, stat.num_writes, stat.num_update_writes, stat.num_inserts) == (
        first.requested_time, 3, 1, 1
    )  # fmt: skip
    assert {s.prev_commit for s in table.commit_metadata(first).write_stats} == {"null"}


# -- file sizing -------------------------------------------------------------------------------------------
def numbered(start: int, count: int) -> pa.Table:
    return data(*((i, "p", 1, f"value-{i:06d}") for i in range(start, start + count)))


def group_sizes(table: Table) -> list[int]:
    view = FileSystemView.build(table)
    return sorted(pq.read_metadata(str(Path(table.uri) / b.path)).num_rows for b in view.latest_base_files())


def probe_file_size(path: Path) -> int:
    """Size of the one base file ten ``numbered`` rows make (same lengths of every value, same bytes±few)."""
    probe = new_table(path)
    writer(probe).insert(numbered(0, 10))
    (base,) = list_base_files(probe)
    return base.size


def test_inserts_fill_the_small_file_group_then_open_new_ones(tmp_path: Path) -> None:
    size = probe_file_size(tmp_path / "probe")
    target = 2 * size + size // 20  # room for ~10.5 more records of ~size/10 bytes: 10, then 20 per file
    table = new_table(
        tmp_path / "t",
        properties={
            "hoodie.parquet.max.file.size": str(target),
            "hoodie.parquet.small.file.limit": str(target),
        },
    )
    write = writer(table)
    first = write.insert(numbered(0, 10))
    assert group_sizes(table) == [10]
    second = write.insert(numbered(10, 25))
    assert group_sizes(table) == [15, 20]
    r1, r2 = first.requested_time, second.requested_time
    assert shapes(table) == {"": [[r1, r2], [r2]]}
    assert snapshot(table) == rows(pa.concat_tables([numbered(0, 10), numbered(10, 25)]))
    stats = sorted(
        (s.prev_commit, s.num_inserts, s.num_writes) for s in table.commit_metadata(second).write_stats
    )
    assert stats == [(r1, 10, 20), ("null", 15, 15)]


def test_files_at_or_over_the_small_file_limit_receive_no_inserts(tmp_path: Path) -> None:
    size = probe_file_size(tmp_path / "probe")
    table = new_table(
        tmp_path / "t",
        properties={
            "hoodie.parquet.max.file.size": str(100 * size),
            "hoodie.parquet.small.file.limit": str(size // 2),
        },
    )
    write = writer(table)
    write.insert(numbered(0, 10))
    write.insert(numbered(10, 15))
    assert group_sizes(table) == [10, 15]


def test_small_file_limit_zero_disables_filling(tmp_path: Path) -> None:
    table = new_table(tmp_path, properties={"hoodie.parquet.small.file.limit": "0"})
    write = writer(table)
    write.insert(numbered(0, 3))
    write.insert(numbered(3, 4))
    assert group_sizes(table) == [3, 4]


def test_a_tiny_max_file_size_gives_one_record_per_file_group(tmp_path: Path) -> None:
    table = new_table(tmp_path, properties={"hoodie.parquet.max.file.size": "1"})
    write = writer(table)
    write.insert(numbered(0, 5))
    assert group_sizes(table) == [1] * 5
    write.insert(numbered(5, 3))
    assert group_sizes(table) == [1] * 8
    assert snapshot(table) == rows(numbered(0, 8))
