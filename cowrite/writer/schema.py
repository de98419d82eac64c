"""The Avro schema of a table's data columns, stored in each commit's ``extraMetadata.schema``."""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from ..timeline.errors import SchemaError


def _avro_type(field: pa.Field) -> Any:
    kind = field.type
    if pa.types.is_boolean(kind):
        avro: Any = "boolean"
    elif pa.types.is_integer(kind):
        avro = (
            "long"
            if kind.bit_width > 32 or (kind.bit_width == 32 and pa.types.is_unsigned_integer(kind))
            else "int"
        )
    elif pa.types.is_float32(kind) or pa.types.is_float16(kind):
        avro = "float"
    elif pa.types.is_floating(kind):
        avro = "double"
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        avro = "string"
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        avro = "bytes"
    elif pa.types.is_date(kind):
        avro = {"type": "int", "logicalType": "date"}
    elif pa.types.is_timestamp(kind):
        avro = {
            "type": "long",
            "logicalType": "timestamp-millis" if kind.unit in ("s", "ms") else "timestamp-micros",
        }
    elif pa.types.is_decimal(kind):
        avro = {"type": "bytes", "logicalType": "decimal", "precision": kind.precision, "scale": kind.scale}
    else:
        raise SchemaError(f"column {field.name} has type {kind}, which cowrite tables do not store")
    return ["null", avro]


def avro_schema(schema: pa.Schema, table_name: str) -> str:
    """Avro record schema (JSON) for the data columns of ``schema``; every field nullable."""
    name = re.sub(r"\W", "_", table_name) or "table"
    record = {
        "type": "record",
        "name": f"{name}_record",
        "namespace": f"hoodie.{name}",
        "fields": [{"name": f.name, "type": _avro_type(f), "default": None} for f in schema],
    }
    return json.dumps(record)
