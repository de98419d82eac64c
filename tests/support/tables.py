"""The tables and records most tests write, in one shape each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from cowrite.format.table import Table


def new_table(
    path: Path | str,
    *,
    name: str = "t",
    partition_fields: Sequence[str] = ("part",),
    ordering_fields: Sequence[str] = ("ts",),
    properties: Mapping[str, str] | None = None,
    **storage_options: Any,
) -> Table:
    """A new table at ``path`` keyed by ``id``."""
    return Table.create(
        str(path),
        name=name,
        record_key_fields=["id"],
        partition_fields=partition_fields,
        ordering_fields=ordering_fields,
        properties=properties,
        storage_options=storage_options or None,
    )


def rows(ids: Sequence[str], part: str = "p0", ts: int = 1, value: str = "v") -> pa.Table:
    """Records ``(id: string, part, ts: long, value)`` for :func:`new_table`'s default shape."""
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "part": pa.array([part] * len(ids), pa.string()),
            "ts": pa.array([ts] * len(ids), pa.int64()),
            "value": pa.array([value] * len(ids), pa.string()),
        }
    )


def frame(*records: tuple[Any, ...]) -> pa.Table:
    """Records ``(id: long, p: string, ts: long, v: string)`` given as tuples, for tables partitioned by p."""
    ids, ps, ts, vs = zip(*records, strict=True) if records else ((), (), (), ())
    return pa.table({
        "id": pa.array(ids, pa.int64()), "p": pa.array(ps, pa.string()),
        "ts": pa.array(ts, pa.int64()), "v": pa.array(vs, pa.string()),
    })  # fmt: skip
