"""Avro object container files of a record or two, as the timeline stores its metadata.

fastavro's ``reader`` and ``writer`` parse, or print, the schema of every file they open: most of the
time it takes to read or write a commit file of one record, several of which a writer reads and
writes per commit, some while holding the table lock. Here a schema is parsed once per distinct
text and a file is written after a header printed once per schema; the bytes are what fastavro writes
and reads. Files with a compression codec (not ours; other writers may use one) go through fastavro.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import fastavro
from fastavro.read import HEADER_SCHEMA, MAGIC, SYNC_SIZE

from cowrite.process import keep_mapping, memo

_HEADER = fastavro.parse_schema(HEADER_SCHEMA)


def write_container(schema: Any, records: list[Any]) -> bytes:
    """One container file of ``records`` in one block; ``schema`` as :func:`fastavro.parse_schema` gave it."""
    body = io.BytesIO()
    for record in records:
        fastavro.schemaless_writer(body, schema, record)
    data = body.getvalue()
    sync = os.urandom(SYNC_SIZE)
    out = io.BytesIO()
    out.write(_header_without_sync(schema))
    out.write(sync)
    fastavro.schemaless_writer(out, "long", len(records))
    fastavro.schemaless_writer(out, "long", len(data))
    out.write(data)
    out.write(sync)
    return out.getvalue()


def read_container(data: bytes) -> list[Any]:
    """Every record of a container file; raises ``ValueError`` (or fastavro's errors) for anything else.

    Every block must be whole: its records end where its size says and its sync marker is the header's,
    so a file cut short or spliced does not pass.
    """
    stream = io.BytesIO(data)
    header = _read(stream, _HEADER)
    if header["magic"] != MAGIC:
        raise ValueError("not an Avro object container file")
    meta = header["meta"]
    if meta.get("avro.codec", b"null") != b"null":
        return list(fastavro.reader(io.BytesIO(data)))
    schema = _parsed(meta["avro.schema"])
    records: list[Any] = []
    while stream.tell() < len(data):
        count, size = _read(stream, "long"), _read(stream, "long")
        end = stream.tell() + size
        if count < 0 or size < 0 or end + SYNC_SIZE > len(data):
            raise ValueError("a block is cut short")
        records.extend(_read(stream, schema) for _ in range(count))
        if stream.tell() != end:
            raise ValueError("a block's records do not end where its size says")
        if stream.read(SYNC_SIZE) != header["sync"]:
            raise ValueError("a block's sync marker is not the file's")
    return records


def _read(stream: io.BytesIO, schema: Any) -> Any:
    return fastavro.schemaless_reader(stream, schema, None)


@memo(64, "a pure parse of the few Avro schemas of the timeline")
def _parsed(schema_text: bytes) -> Any:
    return fastavro.parse_schema(json.loads(schema_text))


_headers: dict[int, tuple[Any, bytes]] = {}
keep_mapping(
    f"{__name__}._headers",
    _headers,
    "one per parsed schema",
    "an Avro file header depends only on its schema",
)


def _header_without_sync(schema: Any) -> bytes:
    # fastavro's own header, taken from an empty file it writes (which ends with the sync marker); parsed
    # schemas are dicts, not hashable: kept by identity
    known = _headers.get(id(schema))
    if known is None or known[0] is not schema:
        empty = io.BytesIO()
        fastavro.writer(empty, schema, [])
        known = _headers[id(schema)] = (schema, empty.getvalue()[:-SYNC_SIZE])
    return known[1]
