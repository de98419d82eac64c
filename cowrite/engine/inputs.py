"""Input files for writes: parquet, CSV or JSON Lines, a file or a directory of them.

Text is parsed with the table's column types, never by guessing: ``"2024-01-02"`` and ``"00777"`` stay
strings in a string column, and ``abc`` in a ``long`` column is refused with the column, the line and
the table's type. Only a column the table does not have yet has no type to follow, so its type is
inferred, narrowly: from CSV text, whole numbers without leading zeros become ``long``, decimal numbers
``double``, ``true``/``false`` ``boolean``, anything else a string (never a date or a time); from JSON,
the JSON type of its values (a string stays a string, whatever it looks like). An empty field of a CSV
file is null; a quoted empty field is the empty string. Files are UTF-8, with or without a byte-order mark.
"""

from __future__ import annotations

import csv as pycsv
import json
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as csv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from cowrite.engine.schema import kind, refuse_extensions
from cowrite.errors import SchemaError

KINDS = {".parquet": "parquet", ".csv": "csv", ".json": "jsonl", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_BOM = b"\xef\xbb\xbf"
_WHOLE = r"^-?(0|[1-9][0-9]{0,17})$"
_DECIMAL = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$"


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


def read_input(path: str, input_format: str | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """All input files as one Arrow table; the format comes from each file's suffix unless given. Text is
    parsed with the types of ``schema`` (the table's), see the module's docstring.

    Raises :class:`SchemaError` for a file that cannot be read or a value that does not fit its column.
    """
    tables = []
    for file in input_files(path):
        kind_ = input_format or KINDS.get(file.suffix.lower())
        try:
            if kind_ == "parquet":
                tables.append(pq.ParquetFile(file).read())
                refuse_extensions(tables[-1].schema, str(file))
            elif kind_ == "csv":
                tables.append(_read_csv(file, schema))
            elif kind_ == "jsonl":
                tables.append(_read_json(file, schema))
            else:
                raise SchemaError(f"cannot tell the format of {file}; pass --input-format parquet|csv|jsonl")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SchemaError(f"cannot read {file} as {kind_}: {_first_line(exc)}") from None
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        problem = _first_line(exc)
        raise SchemaError(f"the files of {path} do not share their columns' types: {problem}") from None


def parquet_footers(files: Iterable[str | Path]) -> list[pq.FileMetaData]:
    """The footers of these parquet files. Raises :class:`SchemaError` for a file that is not parquet, or
    for a column of an Arrow extension type, which Spark reads as its storage type without a word
    (:func:`~.schema.refuse_extension`)."""
    footers = []
    for file in files:
        try:
            footer = pq.read_metadata(file)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError(f"cannot read {file} as parquet: {_first_line(exc)}") from None
        refuse_extensions(footer.schema.to_arrow_schema(), str(file))
        footers.append(footer)
    return footers


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _text(file: Path) -> bytes:
    data = file.read_bytes()
    data = data[len(_BOM) :] if data.startswith(_BOM) else data
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SchemaError(f"{file} is not UTF-8 text (line {line}); convert it to UTF-8") from None
    return data


# -- CSV -----------------------------------------------------------------------------------------------


def _read_csv(file: Path, schema: pa.Schema | None) -> pa.Table:
    data = _text(file)
    if not data.strip():
        return pa.table({})
    header = next(pycsv.reader([data.split(b"\n", 1)[0].decode().rstrip("\r")]))
    raw = csv.read_csv(
        pa.BufferReader(data),
        parse_options=csv.ParseOptions(newlines_in_values=True),
        convert_options=csv.ConvertOptions(
            column_types={name: pa.string() for name in header},
            strings_can_be_null=True,
            null_values=[""],
            quoted_strings_can_be_null=False,
        ),
    )
    columns = {}
    for name in raw.column_names:
        text = raw.column(name)
        if schema is not None and name in schema.names:
            columns[name] = _parsed(text, schema.field(name).type, name, file)
        else:
            columns[name] = _inferred(text)
    return pa.table(columns)


def _parsed(text: pa.ChunkedArray, target: pa.DataType, name: str, file: Path) -> pa.ChunkedArray:
    try:
        return _cast_text(text, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    wanted = kind(name, target)
    for row, value in enumerate(text.to_pylist(), start=2):  # line 1 is the header
        try:
            _cast_text(pa.chunked_array([[value]], pa.string()), target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise SchemaError(
                f"column {name} of {file}: {value!r} (line {row}) is not a {wanted}, the table's type"
            ) from None
    raise SchemaError(f"column {name} of {file} does not parse as {wanted}, the table's type")


def _cast_text(text: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    try:
        return pc.cast(text, target)
    except pa.ArrowInvalid:
        if not (pa.types.is_timestamp(target) and target.tz):
            raise
    # a time without an offset in a column of instants: a time in the column's zone, as JSON reads it
    local = pc.cast(text, pa.timestamp(target.unit))
    return pc.assume_timezone(local, target.tz)


def _inferred(text: pa.ChunkedArray) -> pa.ChunkedArray:
    values = text.drop_null()
    if len(values) == 0:
        return text
    if pc.all(pc.match_substring_regex(values, _WHOLE)).as_py():
        return pc.cast(text, pa.int64())
    if pc.all(pc.match_substring_regex(values, _DECIMAL)).as_py():
        return pc.cast(text, pa.float64())
    if pc.all(pc.is_in(pc.utf8_lower(values), pa.array(["true", "false"]))).as_py():
        return pc.cast(pc.utf8_lower(text), pa.bool_())
    return text


# -- JSON Lines ----------------------------------------------------------------------------------------


def _read_json(file: Path, schema: pa.Schema | None) -> pa.Table:
    data = _text(file)
    if not data.strip():
        return pa.table({})
    # The table's columns that the file names at all; a column it never names is missing, not null.
    named = [f for f in schema or () if json.dumps(f.name).encode() in data]
    try:
        table = _parse_json(data, pa.schema(named))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        problem = _json_problem(data, schema, file)
        raise SchemaError(problem or f"cannot read {file} as jsonl: {_first_line(exc)}") from None
    # JSON has no dates or times: a new column pyarrow read as one was text, and stays text
    guessed = [
        pa.field(f.name, pa.string())
        for f in table.schema
        if f.name not in (schema or pa.schema([])).names
        and (pa.types.is_timestamp(f.type) or pa.types.is_date(f.type) or pa.types.is_time(f.type))
    ]
    return _parse_json(data, pa.schema([*named, *guessed])) if guessed else table


def _parse_json(data: bytes, explicit: pa.Schema) -> pa.Table:
    options = pajson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="infer")
    return pajson.read_json(pa.BufferReader(data), parse_options=options)


_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (int, float),
    "double": (int, float),
    "string": (str,),
}


def _json_problem(data: bytes, schema: pa.Schema | None, file: Path) -> str | None:
    """The first value of the file that does not fit its column, in words; None if there is none."""
    for line, text in enumerate(data.decode().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except ValueError as exc:
            return f"line {line} of {file} is not JSON: {exc}"
        if not isinstance(record, dict):
            return f"line {line} of {file} is not a JSON object"
        for name, value in record.items():
            if value is None or schema is None or name not in schema.names:
                continue
            target = schema.field(name).type
            wanted = kind(name, target)
            allowed = _JSON_KINDS.get(wanted)
            fits = (
                isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
                if allowed
                else isinstance(value, str | int | float) and not isinstance(value, bool)
            )
            if not fits:
                return (
                    f"column {name} of {file}: {json.dumps(value)} (line {line}) is not a {wanted}, "
                    "the table's type"
                )
    return None
