"""Creating and opening tables: ``hoodie.properties`` as Hudi readers need it, on every backend."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cowrite.errors import ConfigError, InvalidTablePropertiesError, StorageError, TableExistsError
from cowrite.format import config as keys
from cowrite.format.instant import Action, Instant, State
from cowrite.format.properties import format_properties, parse_properties
from cowrite.format.table import PROPERTIES_FILE, Table
from cowrite.storage.backend import Storage


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        escaped = m[1]
        if len(escaped) == 5:
            return chr(int(escaped[1:], 16))
        return {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(escaped, escaped)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, text)


def java_properties(data: bytes) -> dict[str, str]:
    """A plain java-properties parse (comments, ``=``/``:`` separators, backslash escapes), no library."""
    values = {}
    for raw in data.decode("utf-8").splitlines():
        line = raw.lstrip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"((?:\\.|[^=:\s\\])+)\s*[=:\s]\s*(.*)", line)
        assert match is not None, f"not a property line: {line!r}"
        values[_unescape(match[1])] = _unescape(match[2])
    return values


def create(uri: str, storage_options: dict[str, Any], **overrides: Any) -> Table:
    arguments: dict[str, Any] = {
        "name": "trips",
        "record_key_fields": ["trip_id", "leg"],
        "partition_fields": ["region", "day"],
        "ordering_fields": ["ts"],
        "hive_style_partitioning": True,
        "storage_options": storage_options,
    }
    return Table.create(uri, **{**arguments, **overrides})


def test_create_writes_the_properties_readers_need(storage_uri: str, storage_options: dict[str, Any]) -> None:
    table = create(storage_uri, storage_options)
    written = java_properties(Storage.for_uri(storage_uri, **storage_options).read(PROPERTIES_FILE))
    assert {
        "hoodie.table.name": "trips",
        "hoodie.table.type": "COPY_ON_WRITE",
        "hoodie.table.version": "8",
        "hoodie.timeline.layout.version": "2",
        "hoodie.table.recordkey.fields": "trip_id,leg",
        "hoodie.table.partition.fields": "region,day",
        "hoodie.table.ordering.fields": "ts",
        "hoodie.table.precombine.field": "ts",
        "hoodie.datasource.write.hive_style_partitioning": "true",
        "hoodie.table.base.file.format": "PARQUET",
        "hoodie.populate.meta.fields": "true",
        "hoodie.table.timeline.timezone": "UTC",
        "hoodie.table.keygenerator.class": "org.apache.hudi.keygen.ComplexAvroKeyGenerator",
    }.items() <= written.items()
    assert written.get("hoodie.metadata.enable", "false") == "false"
    assert table.config.raw() == written


def test_load_round_trips_the_properties(storage_uri: str, storage_options: dict[str, Any]) -> None:
    created = create(storage_uri, storage_options, properties={"hoodie.parquet.max.file.size": "1048576"})
    loaded = Table.load(storage_uri, **storage_options)
    assert loaded.config.raw() == created.config.raw()
    assert loaded.name == "trips"
    assert loaded.record_key_fields == ("trip_id", "leg")
    assert loaded.partition_fields == ("region", "day")
    assert loaded.ordering_fields == ("ts",)
    assert loaded.hive_style_partitioning is True
    assert loaded.config.get(keys.PARQUET_MAX_FILE_SIZE) == 1048576
    assert loaded.uri == created.uri
    assert list(loaded.timeline()) == []


def test_defaults_of_a_minimal_table(storage_uri: str, storage_options: dict[str, Any]) -> None:
    Table.create(storage_uri, name="t", record_key_fields=["id"], storage_options=storage_options)
    table = Table.load(storage_uri, **storage_options)
    written = java_properties(table.storage.read(PROPERTIES_FILE))
    assert written["hoodie.table.partition.fields"] == ""
    assert written["hoodie.datasource.write.hive_style_partitioning"] == "false"
    assert "hoodie.table.ordering.fields" not in written
    assert (table.partition_fields, table.ordering_fields, table.hive_style_partitioning) == ((), (), False)


def test_precombine_field_alone_is_the_ordering_field(tmp_path: Any) -> None:
    Table.create(
        str(tmp_path), name="t", record_key_fields=["id"], properties={"hoodie.table.precombine.field": "v"}
    )
    assert Table.load(str(tmp_path)).ordering_fields == ("v",)


def test_double_create_raises_table_exists(storage_uri: str, storage_options: dict[str, Any]) -> None:
    create(storage_uri, storage_options)
    before = Storage.for_uri(storage_uri, **storage_options).read(PROPERTIES_FILE)
    with pytest.raises(TableExistsError, match="already exists"):
        create(storage_uri, storage_options, name="other", record_key_fields=["x"])
    assert Storage.for_uri(storage_uri, **storage_options).read(PROPERTIES_FILE) == before
    assert Table.load(storage_uri, **storage_options).name == "trips"


def test_create_rejects_a_table_without_record_key(tmp_path: Any) -> None:
    with pytest.raises(ConfigError):
        Table.create(str(tmp_path), name="t", record_key_fields=[])
    assert not (tmp_path / ".hoodie").exists()


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ({"hoodie.table.type": "MERGE_ON_READ"}, "MERGE_ON_READ"),
        ({"hoodie.table.version": "6"}, "version 6"),
        ({"hoodie.timeline.layout.version": "1"}, "layout 1"),
        ({"hoodie.table.name": ""}, "hoodie.table.name"),
    ],
)
def test_create_refuses_properties_it_cannot_serve(
    tmp_path: Any, override: dict[str, str], problem: str
) -> None:
    with pytest.raises(InvalidTablePropertiesError, match=problem):
        Table.create(str(tmp_path), name="t", record_key_fields=["id"], properties=override)
    assert not (tmp_path / ".hoodie" / "hoodie.properties").exists()


def test_properties_format_round_trips_special_characters() -> None:
    values = {"a.b": "x=y:z", "path": "C:\\dir\\file", "spaces": " lead and trail ", "unicode": "größe ✓"}
    data = format_properties(values)
    assert parse_properties(data, "mem") == values
    assert java_properties(data) == values


def test_commit_metadata_of_a_missing_instant_is_a_storage_error(tmp_path: Any) -> None:
    table = Table.create(str(tmp_path), name="t", record_key_fields=["id"])
    ghost = Instant("20260101120000000", Action.COMMIT, State.COMPLETED, "20260101120000001")
    with pytest.raises(StorageError, match=ghost.file_name):
        table.commit_metadata(ghost)
