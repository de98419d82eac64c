"""Bad tables and bad input: typed errors naming the file or column; a failed write leaves no trace."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cowrite import process
from cowrite.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    CorruptTimelineError,
    InvalidTablePropertiesError,
    SchemaError,
    TableNotFoundError,
)
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.properties import format_properties
from cowrite.format.table import PROPERTIES_FILE, Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.storage.backend import Storage

IN_PROCESS = {"hoodie.write.lock.provider": "in-process"}

GOOD_PROPERTIES = {
    "hoodie.table.name": "t",
    "hoodie.table.type": "COPY_ON_WRITE",
    "hoodie.table.version": "8",
    "hoodie.timeline.layout.version": "2",
    "hoodie.table.recordkey.fields": "id",
    "hoodie.table.partition.fields": "p",
}


def writer(table: Table) -> LocalWriter:
    return LocalWriter(table, WriteOptions(config=table.config.with_values(IN_PROCESS)))


def frame(*records: tuple[Any, ...]) -> pa.Table:
    ids, ps, vs = zip(*records, strict=True)
    return pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array(ps, pa.string()), "v": pa.array(vs)})


def files(storage: Storage) -> dict[str, bytes]:
    """Every file of the table (timeline, properties, heartbeats, locks, data) with its content."""
    return {i.path: storage.read(i.path) for i in storage.walk_files()}


def heartbeat_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("heartbeat-") and t.is_alive()]


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """A table with two completed commits."""
    created = Table.create(str(tmp_path), name="t", record_key_fields=["id"], partition_fields=["p"])
    write = writer(created)
    write.insert(frame((1, "a", "one"), (2, "b", "two")))
    write.upsert(frame((1, "a", "one-v2")))
    return created


def completed(table: Table) -> list[Instant]:
    return list(table.timeline().completed())


# -- not a table -------------------------------------------------------------------------------------------
def test_missing_properties_raise_table_not_found_naming_the_path(
    storage_uri: str, storage_options: dict[str, Any]
) -> None:
    storage = Storage.for_uri(storage_uri, **storage_options)
    with pytest.raises(TableNotFoundError) as raised:
        Table.load(storage_uri, **storage_options)
    assert storage.full_path(PROPERTIES_FILE) in str(raised.value)
    assert storage.walk_files() == []  # looking created nothing


def test_a_directory_that_is_not_a_table(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.parquet").write_bytes(b"PAR1")
    (tmp_path / ".hoodie" / "timeline").mkdir(parents=True)
    with pytest.raises(TableNotFoundError, match=str(tmp_path / ".hoodie" / "hoodie.properties")):
        Table.load(str(tmp_path))
    with pytest.raises(TableNotFoundError):
        Table.load(str(tmp_path / "data" / "part-0.parquet"))


# -- bad hoodie.properties ---------------------------------------------------------------------------------
def write_properties(path: Path, content: bytes) -> str:
    (path / ".hoodie").mkdir(parents=True, exist_ok=True)
    (path / ".hoodie" / "hoodie.properties").write_bytes(content)
    return str(path / ".hoodie" / "hoodie.properties")


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00\x01 not text",
        b"hoodie.table.name=\\u12",  # a broken unicode escape
        b"",
        b"\x00\x01\x02",
        b"<html><body>404 Not Found</body></html>",
    ],
)
def test_corrupt_properties(tmp_path: Path, content: bytes) -> None:
    path = write_properties(tmp_path, content)
    with pytest.raises(InvalidTablePropertiesError, match=path):
        Table.load(str(tmp_path))


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"hoodie.table.version": "6"}, "version 6"),
        ({"hoodie.table.version": "9"}, "version 9"),
        ({"hoodie.timeline.layout.version": "1"}, "layout 1"),
        ({"hoodie.table.version": "eight"}, "eight"),
        ({"hoodie.timeline.layout.version": "two"}, "two"),
        ({"hoodie.table.version": None}, "hoodie.table.version"),
        ({"hoodie.table.name": None}, "hoodie.table.name"),
        ({"hoodie.table.type": "MERGE_ON_READ"}, "MERGE_ON_READ"),
        ({"hoodie.table.recordkey.fields": None}, "hoodie.table.recordkey.fields"),
        ({"hoodie.table.recordkey.fields": " , "}, "hoodie.table.recordkey.fields"),
        ({"hoodie.datasource.write.hive_style_partitioning": "maybe"}, "hive_style_partitioning"),
        ({"hoodie.parquet.max.file.size": "-5"}, "hoodie.parquet.max.file.size"),
    ],
)
def test_malformed_or_unsupported_properties(
    tmp_path: Path, changes: dict[str, str | None], problem: str
) -> None:
    values = {k: v for k, v in {**GOOD_PROPERTIES, **changes}.items() if v is not None}
    path = write_properties(tmp_path, format_properties(values))
    with pytest.raises(InvalidTablePropertiesError) as raised:
        Table.load(str(tmp_path))
    assert path in str(raised.value) and problem in str(raised.value)


def test_the_good_properties_load(tmp_path: Path) -> None:
    write_properties(tmp_path, format_properties(GOOD_PROPERTIES))
    assert Table.load(str(tmp_path)).partition_fields == ("p",)


# -- corrupt timeline files --------------------------------------------------------------------------------
def corrupt(table: Table, instant: Instant, how: str) -> str:
    path = table.instant_path(instant)
    data = table.storage.read(path)
    table.storage.write(path, data[: len(data) // 2] if how == "truncated" else b"\x00garbage\xff" * 3)
    process.forget()  # as a new process would read it: completed files never change
    return table.storage.full_path(path)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_incremental_read_over_a_corrupt_commit_names_the_file(table: Table, how: str) -> None:
    first, second = completed(table)
    path = corrupt(table, second, how)
    with pytest.raises(CorruptTimelineError, match=path) as raised:
        read.incremental(table, first.completion_time, None)
    assert raised.value.path == path
    # a range that ends before it fails too: a corrupt commit is never skipped, whatever the read
    with pytest.raises(CorruptTimelineError, match=path):
        read.incremental(table, None, first.completion_time)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_snapshot_over_a_corrupt_replacecommit_names_the_file(table: Table, how: str) -> None:
    replace = writer(table).insert_overwrite(frame((3, "a", "three")))
    path = corrupt(table, replace, how)
    with pytest.raises(CorruptTimelineError, match=path):
        read.snapshot(table)
    with pytest.raises(CorruptTimelineError, match=path):
        read.snapshot(table, as_of=replace.requested_time)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_write_that_reads_a_corrupt_commit_fails_without_a_trace(table: Table, how: str) -> None:
    """A delete reads the latest commit's schema; the corrupt file stops it before any data is written."""
    _, second = completed(table)
    before_completed, before_rows = completed(table), read.snapshot(table).to_pylist()
    original = table.storage.read(table.instant_path(second))
    path = corrupt(table, second, how)
    data_before = {p for p in files(table.storage) if p.endswith(".parquet")}
    threads_before = heartbeat_threads()
    with pytest.raises(CorruptTimelineError, match=path):
        writer(table).delete(pa.table({"id": [2]}))
    assert completed(table) == before_completed
    assert {p for p in files(table.storage) if p.endswith(".parquet")} == data_before
    assert heartbeat_threads() == threads_before
    # the lock was released: the next write is refused for the corruption too, not left waiting
    with pytest.raises(CorruptTimelineError, match=path):
        writer(table).upsert(frame((4, "b", "four")))
    table.storage.write(table.instant_path(second), original)  # repaired, the table reads as before
    assert read.snapshot(table).to_pylist() == before_rows


def test_a_corrupt_commit_that_completed_concurrently_fails_the_commit_cleanly(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's commit completes (corrupt) while we write: our instant must fail, and clean up."""
    before_completed, before_rows = completed(table), read.snapshot(table).to_pylist()
    data_before = {p for p in files(table.storage) if p.endswith(".parquet")}
    others: list[Instant] = []
    ours: list[Transaction] = []
    plan = Transaction.plan

    def plan_then_other_writer_completes(self: Transaction, planned: CommitMetadata) -> None:
        plan(self, planned)
        ours.append(self)
        requested = from_millis(to_millis(self.instant_time) + 1)
        other = Instant(requested, Action.COMMIT, State.COMPLETED, from_millis(to_millis(requested) + 1))
        self.table.storage.write(self.table.instant_path(other), b"\x00garbage")
        others.append(other)

    monkeypatch.setattr(Transaction, "plan", plan_then_other_writer_completes)
    threads_before = heartbeat_threads()
    with pytest.raises((CorruptTimelineError, CommitFailedError)) as raised:
        writer(table).upsert(frame((1, "a", "lost"), (5, "a", "lost")))
    monkeypatch.undo()
    threads_after = heartbeat_threads()
    for transaction in ours:  # whatever the outcome, leave no thread running into other tests
        assert transaction.heartbeat is not None
        transaction.heartbeat.stop(delete=False)
    assert not isinstance(raised.value, CommitStateUnknownError)
    (garbage,) = others
    assert table.storage.full_path(table.instant_path(garbage)) in str(raised.value)
    assert [i for i in completed(table) if i != garbage] == before_completed
    with pytest.raises(CorruptTimelineError):  # until someone removes the garbage
        read.snapshot(table)
    table.storage.delete(table.instant_path(garbage))
    assert read.snapshot(table).to_pylist() == before_rows
    # the instant definitely did not commit: its data files are removed and its heartbeat stops
    data_after = {p for p in files(table.storage) if p.endswith(".parquet")}
    assert (data_after, threads_after) == (data_before, threads_before)


# -- bad input data: nothing may be written ----------------------------------------------------------------
@pytest.fixture
def any_table(storage_uri: str, storage_options: dict[str, Any]) -> Table:
    created = Table.create(
        storage_uri, name="t", record_key_fields=["id", "k2"], partition_fields=["p"], ordering_fields=["ts"],
        storage_options=storage_options,
    )  # fmt: skip
    writer(created).insert(
        pa.table({"id": [1, 2], "k2": ["x", "y"], "p": ["a", "b"], "ts": [1, 1], "v": ["one", "two"]})
    )
    return created


BAD_INPUTS = [
    ("insert", {"k2": ["x"], "p": ["a"], "ts": [1]}, "record key column id"),
    ("upsert", {"id": [1], "p": ["a"], "ts": [1]}, "record key column k2"),
    ("delete", {"k2": ["x"]}, "record key column id"),
    (
        "insert",
        {"id": [1, None], "k2": ["x", "y"], "p": ["a", "a"], "ts": [1, 1]},
        "field id is null in 1 row",
    ),
    (
        "upsert",
        {"id": [1, 2, 3], "k2": [None, None, "z"], "p": ["a"] * 3, "ts": [1] * 3},
        "field k2 is null in 2",
    ),
    ("delete", {"id": [None], "k2": ["x"]}, "field id is null"),
    ("insert_overwrite", {"id": [None], "k2": ["x"], "p": ["a"], "ts": [1]}, "field id is null"),
    ("insert", {"id": [1], "k2": ["x"], "ts": [1]}, "partition column p"),
    ("upsert", {"id": [1], "k2": ["x"], "p": ["a"]}, "ordering column ts"),
    ("insert", {"id": [1], "k2": ["x"], "p": ["metadata"], "ts": [1]}, "metadata"),
    ("insert", {"id": [1], "k2": ["x"], "p": ["a"], "ts": [1], "tags": [[1, 2]]}, "tags"),
    ("upsert", {"id": [1], "k2": ["x"], "p": ["a"], "ts": [1], "s": [{"f": 1}]}, "column s"),
]


@pytest.mark.parametrize(("operation", "columns", "message"), BAD_INPUTS)
def test_bad_input_raises_schema_error_and_writes_nothing(
    any_table: Table, operation: str, columns: dict[str, list[Any]], message: str
) -> None:
    before = files(any_table.storage)
    rows_before = read.snapshot(any_table).to_pylist()
    threads_before = heartbeat_threads()
    with pytest.raises(SchemaError, match=message):
        writer(any_table).write(pa.table(columns), operation)
    assert files(any_table.storage) == before
    assert read.snapshot(any_table).to_pylist() == rows_before
    assert heartbeat_threads() == threads_before


def test_bad_input_with_the_default_lock_writes_nothing(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path), name="t", record_key_fields=["id"])
    LocalWriter(table).insert(pa.table({"id": [1]}))
    before = files(table.storage)
    with pytest.raises(SchemaError, match="record key column id"):
        LocalWriter(table).insert(pa.table({"other": [1]}))
    assert files(table.storage) == before
    assert list(table.timeline()) == completed(table) and len(completed(table)) == 1
    assert sorted(p for p in before if p.startswith(TIMELINE_DIR)) == sorted(
        f"{TIMELINE_DIR}/{name}" for name in (
            f"{completed(table)[0].requested_time}.commit.requested",
            f"{completed(table)[0].requested_time}.inflight",
            completed(table)[0].file_name,
        )
    )  # fmt: skip
