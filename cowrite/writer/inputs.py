"""Input files for writes: parquet, CSV or JSON Lines, a file or a directory of them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as csv
import pyarrow.dataset as ds
import pyarrow.json as pajson

from ..timeline.errors import SchemaError

KINDS = {".parquet": "parquet", ".csv": "csv", ".json": "jsonl", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def input_files(path: str) -> list[Path]:
    """The files to read at ``path``: itself, or every visible file below it (``_SUCCESS`` and the like
    are skipped); raises :class:`SchemaError` when there is nothing."""
    source = Path(path)
    if not source.exists():
        raise SchemaError(f"input {path} does not exist")
    if not source.is_dir():
        return [source]
    files = sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise SchemaError(f"input directory {path} holds no files")
    return files


def read_input(path: str, input_format: str | None = None) -> pa.Table:
    """All input files as one Arrow table; the format comes from each file's suffix unless given."""
    tables = []
    for file in input_files(path):
        kind = input_format or KINDS.get(file.suffix.lower())
        try:
            if kind == "parquet":
                tables.append(ds.dataset(file, format="parquet").to_table())
            elif kind == "csv":
                tables.append(csv.read_csv(file))
            elif kind == "jsonl":
                tables.append(pajson.read_json(file))
            else:
                raise SchemaError(f"cannot tell the format of {file}; pass --input-format parquet|csv|jsonl")
        except pa.ArrowInvalid as exc:
            raise SchemaError(f"cannot read {file} as {kind}: {exc}") from None
    return pa.concat_tables(tables, promote_options="permissive")
