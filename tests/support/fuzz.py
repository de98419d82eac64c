"""Hypothesis strategies for hostile stored input: arbitrary bytes, valid files mutated, and well-formed
files of the wrong shape (valid Avro with another writer schema, valid JSON of other types)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cowrite.format import config as keys
from cowrite.format.table import Table
from support import tables

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SLOW_FUZZ = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TIME = "20260101120000000"
LATER = "20260101120000500"


COMMIT_FIELDS = [
    "partitionToWriteStats",
    "extraMetadata",
    "version",
    "operationType",
    "partitionToReplaceFileIds",
]


# -- strategies ---------------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` with a byte flipped, a piece cut out, or bytes inserted (a torn or bit-rotted file)."""
    raw = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        if kind == "flip" and raw:
            raw[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del raw[at : at + draw(st.integers(1, 16))]
        elif kind == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del raw[at:]
    return bytes(raw)


def avro_value(depth: int = 2) -> st.SearchStrategy[tuple[Any, Any]]:
    """An (Avro schema, value of that schema) pair: a type the reader does not expect, holding data."""
    primitives = st.one_of(
        st.just(("null", None)),
        st.booleans().map(lambda v: ("boolean", v)),
        st.integers(-(2**31), 2**31 - 1).map(lambda v: ("int", v)),
        st.integers(-(2**63), 2**63 - 1).map(lambda v: ("long", v)),
        st.floats(allow_nan=False).map(lambda v: ("double", v)),
        st.text(max_size=20).map(lambda v: ("string", v)),
        st.binary(max_size=20).map(lambda v: ("bytes", v)),
    )
    if depth == 0:
        return primitives
    inner = avro_value(depth - 1)
    arrays = inner.flatmap(
        lambda item: st.lists(st.just(item[1]), max_size=3).map(
            lambda values: ({"type": "array", "items": item[0]}, values)
        )
    )
    maps = inner.flatmap(
        lambda item: st.dictionaries(st.text(max_size=8), st.just(item[1]), max_size=3).map(
            lambda values: ({"type": "map", "values": item[0]}, values)
        )
    )
    return st.one_of(primitives, arrays, maps)


_record_names = iter(range(10**9))


def hostile_avro(fields: list[str]) -> st.SearchStrategy[bytes]:
    """A valid Avro container file of one record with (some of) ``fields``, each of an arbitrary type."""

    def encode(chosen: list[tuple[str, tuple[Any, Any]]]) -> bytes:
        schema = {
            "type": "record",
            "name": f"Hostile{next(_record_names)}",
            "fields": [{"name": name, "type": kind} for name, (kind, _) in chosen],
        }
        buffer = io.BytesIO()
        fastavro.writer(buffer, fastavro.parse_schema(schema), [{n: v for n, (_, v) in chosen}])
        return buffer.getvalue()

    field_values = st.lists(
        st.tuples(st.sampled_from(fields), avro_value()),
        max_size=len(fields),
        unique_by=lambda item: item[0],
    )
    return field_values.map(encode)


def hostile_json() -> st.SearchStrategy[bytes]:
    """Valid JSON of any shape (and a few pathological ones)."""
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
        ),
        max_leaves=12,
    )
    return st.one_of(
        values.map(lambda v: json.dumps(v).encode()),
        st.sampled_from([b"[" * 3_000, b'{"a":' * 2_000, b"1" * 5_000, b"\xff\xfe", b""]),  # nested past
        # the interpreter's recursion limit
    )


def any_bytes() -> st.SearchStrategy[bytes]:
    return st.binary(max_size=512)


# -- the tables the fuzz tests write -------------------------------------------------------------------


FAST = {
    keys.HEARTBEAT_INTERVAL_MS.key: "200",
    keys.HEARTBEAT_TOLERABLE_MISSES.key: "2",
    keys.LEASE_SAFETY_MARGIN_MS.key: "100",
    keys.CLEANER_COMMITS_RETAINED.key: "10",
}  # every version is retained: whatever the daemon deletes of a commit's files is a bug


def new_table(root: Path) -> Table:
    return tables.new_table(root / "table", name="fuzz", properties=FAST)
