"""Read a table with hudi-rs (the ``hudi`` package), the reference reader, as sorted lists of row dicts.

Every function returns the rows sorted, as dicts of the data columns (``with_meta=True`` keeps the
``_hoodie_*`` columns), so a test compares exact row sets in one line. :func:`rows` turns cowrite's own
results (Arrow tables) into the same shape. Several mistakes in the format make readers return zero rows
without an error, so tests compare against exact expected rows, never only a count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from hudi import HudiQueryType, HudiReadOptions, HudiTableBuilder

Row = dict[str, Any]

META_PREFIX = "_hoodie_"


def _sort_key(row: Row) -> tuple[tuple[str, bool, Any], ...]:
    # None sorts after every value of its column; values of one column share a type.
    return tuple(
        (name, value is None, value if value is not None else 0) for name, value in sorted(row.items())
    )


def rows(data: pa.Table | Iterable[pa.RecordBatch], with_meta: bool = False) -> list[Row]:
    """The rows of an Arrow table or of record batches, sorted; meta columns dropped unless asked for."""
    batches = data.to_batches() if isinstance(data, pa.Table) else list(data)
    found = [
        {name: value for name, value in row.items() if with_meta or not name.startswith(META_PREFIX)}
        for batch in batches
        for row in batch.to_pylist()
    ]
    return sorted(found, key=_sort_key)


def storage_options_for_s3(fsspec_options: Mapping[str, Any]) -> dict[str, str]:
    """hudi-rs (object_store) options equivalent to the fsspec/s3fs options of a Storage."""
    client = fsspec_options.get("client_kwargs") or {}
    endpoint = client.get("endpoint_url", "")
    return {
        "aws_endpoint_url": endpoint,
        "aws_access_key_id": fsspec_options["key"],
        "aws_secret_access_key": fsspec_options["secret"],
        "aws_region": client.get("region_name", "us-east-1"),
        "aws_allow_http": "true" if endpoint.startswith("http://") else "false",
    }


def _table(uri: str, storage_options: Mapping[str, Any] | None) -> Any:
    builder = HudiTableBuilder.from_base_uri(uri)
    if uri.startswith(("s3://", "s3a://")) and storage_options:
        builder = builder.with_storage_options(storage_options_for_s3(storage_options))
    return builder.build()


def snapshot(
    uri: str, storage_options: Mapping[str, Any] | None = None, with_meta: bool = False
) -> list[Row]:
    """The latest snapshot, as hudi-rs reads it."""
    return rows(_table(uri, storage_options).read(), with_meta)


def as_of(
    uri: str, time: str, storage_options: Mapping[str, Any] | None = None, with_meta: bool = False
) -> list[Row]:
    """Time travel: the snapshot as of an instant's requested time."""
    return rows(_table(uri, storage_options).read(HudiReadOptions().with_as_of_timestamp(time)), with_meta)


def incremental(
    uri: str,
    since: str | None = None,
    until: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    with_meta: bool = False,
) -> list[Row]:
    """Records of the commits completed in ``(since, until]`` (completion times; None = open side)."""
    options = HudiReadOptions().with_query_type(HudiQueryType.Incremental)
    if since is not None:
        options = options.with_start_timestamp(since)
    if until is not None:
        options = options.with_end_timestamp(until)
    return rows(_table(uri, storage_options).read(options), with_meta)
