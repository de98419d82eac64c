"""A write's changes of the table's schema applied to another writer's (``engine.contract.rebase``); the
multi-process cases are in ``tests/integration/test_schema_contract.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from cowrite.engine.contract import rebase
from cowrite.engine.schema import avro_schema
from cowrite.errors import SchemaError
from cowrite.format.table import Table


def schema(table: Table, **columns: pa.DataType) -> str:
    return avro_schema(pa.schema(list(columns.items())), table.name)


def columns(recorded: str) -> list[tuple[str, str]]:
    return [(f["name"], f["type"][1]) for f in json.loads(recorded)["fields"]]


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return Table.create(str(tmp_path / "t"), name="t", record_key_fields=["id"], partition_fields=["p"])


def test_both_writers_changes_stand_where_a_reader_can_merge_them(table: Table) -> None:
    mine = schema(table, id=pa.int64(), p=pa.string(), n=pa.int64(), t=pa.int64())
    theirs = schema(table, id=pa.int64(), p=pa.string(), n=pa.int32(), s=pa.string())
    assert columns(rebase(table, mine, theirs)) == [
        ("id", "long"), ("p", "string"), ("n", "long"), ("s", "string"), ("t", "long")
    ]  # fmt: skip
    wider = schema(table, id=pa.int64(), p=pa.string(), n=pa.float64())
    assert columns(rebase(table, mine, wider))[2] == ("n", "double")  # my files' longs read as doubles


def test_changes_that_cannot_both_stand_are_refused(table: Table) -> None:
    theirs = schema(table, id=pa.int64(), p=pa.string(), s=pa.string())
    with pytest.raises(SchemaError, match="column s .* the table's type is string, the input's is long"):
        rebase(table, schema(table, id=pa.int64(), p=pa.string(), s=pa.int64()), theirs)
    # a key keeps its type: the table's int would not hold the longs of my files
    narrow_key = schema(table, id=pa.int32(), p=pa.string())
    with pytest.raises(SchemaError, match="column id would be int in the table, long in this write"):
        rebase(table, schema(table, id=pa.int64(), p=pa.string()), narrow_key)
