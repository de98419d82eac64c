"""The ``cowrite`` command driven with generated inputs, property-based: whatever a user feeds it, every
step ends with a documented exit code and never a traceback, and the table holds exactly what an
independent model says, read back by cowrite and by hudi-rs.

The model is a dict of rows keyed by (org, id, region): the record key ``org,id`` is unique per
partition. Each generated step is one ``cowrite write`` (insert, upsert or delete) of a parquet, CSV or
JSON Lines file; the model decides from the table's schema whether the step must commit (exit 0) or be
refused (exit 1, one line, nothing written). Inputs mix well-typed values with the mistakes users make:
values of the wrong type, lists where strings are, missing and unknown columns, null keys, keys with
separators, strings that look like dates or numbers, empty files, latin-1 bytes and byte-order marks.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import hudi_rs

from cowrite.cli import cli

KEY = ("org", "id")
COLUMNS = ("org", "id", "region", "ts", "zip", "qty")
OPTIONAL = ("zip", "qty")  # the columns an input may leave out: they read as null
SCHEMA = pa.schema(
    [
        ("org", pa.string()),
        ("id", pa.int64()),
        ("region", pa.string()),
        ("ts", pa.int64()),
        ("zip", pa.string()),
        ("qty", pa.int64()),
    ]
)
WRONG = object()  # a value of the wrong type for its column, written per format below
DOCUMENTED_EXITS = {0, 1, 2, 3, 4, 5, 6}
PROPERTIES = settings(
    max_examples=int(os.environ.get("COWRITE_CLI_EXAMPLES", "150")),
    deadline=None,
    derandomize=os.environ.get("COWRITE_CLI_EXAMPLES") is None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- generated inputs --------------------------------------------------------------------------------

ORGS = st.text(alphabet="ab,:/ é_", min_size=1, max_size=4).filter(lambda s: s.strip() == s)
REGIONS = st.sampled_from(["eu", "2024-01-02", "007"])  # a plain value, one like a date, one like a number
ZIPS = st.none() | st.sampled_from(["00999", "00777", "2024-01-03", "12.50", "NA", "null", 'say "hi"', "a,b"])


@dataclass(frozen=True)
class Step:
    operation: str  # insert | upsert | delete
    kind: str  # parquet | csv | jsonl
    rows: tuple[dict[str, Any], ...]
    encoding: str = "utf-8"  # of a text file: utf-8, utf-8-sig (a byte-order mark) or latin-1
    unknown: bool = False  # rows carry a column the table does not have yet


@st.composite
def steps(draw: st.DrawFn, step_number: int) -> Step:
    operation = draw(st.sampled_from(["insert", "upsert", "delete"]))
    kind = draw(st.sampled_from(["parquet", "csv", "jsonl"]))
    keys = draw(st.lists(st.tuples(ORGS, st.integers(1, 4), REGIONS), max_size=3, unique_by=lambda k: k[:2]))
    rows = []
    for org, id_, region in keys:
        row: dict[str, Any] = {"org": org, "id": id_, "region": region, "ts": step_number}
        if operation != "delete":
            row["zip"] = draw(ZIPS)
            row["qty"] = draw(st.none() | st.integers(-5, 5))
        rows.append(row)
    if rows and draw(st.integers(0, 3)) == 0:  # one mistake in one row
        mistake = draw(
            st.sampled_from(["null key", "wrong id", "wrong ts", "wrong qty", "list zip", "no region"])
        )
        row = rows[draw(st.integers(0, len(rows) - 1))]
        if mistake == "null key":
            row["org"] = None
        elif mistake == "no region":
            for other in rows:
                other.pop("region")
        elif operation != "delete" or mistake in ("wrong id",):
            column = {"wrong id": "id", "wrong ts": "ts", "wrong qty": "qty", "list zip": "zip"}[mistake]
            row[column] = WRONG if mistake != "list zip" else ["0", "1"]
            if kind == "csv" and mistake == "list zip":
                row[column] = '["0", "1"]'  # CSV has no lists: the same text is a fine string
    if operation != "delete" and rows and draw(st.booleans()):  # a column left out: null
        missing = draw(st.sampled_from(OPTIONAL))
        for row in rows:
            row.pop(missing, None)
    unknown = operation != "delete" and bool(rows) and draw(st.integers(0, 4)) == 0
    if unknown:
        for row in rows:
            row["note"] = draw(st.sampled_from(["n1", "2024-05-06"]))
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "latin-1"]))
    return Step(operation, kind, tuple(rows), encoding, unknown)


# -- the model ---------------------------------------------------------------------------------------


@dataclass
class Model:
    """What the table must hold: rows by (org, id, region), and the columns its schema has."""

    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    columns: list[str] = field(default_factory=lambda: list(COLUMNS))

    def refuses(self, step: Step, raw: bytes) -> bool:
        """Whether the table's schema refuses this input (exit 1, nothing written)."""
        if step.kind != "parquet" and step.encoding == "latin-1" and raw != _encode(step, "utf-8"):
            return True  # not UTF-8
        for row in step.rows:
            if row.get("org") is None or ("region" not in row and step.operation != "delete"):
                return True
            if any(isinstance(value, list) or value is WRONG for value in row.values()):
                return True
        return False

    def apply(self, step: Step) -> None:
        if step.unknown and "note" not in self.columns:
            self.columns.append("note")
        for row in step.rows:
            if step.operation == "delete":  # without a partition column, the key in every partition
                for key in [k for k in self.rows if k[:2] == (row["org"], row["id"])]:
                    if key[2] == row.get("region", key[2]):
                        del self.rows[key]
                continue
            self.rows[(row["org"], row["id"], row["region"])] = {c: row.get(c) for c in self.columns}

    def expected(self) -> list[dict[str, Any]]:
        return sorted(({c: row.get(c) for c in self.columns} for row in self.rows.values()), key=repr)


# -- files and the command ---------------------------------------------------------------------------


def _text_value(value: Any) -> Any:
    return "abc" if value is WRONG else value


def _encode(step: Step, encoding: str) -> bytes:
    names = list(dict.fromkeys(name for row in step.rows for name in row))
    if step.kind == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        for row in step.rows:
            cells = [_text_value(row.get(name)) for name in names]
            writer.writerow(["" if c is None else json.dumps(c) if isinstance(c, list) else c for c in cells])
        text = out.getvalue() if step.rows else ""
    else:
        text = "".join(
            json.dumps({name: _text_value(value) for name, value in row.items()}) + "\n" for row in step.rows
        )
    return text.encode(encoding, errors="replace")


def _input_file(step: Step, directory: Path, number: int) -> tuple[Path, bytes]:
    path = directory / f"step{number}.{step.kind}"
    if step.kind == "parquet":
        # Written as a user's tool would: each column typed by its values (a mistake makes it a string)
        names = list(dict.fromkeys(name for row in step.rows for name in row))
        columns = {}
        for name in names:
            values = [_text_value(row.get(name)) for row in step.rows]
            if any(row.get(name) is WRONG for row in step.rows):
                values = [None if v is None else str(v) for v in values]
            if any(isinstance(v, list) for v in values):  # a column of lists: a list where a string is
                values = [v if v is None or isinstance(v, list) else [v] for v in values]
            columns[name] = pa.array(values)
        pq.write_table(pa.table(columns) if columns else SCHEMA.empty_table(), path)
        return path, path.read_bytes()
    raw = _encode(step, step.encoding)
    path.write_bytes(raw)
    return path, raw


def _run(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args))
    # An exception escaping the command is what a user would see as a traceback.
    escaped = result.exception if not isinstance(result.exception, SystemExit) else None
    assert escaped is None, f"cowrite {' '.join(args)} raised {escaped!r}"
    assert "Traceback" not in result.stderr + result.stdout
    assert result.exit_code in DOCUMENTED_EXITS
    return result


def _cowrite_rows(table: str, columns: list[str]) -> list[dict[str, Any]]:
    result = _run("read", table)
    assert result.exit_code == 0, result.stderr
    rows = (json.loads(line) for line in result.stdout.splitlines())
    return sorted(({c: row.get(c) for c in columns} for row in rows), key=repr)


def _hudi_rs_rows(table: str, columns: list[str]) -> list[dict[str, Any]]:
    return sorted(({c: row.get(c) for c in columns} for row in hudi_rs.snapshot(table)), key=repr)


def _init(table: str) -> None:
    made = _run(
        "init", table, "--record-key", "org,id", "--partition-field", "region", "--ordering-field", "ts"
    )
    assert made.exit_code == 0, made.stderr


@PROPERTIES
@given(data=st.data())
def test_every_generated_step_ends_documented_and_the_table_matches_the_model(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("cli")
    table = str(directory / "table")
    _init(table)
    model = Model()
    seed = pa.table(
        {"org": ["a"], "id": [1], "region": ["eu"], "ts": [0], "zip": ["00100"], "qty": [1]}, schema=SCHEMA
    )
    pq.write_table(seed, directory / "seed.parquet")  # the first write fixes the table's schema
    assert (
        _run("write", table, "--input", str(directory / "seed.parquet"), "--operation", "insert").exit_code
        == 0
    )
    model.apply(Step("insert", "parquet", tuple(seed.to_pylist())))

    for number in range(1, data.draw(st.integers(1, 4)) + 1):
        step = data.draw(steps(number), label=f"step {number}")
        if step.operation == "insert":  # insert keeps Hudi's semantics: only keys the table does not hold
            step = Step(
                step.operation,
                step.kind,
                tuple(r for r in step.rows if (r.get("org"), r.get("id"), r.get("region")) not in model.rows),
                step.encoding,
                step.unknown,
            )
        path, raw = _input_file(step, directory, number)
        before = sorted(
            p.relative_to(table).as_posix() for p in Path(table).rglob("*") if ".heartbeat" not in p.parts
        )
        result = _run("write", table, "--input", str(path), "--operation", step.operation)
        if not step.rows:  # an empty input commits nothing or is refused; either way the table is as it was
            assert result.exit_code in (0, 1), result.stderr
        elif model.refuses(step, raw):
            assert result.exit_code == 1, f"{step} was not refused: {result.stdout}"
            assert result.stderr.startswith("cowrite: ") and result.stderr.count("\n") == 1, result.stderr
            after = sorted(
                p.relative_to(table).as_posix() for p in Path(table).rglob("*") if ".heartbeat" not in p.parts
            )
            assert [p for p in after if p.endswith(".parquet") or "/timeline/" in p] == [
                p for p in before if p.endswith(".parquet") or "/timeline/" in p
            ]
        else:
            assert result.exit_code == 0, f"{step} was refused: {result.stderr}"
            model.apply(step)
        expected = model.expected()
        assert _cowrite_rows(table, model.columns) == expected
        assert _hudi_rs_rows(table, model.columns) == expected
