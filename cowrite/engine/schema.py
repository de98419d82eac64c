"""The Avro schema of a table's data columns, stored in each commit's ``extraMetadata.schema``, and the
Arrow types it stands for.

A column's *kind* is its Avro type in one word (``int``, ``long``, ``string``, ``date``,
``timestamp-millis``, ``decimal(10,2)``, ...): what the table's schema promises, whatever Arrow type a
file or an input carries it in. Comparing kinds, not Arrow types, is what lets an int8 column of a
pandas frame fit an ``int`` column, and refuses a string where a ``long`` is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from cowrite.errors import SchemaError

NULL = "null"  # the kind of a column whose every value is null: it fits any column
_EXTENSION_NAME = b"ARROW:extension:name"  # the metadata naming a field's extension type (Arrow's format)


def kind(name: str, arrow: pa.DataType) -> str:
    """The Avro kind of an Arrow type; :class:`SchemaError` naming column ``name`` if no table stores it."""
    avro = _avro(name, arrow)
    if isinstance(avro, str):
        return avro
    logical = avro["logicalType"]
    return f"decimal({avro['precision']},{avro['scale']})" if logical == "decimal" else str(logical)


def refuse_extension(field: pa.Field, source: str = "") -> None:
    """Raise :class:`SchemaError` for a column of an Arrow extension type (``of {source}`` when given).

    Whether or not this process knows the type: one it does not know reads as its storage type, only a
    name in the field's metadata telling otherwise (a pandas period reads as whole numbers unless pandas
    registered it first), and storing the storage type would change the column's type without a word.
    """
    if isinstance(field.type, pa.BaseExtensionType):
        extension = field.type.extension_name
    else:
        extension = (field.metadata or {}).get(_EXTENSION_NAME, b"").decode(errors="replace")
    if extension:
        where = f" of {source}" if source else ""
        raise SchemaError(
            f"column {field.name}{where} has the Arrow extension type {extension}, which cowrite tables "
            "do not store; convert it to a plain type first"
        )


def refuse_extensions(schema: pa.Schema, source: str = "") -> None:
    """:func:`refuse_extension` for every column of ``schema``."""
    for field in schema:
        refuse_extension(field, source)


def _avro(name: str, arrow: pa.DataType) -> Any:
    if pa.types.is_null(arrow):
        return NULL
    if pa.types.is_boolean(arrow):
        return "boolean"
    if pa.types.is_integer(arrow):
        wide = arrow.bit_width > 32 or (arrow.bit_width == 32 and pa.types.is_unsigned_integer(arrow))
        return "long" if wide else "int"
    if pa.types.is_float32(arrow) or pa.types.is_float16(arrow):
        return "float"
    if pa.types.is_floating(arrow):
        return "double"
    if pa.types.is_string(arrow) or pa.types.is_large_string(arrow):
        return "string"
    if pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        return "bytes"
    if pa.types.is_date(arrow):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_timestamp(arrow):
        # Avro's timestamp is an instant (UTC); a time without a zone is a local-timestamp
        unit = "timestamp-millis" if arrow.unit in ("s", "ms") else "timestamp-micros"
        return {"type": "long", "logicalType": unit if arrow.tz else f"local-{unit}"}
    if pa.types.is_decimal(arrow):
        return {"type": "bytes", "logicalType": "decimal", "precision": arrow.precision, "scale": arrow.scale}
    raise SchemaError(f"column {name} has type {arrow}, which cowrite tables do not store")


def arrow_type(kind_: str) -> pa.DataType:
    """The Arrow type a column of this kind is read as."""
    simple = {
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "string": pa.string(),
        "bytes": pa.binary(),
        "date": pa.date32(),
    }
    if kind_ in simple:
        return simple[kind_]
    if kind_.startswith(("timestamp-", "local-timestamp-")):  # instants are kept in UTC
        zone = None if kind_.startswith("local-") else "UTC"
        return pa.timestamp("ms" if kind_.endswith("millis") else "us", tz=zone)
    decimal = re.fullmatch(r"decimal\((\d+),(\d+)\)", kind_)
    if decimal:
        return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
    raise SchemaError(f"the table's schema has a column of type {kind_}, which cowrite cannot read")


def avro_schema(schema: pa.Schema, table_name: str) -> str:
    """Avro record schema (JSON) for the data columns of ``schema``; every field nullable."""
    name = re.sub(r"\W", "_", table_name) or "table"
    record = {
        "type": "record",
        "name": f"{name}_record",
        "namespace": f"hoodie.{name}",
        "fields": [{"name": f.name, "type": ["null", _stored(f)], "default": None} for f in schema],
    }
    return json.dumps(record)


def _stored(field: pa.Field) -> Any:
    avro = _avro(field.name, field.type)
    if avro == NULL:
        raise SchemaError(f"column {field.name} has type null, which cowrite tables do not store")
    return avro


def arrow_schema(avro_json: str, source: str = "the table's schema") -> pa.Schema:
    """The Arrow schema an Avro record schema (a commit's, or ``hoodie.table.create.schema``) stands for.

    Raises :class:`SchemaError` naming ``source`` if it is not an Avro record of types cowrite stores.
    """
    try:
        record = json.loads(avro_json)
        fields = record["fields"]
        assert isinstance(fields, list)
        return pa.schema([pa.field(str(f["name"]), arrow_type(_kind_of(f["type"]))) for f in fields])
    except SchemaError:
        raise
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise SchemaError(f"{source} is not an Avro record schema: {exc!r}") from None


def _kind_of(avro: Any) -> str:
    if isinstance(avro, list):  # a union: ["null", T] is a nullable T
        others = [a for a in avro if a != NULL]
        if len(others) != 1:
            raise SchemaError(f"unions other than [null, T] are not supported: {avro}")
        return _kind_of(others[0])
    if isinstance(avro, str):
        return avro
    logical = avro.get("logicalType")
    if logical == "decimal":
        return f"decimal({avro['precision']},{avro.get('scale', 0)})"
    if logical in ("date", *(f"{p}timestamp-{u}" for p in ("", "local-") for u in ("millis", "micros"))):
        return str(logical)
    return _kind_of(avro["type"])
