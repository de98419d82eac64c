"""The write operations, and how every engine holds an input to the table before writing it.

Operations follow Hudi's:

- ``insert``: new records, appended (small file groups are filled first); keys are not looked up.
- ``upsert``: records replace the stored record of their key; the ordering field decides between versions
  of a key, within the batch and against the stored record (the larger wins, a tie goes to the newer).
- ``delete``: the keys given are removed (partition columns, if present, narrow the lookup).
- ``insert_overwrite``: the partitions present in the input are replaced by its records (replacecommit).
"""

from __future__ import annotations

import enum

import pyarrow as pa

from cowrite.engine.contract import conform, fit
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY, latest_per_key, partition_paths, record_keys
from cowrite.format.instant import Action
from cowrite.format.table import Table


class Operation(enum.StrEnum):
    INSERT = "insert"
    UPSERT = "upsert"
    DELETE = "delete"
    INSERT_OVERWRITE = "insert_overwrite"

    @property
    def action(self) -> Action:
        return Action.REPLACE_COMMIT if self is Operation.INSERT_OVERWRITE else Action.COMMIT

    @property
    def merges(self) -> bool:
        """Whether records are looked up by key (and deduplicated first)."""
        return self is not Operation.INSERT


def prepare(
    table: Table, data: pa.Table, operation: Operation, source: str, current: pa.Schema | None
) -> pa.Table:
    """``data`` fitted to the table's schema ``current`` (:mod:`.contract`), with its record key and
    partition path columns, deduplicated by key where the operation merges.

    Raises :class:`SchemaError` (naming ``source``) for input that does not fit: a missing or null key, a
    bad partition value, a type the table cannot take. Hudi's meta columns in the input are dropped.
    """
    if any(name.startswith("_hoodie_") for name in data.column_names):
        data = data.drop_columns([n for n in data.column_names if n.startswith("_hoodie_")])
    delete = operation is Operation.DELETE
    data = conform(data, fit(data.schema, current, table, delete, source).target, source)
    key_column = record_keys(data, table.record_key_fields, source)
    if delete and not all(f in data.column_names for f in table.partition_fields):
        paths = pa.nulls(data.num_rows, pa.string())  # found by a lookup over all partitions
    else:
        paths = partition_paths(data, table.partition_fields, table.hive_style_partitioning, source)
    prepared = data.append_column(RECORD_KEY, key_column).append_column(PARTITION_PATH, paths)
    if operation.merges:
        ordering = () if delete else table.ordering_fields
        prepared = latest_per_key(prepared, prepared.column(RECORD_KEY), ordering)
    return prepared
