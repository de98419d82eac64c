"""The table's schema is the contract every input is held to, whatever engine writes it.

The table's schema is the one its latest completed data commit recorded (``extraMetadata.schema``); before
the first commit, the one ``cowrite init --schema`` fixed (``hoodie.table.create.schema``); in an empty
table without either, the first write's. An input fits it by Hudi's rules of schema evolution on write:

- a column of the table that the input lacks is written as null — except the record key, partition and
  ordering columns, which every write needs (a delete needs only the key, and the partition columns if
  it names them);
- a column the table lacks is added to it, nullable, after the others;
- a column of the same kind (Avro type) is written as it comes; a narrower input is widened (``int`` to
  ``long``, ``float`` or ``double``; ``long`` to ``float`` or ``double``; ``float`` to ``double``), and a
  wider input widens the table's column the same way, except a key or partition column, whose type
  stays (a ``long`` input of one is cast to its ``int`` when every value fits: its text is the same);
- anything else (a narrowing, another kind) is refused with :class:`SchemaError` naming the column, the
  table's type and the input's — before anything is written.

:func:`fit` decides, on schemas alone, what each written file holds; :func:`conform` applies that to an
Arrow table (the Spark engine applies the same target with Spark casts).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.schema import NULL, arrow_schema, arrow_type, avro_schema, kind, refuse_extension
from cowrite.errors import SchemaError
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.table_schema import latest_schema

# Avro's promotions, as Hudi allows them on write: from a kind to the kinds that hold all its values.
WIDER: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
}


def current_schema(table: Table, timeline: Timeline | None = None) -> pa.Schema | None:
    """The table's schema (see the module's docstring) as Arrow; None for an empty table without one."""
    return schema_of(table, latest_schema(table, timeline or table.timeline()))


def schema_of(table: Table, recorded: str) -> pa.Schema | None:
    """A schema ``table`` recorded (Avro JSON, "" for none) as Arrow; None for none."""
    return arrow_schema(recorded, f"the schema of table {table.name}") if recorded else None


def commit_schema(table: Table, begun: str, written: pa.Schema, delete: bool = False) -> str:
    """The schema a commit records: ``begun``, the table's as the write began (another writer may have
    evolved it after the input was first fitted; "" for none), evolved by the columns ``written``. A
    delete leaves it as it is."""
    if delete:
        return begun
    return fit(written, schema_of(table, begun), table).table_schema


def rebase(table: Table, mine: str, current: str) -> str:
    """The schema a write records whose files hold ``mine`` (the table's schema as it began, evolved by
    its input) once another writer changed the table's schema to ``current``: its changes applied to
    ``current`` (:mod:`cowrite.protocol.table_schema`). Raises :class:`SchemaError` when they cannot be:
    a column both added with kinds neither widens to, or a column of its files that ``current`` would
    read as a narrower kind (a key or partition column, which keeps its type)."""
    written = schema_of(table, mine)
    assert written is not None  # a write that changed the schema has one
    rebased = fit(written, schema_of(table, current), table, source="this write's schema")
    for field in written:
        have, kept = kind(field.name, field.type), kind(field.name, rebased.target.field(field.name).type)
        if kept != have and kept not in WIDER.get(have, ()):
            raise SchemaError(f"column {field.name} would be {kept} in the table, {have} in this write")
    return rebased.table_schema


@dataclass(frozen=True)
class Fit:
    """What the files of one write hold (``target``) and the table's schema after it (Avro JSON, or ""
    for a delete, which leaves the table's schema as it is)."""

    target: pa.Schema
    table_schema: str


def fit(
    incoming: pa.Schema, current: pa.Schema | None, table: Table, delete: bool = False, source: str = "input"
) -> Fit:
    """How ``incoming`` fits a table whose schema is ``current``; :class:`SchemaError` if it cannot."""
    keys = list(table.record_key_fields)
    partitions = list(table.partition_fields)
    fixed = set(keys) | set(partitions)
    required = keys if delete else keys + partitions + list(table.ordering_fields)
    missing = [name for name in dict.fromkeys(required) if name not in incoming.names]
    if missing:
        role = "record key" if missing[0] in keys else "partition" if missing[0] in partitions else "ordering"
        raise SchemaError(
            f"{source} has no {role} column {', '.join(missing)} (columns: {', '.join(incoming.names)})"
        )
    if delete:  # a delete reads its keys (and partition columns) only; the rest is ignored
        incoming = pa.schema([f for f in incoming if f.name in fixed])
    table_fields = {f.name: f for f in current} if current is not None else {}
    target = []
    for name in dict.fromkeys([*table_fields, *incoming.names]):
        given = incoming.field(name) if name in incoming.names else None
        have = table_fields.get(name)
        if given is None:
            if delete:
                continue
            assert have is not None
            target.append(pa.field(name, have.type))  # missing: written as null
            continue
        refuse_extension(given, source)
        given_kind = kind(name, given.type)
        if have is None:  # a new column, or every column of a first write
            if given_kind == NULL:
                raise SchemaError(
                    f"column {name} of {source} holds only nulls: its type cannot be known; "
                    "leave it out, or give it a type"
                )
            target.append(pa.field(name, _written(given_kind, given.type)))
            continue
        have_kind = kind(name, have.type)
        if given_kind == have_kind:
            target.append(pa.field(name, _written(given_kind, given.type)))
        elif given_kind == NULL or have_kind in WIDER.get(given_kind, ()):
            target.append(pa.field(name, arrow_type(have_kind)))
        elif given_kind in WIDER.get(have_kind, ()) and name not in fixed:
            target.append(pa.field(name, arrow_type(given_kind)))  # the table's column widens
        elif (have_kind, given_kind) == ("int", "long"):  # a key or partition keeps its type and its text
            target.append(pa.field(name, have.type))  # (conform refuses a value that does not fit)
        else:
            raise SchemaError(
                f"column {name} of {source} does not fit the table: the table's type is {have_kind}, "
                f"the input's is {given_kind}{_hint(have_kind, given_kind, name in fixed)}"
            )
    schema = pa.schema(target)
    return Fit(schema, "" if delete else avro_schema(schema, table.name))


def _written(kind_: str, given: pa.DataType) -> pa.DataType:
    """The type a column is written in: as it came (an int8 stays int8: both are an Avro int), except
    timestamps, which every file of a table holds in one unit and zone, or readers could not merge them."""
    return arrow_type(kind_) if pa.types.is_timestamp(given) else given


def _hint(have: str, given: str, fixed: bool) -> str:
    if fixed and given in WIDER.get(have, ()):
        return " (a key or partition column keeps its type)"
    if have in WIDER.get(given, ()) or given in WIDER.get(have, ()):
        return ""
    return f" (columns widen only {', '.join(f'{a}→{b}' for a, bs in WIDER.items() for b in sorted(bs))})"


def conform(data: pa.Table, target: pa.Schema, source: str = "input") -> pa.Table:
    """``data`` as ``target`` says: its columns in that order and those types, missing ones null.

    Raises :class:`SchemaError` for a value the target type cannot hold (an overflow, a lost fraction).
    """
    columns = []
    for field in target:
        if field.name not in data.column_names:
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        column = data.column(field.name)
        if column.type != field.type:
            try:
                column = pc.cast(column, field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"column {field.name} of {source}: a value does not fit the table's type {field.type}: "
                    f"{str(exc).splitlines()[0]}"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=target)


def declared_schema(text: str, table_fields: Sequence[str], source: str) -> str:
    """A schema fixed up front (``cowrite init --schema``): ``text`` checked to be an Avro record schema of
    types cowrite stores that has every field the table's configuration names; returned as compact JSON.
    """
    schema = arrow_schema(text, source)
    missing = [name for name in dict.fromkeys(table_fields) if name not in schema.names]
    if missing:
        raise SchemaError(f"{source} has no field {', '.join(missing)}, which the table's keys name")
    return json.dumps(json.loads(text), separators=(",", ":"))
