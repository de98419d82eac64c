"""The table's schema is the contract every input is held to, through the ``cowrite`` command as a user
runs it, on local disk and on S3: text is parsed with the table's types, allowed changes widen the
table, anything else is refused with one line before anything is written, and deletes say what they
found. Every state is read back with cowrite and with hudi-rs."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import TESTS, hudi_rs, wait_until
from support.servers import S3Server

from cowrite.cli import EXIT_CONFLICT
from cowrite.errors import SchemaError
from cowrite.format.instant import State
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.table_schema import latest_schema
from cowrite.storage.backend import Storage

UTC = dt.UTC
FIRST = pa.table(
    {
        "org": ["acme", "acme", "beta"],
        "id": pa.array([1, 2, 1], pa.int64()),
        "region": ["eu", "eu", "us"],
        "day": ["2024-01-01", "2024-01-02", "2024-01-02"],
        "ts": pa.array([1, 1, 1], pa.int64()),
        "zip": ["00123", "00777", None],
        "amount": pa.array([Decimal("10.50"), Decimal("20.00"), None], pa.decimal128(10, 2)),
        "seen": pa.array([dt.datetime(2024, 1, 1, 10, tzinfo=UTC), None, None], pa.timestamp("us", tz="UTC")),
    }
)


class Cli:
    """The ``cowrite`` command in a process of its own, on one table, and both readers of it."""

    def __init__(self, uri: str, env: dict[str, str], options: dict[str, Any], inputs: Path) -> None:
        self.uri, self.env, self.options, self.inputs = uri, env, options, inputs

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cowrite", *args],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            timeout=120,
        )

    def write(self, operation: str, name: str, content: str | pa.Table) -> subprocess.CompletedProcess[str]:
        path = self.inputs / name
        if isinstance(content, pa.Table):
            pq.write_table(content, path)
        else:
            path.write_text(content)
        return self("write", self.uri, "--input", str(path), "--operation", operation)

    def rows(self) -> list[dict[str, Any]]:
        """The snapshot as ``cowrite read`` prints it, checked to equal what hudi-rs reads."""
        result = self("read", self.uri)
        assert result.returncode == 0, result.stderr
        mine = sorted((json.loads(line) for line in result.stdout.splitlines()), key=_order)
        theirs = hudi_rs.snapshot(self.uri, self.options)
        assert [_printed(row) for row in sorted(theirs, key=_order)] == mine
        return mine

    def timeline(self) -> list[str]:
        storage = Storage.for_uri(self.uri, **self.options)
        return sorted(i.path for i in storage.walk_files() if "/.heartbeat/" not in f"/{i.path}")


def _order(row: dict[str, Any]) -> tuple[str, int]:
    return row.get("org", ""), row["id"]


def _printed(row: dict[str, Any]) -> dict[str, Any]:
    """A hudi-rs row as ``cowrite read`` prints rows (JSON, with ``str`` for what JSON has not)."""
    return json.loads(json.dumps(row, default=str))


@pytest.fixture(params=["local", "s3"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    if request.param == "local":
        return Cli(str(tmp_path / "orders"), {}, {}, inputs)
    server: S3Server = request.getfixturevalue("s3_server")
    return Cli(
        f"{server.new_uri()}/orders", server.env(), server.storage_options(), inputs
    )


def _with_period(table: pa.Table) -> pa.Table:
    """``table`` with a column ``week`` of pandas periods: an Arrow extension type, which the ``cowrite``
    command (no pandas in it) reads as its storage type, whole numbers, unless it refuses it."""
    weeks = pa.Table.from_pandas(pd.DataFrame({"week": pd.period_range("2024-01-01", periods=len(table))}))
    return table.append_column(weeks.schema.field("week"), weeks.column("week"))


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("cowrite: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and not result.stdout
    assert all(word in result.stderr for word in words), result.stderr


def test_the_issue_scenario_keeps_every_type_and_refuses_what_does_not_fit(cli: Cli) -> None:
    made = cli(
        "init", cli.uri, "--record-key", "org,id", "--partition-field", "region,day", "--ordering-field", "ts"
    )
    assert made.returncode == 0, made.stderr
    assert cli.write("insert", "first.parquet", FIRST).returncode == 0

    # JSON Lines: a date-like partition value and a zip code with leading zeros stay strings
    upsert = cli.write(
        "upsert",
        "upsert.jsonl",
        '{"org": "acme", "id": 1, "region": "eu", "day": "2024-01-01", "ts": 2, "zip": "00999", '
        '"amount": "11.25", "seen": "2024-02-01 00:00:00"}\n',
    )
    assert upsert.returncode == 0, upsert.stderr
    # CSV: the same, and columns the input leaves out are null
    csv = cli.write("upsert", "upsert.csv", "org,id,region,day,ts,zip\nacme,2,eu,2024-01-02,5,00777\n")
    assert csv.returncode == 0, csv.stderr
    assert cli.rows() == [
        {"org": "acme", "id": 1, "region": "eu", "day": "2024-01-01", "ts": 2, "zip": "00999",
         "amount": "11.25", "seen": "2024-02-01 00:00:00+00:00"},
        {"org": "acme", "id": 2, "region": "eu", "day": "2024-01-02", "ts": 5, "zip": "00777",
         "amount": None, "seen": None},
        {"org": "beta", "id": 1, "region": "us", "day": "2024-01-02", "ts": 1, "zip": None,
         "amount": None, "seen": None},
    ]  # fmt: skip

    # refused, one line each, before anything is written: the table stays as it was for both readers
    before_rows, before_files = cli.rows(), cli.timeline()
    for operation, name, content, words in [
        ("upsert", "bad-int.csv", "org,id,region,day,ts\nacme,4,eu,2024-01-03,abc\n",
         ("column ts", "'abc'", "long")),
        ("upsert", "bad-list.jsonl", '{"org": "acme", "id": 4, "region": "eu", "day": "2024-01-03", "ts": 1, '
         '"zip": ["0", "1"]}\n', ("column zip", "string")),
        ("upsert", "bad-key.jsonl",
         '{"org": "acme", "id": "x1", "region": "eu", "day": "2024-01-03", "ts": 1}\n',
         ("column id", '"x1"', "long")),
        ("delete", "bad-key.csv", "org,id\nacme,one\n", ("column id", "'one'", "long")),
        ("upsert", "bad-partition.parquet", FIRST.set_column(3, "day", pa.array([dt.date(2024, 1, 3)] * 3)),
         ("column day", "the table's type is string", "the input's is date")),
        ("upsert", "narrowing.parquet", FIRST.set_column(6, "amount", pa.array([1.5, 2.5, None])),
         ("column amount", "decimal(10,2)", "double")),
        ("insert", "no-key.csv", "org,region,day,ts\nacme,eu,2024-01-03,1\n", ("no record key column id",)),
        ("upsert", "period.parquet", _with_period(FIRST),
         ("column week of ", "period.parquet", "Arrow extension type pandas.period", "convert it")),
    ]:  # fmt: skip
        _refused(cli.write(operation, name, content), *words)
        assert cli.timeline() == before_files, name
    # the Spark engine reads parquet with Spark, which would read the periods as numbers: refused too,
    # from the files' footers, before Spark starts (no Spark banner: the error is all stderr holds)
    spark = cli("write", cli.uri, "--input", str(cli.inputs / "period.parquet"), "--engine", "spark")
    _refused(spark, "column week of ", "Arrow extension type pandas.period")
    assert cli.timeline() == before_files
    assert cli.rows() == before_rows

    # a delete matches partition values with the table's types, and says what it found
    deleted = cli.write(
        "delete",
        "delete.jsonl",
        '{"org": "beta", "id": 1, "region": "us", "day": "2024-01-02"}\n'
        '{"org": "zzz", "id": 9, "region": "us", "day": "2024-01-02"}\n',
    )
    assert deleted.returncode == 0, deleted.stderr
    assert "(delete: of 2 keys given, 1 found and deleted, 1 not found)" in deleted.stdout
    # insert_overwrite replaces the partitions it names; a new column widens the table, nullable
    overwrite = cli.write(
        "insert_overwrite", "overwrite.csv", "org,id,region,day,ts,note\nacme,3,eu,2024-01-02,1,2024-05-06\n"
    )
    assert overwrite.returncode == 0, overwrite.stderr
    nothing = {"zip": None, "amount": None, "seen": None}
    assert cli.rows() == [
        {"org": "acme", "id": 1, "region": "eu", "day": "2024-01-01", "ts": 2, "zip": "00999",
         "amount": "11.25", "seen": "2024-02-01 00:00:00+00:00", "note": None},
        {"org": "acme", "id": 3, "region": "eu", "day": "2024-01-02", "ts": 1, **nothing,
         "note": "2024-05-06"},
    ]  # fmt: skip


def test_a_schema_fixed_up_front_types_the_first_text_input(cli: Cli) -> None:
    schema = cli.inputs / "orders.avsc"
    schema.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "orders",
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "day", "type": ["null", "string"]},
                    {"name": "zip", "type": ["null", "string"]},
                    {"name": "qty", "type": ["null", "int"]},
                ],
            }
        )
    )
    made = cli("init", cli.uri, "--record-key", "id", "--partition-field", "day", "--schema", str(schema))
    assert made.returncode == 0, made.stderr
    # without the schema, 00777 would be a number: the schema says it is a string
    first = cli.write("insert", "first.csv", "id,day,zip,qty\n1,2024-01-02,00777,3\n2,2024-01-03,,\n")
    assert first.returncode == 0, first.stderr
    assert cli.rows() == [
        {"id": 1, "day": "2024-01-02", "zip": "00777", "qty": 3},
        {"id": 2, "day": "2024-01-03", "zip": None, "qty": None},
    ]
    # int widens to long (a new file carries the wider type; both readers read the old ones as long)
    wider = pa.table(
        {"id": pa.array([3], pa.int64()), "day": ["2024-01-02"], "qty": pa.array([2**40], pa.int64())}
    )
    assert cli.write("insert", "wider.parquet", wider).returncode == 0
    assert [row["qty"] for row in cli.rows()] == [3, None, 2**40]


def test_init_refuses_a_schema_that_cannot_be_the_tables(tmp_path: Path) -> None:
    cli = Cli(str(tmp_path / "orders"), {}, {}, tmp_path)
    schema = tmp_path / "bad.avsc"
    for text, words in [
        ('{"type": "record", "name": "t", "fields": [{"name": "x", "type": "long"}]}', ("no field id",)),
        ("not json", ("not an Avro record schema",)),
        ('{"type": "record", "name": "t", "fields": '
         '[{"name": "id", "type": {"type": "array", "items": "int"}}]}', ("array",)),
    ]:  # fmt: skip
        schema.write_text(text)
        _refused(cli("init", cli.uri, "--record-key", "id", "--schema", str(schema)), *words)
        assert not Path(cli.uri).exists()


def test_the_local_writer_applies_the_rules_to_arrow_tables(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key_fields=["id"], ordering_fields=["ts"])
    writer = LocalWriter(table)
    writer.insert(
        pa.table(
            {
                "id": pa.array([1], pa.int32()),
                "ts": pa.array([1], pa.int32()),
                "f": pa.array([0.5], pa.float32()),
            }
        )
    )
    # narrower into wider is cast; a new column is added; a missing one is null
    writer.upsert(pa.table({"id": pa.array([2], pa.int8()), "ts": pa.array([1], pa.int16()), "g": ["new"]}))
    assert sorted(read.snapshot(table).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "ts": 1, "f": 0.5, "g": None},
        {"id": 2, "ts": 1, "f": None, "g": "new"},
    ]
    # a key column keeps its type: a long fits an int key while its values do
    with pytest.raises(SchemaError, match=r"column id of input: a value does not fit the table's type int32"):
        writer.upsert(pa.table({"id": pa.array([2**40], pa.int64()), "ts": pa.array([1], pa.int32())}))
    with pytest.raises(SchemaError, match=r"column id .* the table's type is int, the input's is double"):
        writer.upsert(pa.table({"id": pa.array([3.0], pa.float64()), "ts": pa.array([1], pa.int32())}))
    with pytest.raises(SchemaError, match=r"column f .* the table's type is float, the input's is string"):
        writer.upsert(
            pa.table({"id": pa.array([3], pa.int32()), "ts": pa.array([1], pa.int32()), "f": ["x"]})
        )
    # an Arrow extension type is refused whether this process knows it (pandas registered its periods)
    # or only its name in the field's metadata says it (a type nobody registered reads as its storage)
    known = _with_period(pa.table({"id": pa.array([3], pa.int32()), "ts": pa.array([1], pa.int32())}))
    unknown = known.cast(
        pa.schema([*known.schema][:2]).append(
            pa.field("week", pa.int64(), metadata={"ARROW:extension:name": "example.weeks"})
        )
    )
    for given, extension in [(known, "pandas.period"), (unknown, "example.weeks")]:
        refused = rf"column week of input has the Arrow extension type {extension},"
        with pytest.raises(SchemaError, match=refused):
            writer.upsert(given)
    assert len(list(table.timeline())) == 2


def test_a_writer_holds_its_input_to_a_type_another_process_widened_since_it_last_looked(
    tmp_path: Path,
) -> None:
    """A writer holds its input first to the schema of the timeline its process listed last (no listing
    before its claim). Another process widened a column since: the write holds the input again to the
    schema it begins on, so the new file group it writes holds the wider type, as the table's schema
    says, and not the narrower one its input came with."""
    table = Table.create(
        str(tmp_path / "t"), name="t", record_key_fields=["id"], partition_fields=["part"],
        ordering_fields=["ts"],
    )  # fmt: skip
    writer = LocalWriter(table)
    writer.insert(pa.table({"id": [1], "part": ["a"], "ts": [1], "n": pa.array([1], pa.int32())}))
    wider = tmp_path / "wider.parquet"
    pq.write_table(pa.table({"id": [2], "part": ["a"], "ts": [1], "n": pa.array([2**40], pa.int64())}), wider)
    subprocess.run(
        [sys.executable, "-m", "support.writer_process", table.uri, "--operation", "insert",
         "--batch-file", str(wider)],
        cwd=TESTS, check=True, capture_output=True,
    )  # fmt: skip
    mine = writer.upsert(pa.table({"id": [3], "part": ["b"], "ts": [1], "n": pa.array([3], pa.int32())}))
    assert mine is not None
    suffix = f"_{mine.requested_time}.parquet"
    [written] = [f.path for f in table.storage.walk_files() if f.name.endswith(suffix)]
    assert written.startswith("b/")
    assert pq.read_schema(table.storage.full_path(written)).field("n").type == pa.int64()
    expected = [{"id": 1, "part": "a", "ts": 1, "n": 1}, {"id": 2, "part": "a", "ts": 1, "n": 2**40},
                {"id": 3, "part": "b", "ts": 1, "n": 3}]  # fmt: skip
    assert sorted(read.snapshot(table).to_pylist(), key=lambda r: r["id"]) == expected
    assert sorted(hudi_rs.snapshot(table.uri), key=lambda r: r["id"]) == expected


def test_an_input_that_no_longer_fits_the_schema_it_begins_on_is_refused_with_nothing_written(
    tmp_path: Path,
) -> None:
    """The input fits the schema this process saw last (a new string column), but another process added
    that column as a long since: the write is refused with the column named, writes no base file, and
    leaves its claim to the lazy rollback; both readers read the table as the other process left it."""
    table = Table.create(str(tmp_path / "t"), name="t", record_key_fields=["id"], ordering_fields=["ts"])
    writer = LocalWriter(table)
    writer.insert(pa.table({"id": [1], "ts": [1]}))
    added = tmp_path / "added.parquet"
    pq.write_table(pa.table({"id": [2], "ts": [1], "s": pa.array([7], pa.int64())}), added)
    subprocess.run(
        [sys.executable, "-m", "support.writer_process", table.uri, "--operation", "insert",
         "--batch-file", str(added)],
        cwd=TESTS, check=True, capture_output=True,
    )  # fmt: skip
    files = {f.path for f in table.storage.walk_files() if f.name.endswith(".parquet")}
    with pytest.raises(SchemaError, match=r"column s .* the table's type is long, the input's is string"):
        writer.upsert(pa.table({"id": [3], "ts": [1], "s": ["text"]}))
    assert {f.path for f in table.storage.walk_files() if f.name.endswith(".parquet")} == files
    [pending] = table.timeline().pending()
    assert pending.state is State.REQUESTED
    expected = [{"id": 1, "ts": 1, "s": None}, {"id": 2, "ts": 1, "s": 7}]
    assert sorted(read.snapshot(table).to_pylist(), key=lambda r: r["id"]) == expected
    assert sorted(hudi_rs.snapshot(table.uri), key=lambda r: r["id"]) == expected


def _paused(cli: Cli, tmp_path: Path, name: str, rows: pa.Table) -> tuple[subprocess.Popen[str], Path]:
    """A writer process that upserts ``rows`` and pauses once it has begun and planned, before it writes its
    files and commits (holding no lock, on either storage); the pause ends when the returned file exists."""
    batch, ready, go = tmp_path / f"{name}.parquet", tmp_path / f"{name}.ready", tmp_path / f"{name}.go"
    pq.write_table(rows, batch)
    process = subprocess.Popen(
        [sys.executable, "-m", "support.writer_process", cli.uri, "--batch-file", str(batch),
         "--storage-options", json.dumps(cli.options), "--pause-at", "planned", "--ready-file", str(ready),
         "--go-file", str(go), "--result", str(tmp_path / f"{name}.json")],
        cwd=TESTS, env={**os.environ, **cli.env}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_until(lambda: ready.exists() or process.poll() is not None, f"{name} to pause")
    assert process.poll() is None, process.communicate()[1]
    return process, go


def _resumed(process: subprocess.Popen[str], go: Path) -> tuple[int, str]:
    """End the pause; the writer's exit code and what it printed to stderr."""
    go.touch()
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


def _table_schema(cli: Cli) -> list[tuple[str, str]]:
    """The table's schema as its newest commit recorded it: (column, Avro type) pairs."""
    table = Table.load(cli.uri, **cli.options)
    return [(f["name"], f["type"][1]) for f in json.loads(latest_schema(table, table.timeline()))["fields"]]


def test_a_commit_keeps_a_column_another_process_added_while_it_wrote(cli: Cli, tmp_path: Path) -> None:
    """Writer A upserts the table's columns and pauses before its commit; meanwhile the CLI inserts into
    another partition with a new column, and commits. A's commit records the table's schema with that
    column (it does not take the change back), so a later input that gives the column another type is
    refused with one line rather than added again as a second column of another type, which no reader
    could merge with the files that hold the first."""
    made = cli("init", cli.uri, "--record-key", "id", "--partition-field", "part", "--ordering-field", "ts")
    assert made.returncode == 0, made.stderr
    assert cli.write("insert", "first.csv", "id,part,ts\n1,a,1\n").returncode == 0
    a, go = _paused(cli, tmp_path, "a", pa.table({"id": [2], "part": ["a"], "ts": [2]}))
    added = cli.write("insert", "added.jsonl", '{"id": 3, "part": "b", "ts": 1, "s": "x"}\n')
    assert added.returncode == 0, added.stderr
    code, stderr = _resumed(a, go)
    assert code == 0, stderr
    assert _table_schema(cli) == [("id", "long"), ("part", "string"), ("ts", "long"), ("s", "string")]
    expected = [{"id": 1, "part": "a", "ts": 1, "s": None}, {"id": 2, "part": "a", "ts": 2, "s": None},
                {"id": 3, "part": "b", "ts": 1, "s": "x"}]  # fmt: skip
    assert cli.rows() == expected
    files = cli.timeline()
    long_s = pa.table({"id": [4], "part": ["c"], "ts": [1], "s": pa.array([5], pa.int64())})
    _refused(cli.write("insert", "long-s.parquet", long_s), "column s", "the table's type is string")
    assert cli.timeline() == files
    assert cli.rows() == expected


def test_writers_that_both_changed_the_schema_keep_both_changes_or_the_later_one_loses(
    cli: Cli, tmp_path: Path
) -> None:
    """Two writers add different columns at once: the later commit records both, and so does the newest
    instant, which readers that go by instant times take the schema from. Two writers add the same
    column with kinds neither widens to: the later one loses with a conflict that names the column and
    commits nothing; the table is as the first left it, for both readers."""
    made = cli("init", cli.uri, "--record-key", "id", "--partition-field", "part", "--ordering-field", "ts")
    assert made.returncode == 0, made.stderr
    assert cli.write("insert", "first.csv", "id,part,ts\n1,a,1\n").returncode == 0
    a, go = _paused(cli, tmp_path, "a", pa.table({"id": [2], "part": ["a"], "ts": [2], "t": [7]}))
    assert cli.write("insert", "s.jsonl", '{"id": 3, "part": "b", "ts": 1, "s": "x"}\n').returncode == 0
    code, stderr = _resumed(a, go)
    assert code == 0, stderr
    assert _table_schema(cli) == [
        ("id", "long"), ("part", "string"), ("ts", "long"), ("s", "string"), ("t", "long")
    ]  # fmt: skip
    # the CLI's commit has the later instant time: readers that take the schema from it (hudi-rs) would
    # not see t, so A's commit is followed by an empty one that records the schema
    table = Table.load(cli.uri, **cli.options)
    *_, a_commit, cli_commit, alter = table.timeline().data_commits()  # in the order of instant times
    assert [table.commit_metadata(i).operation for i in (a_commit, cli_commit, alter)] == [
        "upsert", "insert", "alter_schema"
    ]
    assert table.commit_metadata(alter).write_stats == ()
    assert table.commit_metadata(alter).schema == latest_schema(table, table.timeline())
    expected = [{"id": 1, "part": "a", "ts": 1, "s": None, "t": None},
                {"id": 2, "part": "a", "ts": 2, "s": None, "t": 7},
                {"id": 3, "part": "b", "ts": 1, "s": "x", "t": None}]  # fmt: skip
    assert cli.rows() == expected

    c, go = _paused(cli, tmp_path, "c", pa.table({"id": [4], "part": ["a"], "ts": [1], "u": [5]}))
    assert cli.write("insert", "u.jsonl", '{"id": 5, "part": "b", "ts": 1, "u": "y"}\n').returncode == 0
    code, stderr = _resumed(c, go)
    assert code == EXIT_CONFLICT, stderr
    error = json.loads((tmp_path / "c.json").read_text())["error"]
    assert error["type"] == "WriteConflictError"
    assert "the table's schema: column u" in error["message"] and "string" in error["message"]
    assert _table_schema(cli)[-1] == ("u", "string")
    expected = [{**row, "u": None} for row in expected] + [
        {"id": 5, "part": "b", "ts": 1, "s": None, "t": None, "u": "y"}
    ]
    assert cli.rows() == expected
