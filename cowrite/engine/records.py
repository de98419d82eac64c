"""Records as Arrow tables: Hudi's meta columns, record keys, partition paths, and deduplication.

Keys and partition paths are formatted like Hudi's complex key generator so Hudi's readers agree:
a single key field gives the value itself, several give ``field1:value1,field2:value2``; partition paths
join the partition values with ``/`` (``field=value`` when hive-style), a null value becoming
``__HIVE_DEFAULT_PARTITION__``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.errors import SchemaError

COMMIT_TIME = "_hoodie_commit_time"
COMMIT_SEQNO = "_hoodie_commit_seqno"
RECORD_KEY = "_hoodie_record_key"
PARTITION_PATH = "_hoodie_partition_path"
FILE_NAME = "_hoodie_file_name"
META_COLUMNS = (COMMIT_TIME, COMMIT_SEQNO, RECORD_KEY, PARTITION_PATH, FILE_NAME)
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def require_columns(data: pa.Table, columns: Sequence[str], role: str, source: str) -> None:
    missing = [c for c in columns if c not in data.column_names]
    if missing:
        raise SchemaError(
            f"{source} has no {role} column {', '.join(missing)} (columns: {', '.join(data.column_names)}); "
            "add it, or check the table's configuration with `cowrite timeline`"
        )


def _as_strings(column: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    if pa.types.is_timestamp(column.type):
        # microseconds since the epoch, as Hudi's key generators render timestamps
        return pc.cast(pc.cast(column, pa.timestamp("us", tz=column.type.tz)).cast(pa.int64()), pa.string())
    try:
        return pc.cast(column, pa.string())
    except pa.ArrowNotImplementedError as exc:
        raise SchemaError(f"column {name} of type {column.type} cannot be a key or partition field") from exc


def record_keys(data: pa.Table, fields: Sequence[str], source: str = "input") -> pa.ChunkedArray:
    """The ``_hoodie_record_key`` of each row; a null key field is an error."""
    require_columns(data, fields, "record key", source)
    parts = []
    for name in fields:
        values = _as_strings(data.column(name), name)
        if values.null_count:
            raise SchemaError(f"{source}: record key field {name} is null in {values.null_count} row(s)")
        parts.append(values if len(fields) == 1 else pc.binary_join_element_wise(f"{name}:", values, ""))
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, ",")


def partition_paths(
    data: pa.Table, fields: Sequence[str], hive_style: bool, source: str = "input"
) -> pa.ChunkedArray:
    """The ``_hoodie_partition_path`` of each row ("" for a table without partition fields)."""
    if not fields:
        return pa.chunked_array([pa.array([""] * data.num_rows, pa.string())])
    require_columns(data, fields, "partition", source)
    parts = []
    for name in fields:
        values = pc.fill_null(_as_strings(data.column(name), name), DEFAULT_PARTITION)
        parts.append(pc.binary_join_element_wise(f"{name}=", values, "") if hive_style else values)
    paths = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "/")
    if (
        pc.any(pc.equal(pc.utf8_slice_codeunits(paths, 0, 9), "metadata/")).as_py()
        or pc.any(pc.equal(paths, "metadata")).as_py()
    ):
        raise SchemaError(
            f"{source}: a partition may not be named 'metadata' at the top level (Hudi reserves it)"
        )
    return paths


def latest_per_key(data: pa.Table, keys: pa.ChunkedArray, ordering: Sequence[str]) -> pa.Table:
    """One row per key: the largest ordering value wins, a tie goes to the later row."""
    return data.take(latest_positions(data, keys, ordering))


def latest_positions(data: pa.Table, keys: pa.ChunkedArray, ordering: Sequence[str]) -> pa.Array:
    """The positions of :func:`latest_per_key`'s rows in ``data``, ascending."""
    if data.num_rows == 0:
        return pa.array([], pa.int64())
    position = pa.array(range(data.num_rows), pa.int64())
    frame = pa.table({"key": keys, "position": position})
    sort_keys = [("key", "ascending", "at_end")]
    for i, name in enumerate(ordering):
        frame = frame.append_column(f"order{i}", data.column(name))
        sort_keys.append((f"order{i}", "descending", "at_end"))
    sort_keys.append(("position", "descending", "at_end"))
    indices = pc.sort_indices(frame, sort_keys=sort_keys)
    ordered_keys = frame.column("key").take(indices).combine_chunks()
    # after sorting, the first row of each key is its winner
    first = pc.fill_null(pc.not_equal(ordered_keys, _shifted(ordered_keys)), True)
    winners = pc.filter(indices, first)
    return pc.take(winners, pc.sort_indices(winners))


def _shifted(values: pa.Array) -> pa.Array:
    """``values`` moved down by one row, with a null first."""
    return pa.concat_arrays([pa.nulls(1, values.type), values.slice(0, len(values) - 1)])
