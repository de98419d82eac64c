"""Commit metadata: a real Avro object container file, Hudi's field names, exact round trip."""

from __future__ import annotations

import io
import json

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cowrite.errors import CorruptTimelineError
from cowrite.format.commit_metadata import _SCHEMAS, CommitMetadata, WriteStat
from cowrite.format.instant import Action

SCHEMA = json.dumps({"type": "record", "name": "r", "fields": [{"name": "id", "type": ["null", "long"]}]})


def stat(partition: str, file_id: str, instant: str = "20260101120000000", prev: str = "null") -> WriteStat:
    name = f"{file_id}_0-0-1_{instant}.parquet"
    return WriteStat(
        file_id=file_id,
        path=f"{partition}/{name}" if partition else name,
        partition_path=partition,
        prev_commit=prev,
        num_writes=10,
        num_inserts=7,
        num_update_writes=3,
        num_deletes=1,
        file_size=4321,
    )


COMMIT = CommitMetadata(
    operation="upsert",
    write_stats=(stat("a", "f1-0"), stat("a", "f2-0", prev="20250101000000000"), stat("b/x=1", "f3-0")),
    schema=SCHEMA,
    extra={"checkpoint": "42"},
)
REPLACE = CommitMetadata(
    operation="insert_overwrite",
    write_stats=(stat("a", "f9-0"),),
    replaced_file_ids={"a": ("f1-0", "f2-0"), "c": ("f7-0",)},
    schema=SCHEMA,
)


def avro_record(data: bytes) -> tuple[dict, dict]:  # type: ignore[type-arg]
    reader = fastavro.reader(io.BytesIO(data))
    records = list(reader)
    assert len(records) == 1
    return reader.writer_schema, records[0]


@pytest.mark.parametrize(("metadata", "action"), [(COMMIT, Action.COMMIT), (REPLACE, Action.REPLACE_COMMIT)])
def test_round_trip(metadata: CommitMetadata, action: Action) -> None:
    assert CommitMetadata.from_bytes(metadata.to_bytes(action), "x") == metadata


def test_a_commit_is_an_avro_container_file_with_hudi_field_names() -> None:
    data = COMMIT.to_bytes(Action.COMMIT)
    assert data[:4] == b"Obj\x01"
    schema, record = avro_record(data)
    assert schema["name"] == "org.apache.hudi.avro.model.HoodieCommitMetadata"
    names = [f["name"] for f in schema["fields"]]
    assert {"partitionToWriteStats", "extraMetadata", "operationType"} <= set(names)
    assert "partitionToReplaceFileIds" not in names
    assert record["operationType"] == "upsert"
    assert record["extraMetadata"] == {"checkpoint": "42", "schema": SCHEMA}
    assert sorted(record["partitionToWriteStats"]) == ["a", "b/x=1"]
    first = record["partitionToWriteStats"]["a"][1]
    assert {
        "fileId": "f2-0",
        "path": "a/f2-0_0-0-1_20260101120000000.parquet",
        "prevCommit": "20250101000000000",
        "numWrites": 10,
        "numInserts": 7,
        "numUpdateWrites": 3,
        "numDeletes": 1,
        "fileSizeInBytes": 4321,
        "totalWriteBytes": 4321,
        "partitionPath": "a",
    }.items() <= first.items()
    assert record["partitionToWriteStats"]["a"][0]["prevCommit"] == "null"


def test_a_replacecommit_lists_replaced_file_ids() -> None:
    schema, record = avro_record(REPLACE.to_bytes(Action.REPLACE_COMMIT))
    assert schema["name"] == "org.apache.hudi.avro.model.HoodieReplaceCommitMetadata"
    assert record["partitionToReplaceFileIds"] == {"a": ["f1-0", "f2-0"], "c": ["f7-0"]}
    assert record["operationType"] == "insert_overwrite"
    assert [s["fileId"] for s in record["partitionToWriteStats"]["a"]] == ["f9-0"]


def test_touched_file_groups_are_written_and_replaced() -> None:
    assert REPLACE.touched_file_groups == {("a", "f9-0"), ("a", "f1-0"), ("a", "f2-0"), ("c", "f7-0")}
    assert COMMIT.touched_file_groups == {("a", "f1-0"), ("a", "f2-0"), ("b/x=1", "f3-0")}


def test_an_empty_commit_round_trips() -> None:
    empty = CommitMetadata(operation="delete")
    assert CommitMetadata.from_bytes(empty.to_bytes(Action.COMMIT), "x") == empty
    _, record = avro_record(empty.to_bytes(Action.COMMIT))
    assert record["partitionToWriteStats"] == {}


def test_a_reader_with_only_the_fields_it_needs_reads_a_commit() -> None:
    """Readers resolve fields by name: a reader schema with a subset of fields works (schema resolution)."""
    reader_schema = {
        "type": "record",
        "name": "HoodieCommitMetadata",
        "namespace": "org.apache.hudi.avro.model",
        "fields": [{"name": "operationType", "type": ["null", "string"], "default": None}],
    }
    records = list(fastavro.reader(io.BytesIO(COMMIT.to_bytes(Action.COMMIT)), reader_schema))
    assert records == [{"operationType": "upsert"}]


@pytest.mark.parametrize("action", [Action.COMMIT, Action.REPLACE_COMMIT])
def test_the_bytes_are_what_fastavro_writes(action: Action) -> None:
    data = REPLACE.to_bytes(action)
    _, record = avro_record(data)
    expected = io.BytesIO()
    fastavro.writer(expected, _SCHEMAS[action], [record], sync_marker=data[-16:])  # the file's own marker
    assert data == expected.getvalue()


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_a_commit_another_writer_wrote_in_several_blocks_reads_the_same(codec: str) -> None:
    _, record = avro_record(COMMIT.to_bytes(Action.COMMIT))
    other = io.BytesIO()
    fastavro.writer(other, _SCHEMAS[Action.COMMIT], [record], codec=codec, sync_interval=1)
    assert CommitMetadata.from_bytes(other.getvalue(), "x.commit") == COMMIT
    two = io.BytesIO()
    fastavro.writer(two, _SCHEMAS[Action.COMMIT], [record, record], codec=codec, sync_interval=1)
    with pytest.raises(CorruptTimelineError, match="expected one commit record, found 2"):
        CommitMetadata.from_bytes(two.getvalue(), "x.commit")


def test_a_block_from_another_file_raises_corrupt_timeline() -> None:
    first, second = COMMIT.to_bytes(Action.COMMIT), COMMIT.to_bytes(Action.COMMIT)
    spliced = first[: len(first) - 16] + second[-16:]  # the same record, another file's sync marker
    with pytest.raises(CorruptTimelineError, match="sync marker"):
        CommitMetadata.from_bytes(spliced, "x.commit")


@pytest.mark.parametrize("cut", [0, 3, 10, 40, -40, -17, -16, -8, -1])
def test_truncated_files_raise_corrupt_timeline_naming_the_file(cut: int) -> None:
    data = COMMIT.to_bytes(Action.COMMIT)
    with pytest.raises(CorruptTimelineError, match="table/.hoodie/timeline/x.commit") as raised:
        CommitMetadata.from_bytes(data[:cut], "table/.hoodie/timeline/x.commit")
    assert raised.value.path == "table/.hoodie/timeline/x.commit"


def test_trailing_bytes_after_the_record_raise_corrupt_timeline() -> None:
    data = COMMIT.to_bytes(Action.COMMIT)
    with pytest.raises(CorruptTimelineError, match="x.commit"):
        CommitMetadata.from_bytes(data + b"\x02junk", "x.commit")


@pytest.mark.parametrize("garbage", [b"garbage", b"{}", b"Obj\x01" + b"\x00" * 40, bytes(range(256))])
def test_garbage_raises_corrupt_timeline(garbage: bytes) -> None:
    with pytest.raises(CorruptTimelineError, match="x.commit"):
        CommitMetadata.from_bytes(garbage, "x.commit")


names = st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=8)
stats = st.builds(
    WriteStat,
    file_id=names,
    path=names,
    partition_path=st.sampled_from(["", "a", "a/b", "x=1/y=__HIVE_DEFAULT_PARTITION__"]),
    prev_commit=st.sampled_from(["null", "20260101120000000"]),
    num_writes=st.integers(0, 2**40),
    num_inserts=st.integers(0, 2**40),
    num_update_writes=st.integers(0, 2**40),
    num_deletes=st.integers(0, 2**40),
    file_size=st.integers(0, 2**40),
)


@given(
    st.lists(stats, max_size=6),
    st.dictionaries(names, st.lists(names, max_size=3).map(tuple), max_size=3),
    st.dictionaries(names.filter(lambda n: n != "schema"), names, max_size=3),
)
def test_any_replacecommit_round_trips(
    write_stats: list[WriteStat], replaced: dict[str, tuple[str, ...]], extra: dict[str, str]
) -> None:
    metadata = CommitMetadata("insert_overwrite", tuple(write_stats), replaced, SCHEMA, extra)
    parsed = CommitMetadata.from_bytes(metadata.to_bytes(Action.REPLACE_COMMIT), "x")
    # stats come back grouped by partition, in their order within each partition
    assert parsed.stats_by_partition() == metadata.stats_by_partition()
    assert (parsed.replaced_file_ids, parsed.schema, parsed.extra) == (replaced, SCHEMA, extra)
