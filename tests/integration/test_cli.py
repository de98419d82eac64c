"""The ``cowrite`` command as operators use it: real processes, local paths and s3:// paths."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.request_counts import ProxyProcess
from support.servers import S3Server

from cowrite.protocol.locks.lock_files import LOCK_DIR
from cowrite.storage.backend import Storage


def cowrite(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cowrite", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def jsonl(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert result.returncode == 0, result.stderr
    return sorted((json.loads(line) for line in result.stdout.splitlines()), key=lambda r: str(r["id"]))


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    with open(folder / "first.csv", "w", newline="") as stream:
        out = csv.writer(stream)
        out.writerow(["id", "region", "version", "amount"])
        out.writerows([[1, "eu", 1, 10], [2, "eu", 1, 20], [3, "us", 1, 30]])
    (folder / "update.jsonl").write_text(
        '{"id": 1, "region": "eu", "version": 2, "amount": 11}\n'
        '{"id": 4, "region": "us", "version": 1, "amount": 40}\n'
    )
    pq.write_table(pa.table({"id": [2], "region": ["eu"]}), folder / "delete.parquet")
    return folder


def _round_trip(table: str, inputs: Path, env: dict[str, str] | None = None) -> None:
    made = cowrite(
        "init",
        table,
        "--record-key",
        "id",
        "--partition-field",
        "region",
        "--ordering-field",
        "version",
        env=env,
    )
    assert made.returncode == 0, made.stderr
    assert (
        cowrite(
            "write", table, "--input", str(inputs / "first.csv"), "--operation", "insert", env=env
        ).returncode
        == 0
    )
    first = jsonl_lines(cowrite("timeline", table, "--json", env=env))
    assert cowrite("write", table, "--input", str(inputs / "update.jsonl"), env=env).returncode == 0
    assert (
        cowrite(
            "write", table, "--input", str(inputs / "delete.parquet"), "--operation", "delete", env=env
        ).returncode
        == 0
    )
    assert jsonl(cowrite("read", table, env=env)) == [
        {"id": 1, "region": "eu", "version": 2, "amount": 11},
        {"id": 3, "region": "us", "version": 1, "amount": 30},
        {"id": 4, "region": "us", "version": 1, "amount": 40},
    ]
    assert jsonl(cowrite("read", table, "--as-of", str(first[0]["requested_time"]), env=env)) == [
        {"id": 1, "region": "eu", "version": 1, "amount": 10},
        {"id": 2, "region": "eu", "version": 1, "amount": 20},
        {"id": 3, "region": "us", "version": 1, "amount": 30},
    ]
    assert jsonl(cowrite("read", table, "--since", str(first[0]["completion_time"]), env=env)) == [
        {"id": 1, "region": "eu", "version": 2, "amount": 11},
        {"id": 4, "region": "us", "version": 1, "amount": 40},
    ]
    states = [(i["action"], i["state"]) for i in jsonl_lines(cowrite("timeline", table, "--json", env=env))]
    assert states == [("commit", "COMPLETED")] * 3


def jsonl_lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_write_with_a_txn_commits_once_and_a_replay_says_so(tmp_path: Path, inputs: Path) -> None:
    table = str(tmp_path / "orders")
    cowrite("init", table, "--record-key", "id", "--partition-field", "region", "--ordering-field", "version")
    first = str(inputs / "first.csv")
    txn = ["--txn-app-id", "ingest", "--txn-version"]
    done = cowrite("write", table, "--input", first, "--operation", "insert", *txn, "4")
    assert done.returncode == 0 and done.stdout.startswith("committed "), done.stderr
    instant = done.stdout.split()[1]
    files = sorted(p.relative_to(table).as_posix() for p in Path(table).rglob("*") if "locks" not in p.parts)
    rows = jsonl(cowrite("read", table))

    replay = cowrite("write", table, "--input", str(inputs / "update.jsonl"), *txn, "4")
    assert (replay.returncode, replay.stderr) == (0, "")
    assert replay.stdout == (
        f"nothing written: application ingest version 4 was already committed by instant {instant}\n"
    )
    older = cowrite("write", table, "--input", str(inputs / "update.jsonl"), *txn, "3")
    assert (older.returncode, older.stdout) == (
        0,
        f"nothing written: application ingest version 3 is older than its version 4, already committed by "
        f"instant {instant}\n",
    )
    assert sorted(
        p.relative_to(table).as_posix() for p in Path(table).rglob("*") if "locks" not in p.parts
    ) == files
    assert jsonl(cowrite("read", table)) == rows
    newer = cowrite("write", table, "--input", str(inputs / "update.jsonl"), *txn, "5")
    assert newer.returncode == 0 and newer.stdout.startswith("committed "), newer.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--txn-app-id", "ingest", "--txn-version", "x"], "--txn-version must be a non-negative integer"),
        (["--txn-app-id", "ingest", "--txn-version", "-1"], "--txn-version must be a non-negative integer"),
        (["--txn-app-id", "", "--txn-version", "1"], "--txn-app-id must be a non-empty string"),
        (["--txn-app-id", "ingest"], "--txn-version is missing"),
        (["--txn-version", "2"], "--txn-app-id is missing"),
    ],
)
def test_bad_txn_options_are_one_line(tmp_path: Path, inputs: Path, args: list[str], message: str) -> None:
    table = str(tmp_path / "orders")
    cowrite("init", table, "--record-key", "id", "--partition-field", "region", "--ordering-field", "version")
    result = cowrite("write", table, "--input", str(inputs / "first.csv"), *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("cowrite: ")
    assert message in result.stderr
    assert not list(Path(table).rglob("*.parquet")) and not list(Path(table).rglob("*.requested"))


def test_round_trip_on_local_disk(tmp_path: Path, inputs: Path) -> None:
    _round_trip(str(tmp_path / "orders"), inputs)


def test_round_trip_on_s3_with_aws_environment(s3_server: S3Server, inputs: Path) -> None:
    _round_trip(s3_server.new_uri("cli"), inputs, env=s3_server.env())


def test_a_command_without_spark_never_imports_pandas(tmp_path: Path, inputs: Path) -> None:
    """pyarrow imports pandas when it first converts a Python value, which slows every command's start;
    commands that run no Spark refuse it, and still read every input format and write."""
    table = str(tmp_path / "orders")
    assert cowrite("init", table, "--record-key", "id", "--partition-field", "region").returncode == 0
    for name in ("first.csv", "update.jsonl", "delete.parquet"):
        operation = "delete" if name == "delete.parquet" else "upsert"
        args = ["-X", "importtime", "-m", "cowrite", "write", table, "--input", str(inputs / name)]
        timed = subprocess.run(
            [sys.executable, *args, "--operation", operation], capture_output=True, text=True, timeout=120
        )
        assert timed.returncode == 0, timed.stderr
        imported = {line.rsplit("|", 1)[-1].strip() for line in timed.stderr.splitlines() if "|" in line}
        # an import refused is listed as well, alone: pandas loaded would list its modules (pandas.core, ...)
        assert "pyarrow" in imported and not any(m.startswith("pandas.") for m in imported), name
    assert jsonl(cowrite("read", table, "--format", "jsonl")) == [
        {"id": 1, "region": "eu", "version": 2, "amount": 11},
        {"id": 3, "region": "us", "version": 1, "amount": 30},
        {"id": 4, "region": "us", "version": 1, "amount": 40},
    ]


@pytest.mark.parametrize(
    ("args", "spark"),
    [
        (["write", "t", "--input", "x", "--engine", "spark"], True),
        (["write", "t", "--input", "x", "--engine=spark"], True),
        (["cluster", "t", "--engine", "spark"], True),
        (["stream", "t", "--input", "x", "--checkpoint", "c"], True),
        (["bootstrap", "t", "--source", "x"], True),
        (["demo"], True),
        (["write", "t", "--input", "x", "--engine", "local", "-o", "spark.executor.memory=1g"], False),
        (["write", "t", "--input", "spark"], False),
        (["init", "t", "--record-key", "id"], False),
        (["daemon", "t"], False),
    ],
)
def test_only_commands_that_may_start_spark_may_import_pandas(args: list[str], spark: bool) -> None:
    from cowrite.__main__ import _runs_spark

    assert _runs_spark(args) is spark


def test_a_write_on_s3_releases_the_lock_before_the_process_ends(s3_server: S3Server, inputs: Path) -> None:
    """On an object store the lock's release is made in the background, after the commit: the command
    ends only once it is answered, however slow the round trip, or the next writer would wait for the
    lock to expire."""
    table = s3_server.new_uri("cli")
    with ProxyProcess(s3_server.endpoint_url, delay=0.2) as proxy:
        env = {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url}
        made = cowrite("init", table, "--record-key", "id", "--partition-field", "region", env=env)
        assert made.returncode == 0, made.stderr
        wrote = cowrite("write", table, "--input", str(inputs / "first.csv"), env=env)
        assert wrote.returncode == 0, wrote.stderr
    locks = Storage.for_uri(table, **s3_server.storage_options()).names(LOCK_DIR)
    # the turn's note of its commit is its release; the turn stood a moment first (lock1.serves)
    assert len(locks) == 3 and {"lock1.acquired", "lock1.serves"} <= set(locks)
    assert any(name.startswith("lock1.published.") for name in locks)


def test_a_command_that_imported_spark_ends_without_the_interpreters_teardown(tmp_path: Path) -> None:
    """pyarrow's thread pools can abort the interpreter's teardown, so a command that had committed exits
    -6: every command ends once its work is done without that teardown, those that ran Spark too (the
    demo's consumer aborted so). An exit hook of the process shows whether the teardown ran."""
    hooked = (
        "import atexit, sys, pyspark.sql\n"
        "atexit.register(lambda: print('teardown'))\n"
        "sys.argv[0] = 'cowrite'\n"
        "from cowrite.__main__ import main\n"
        "main()\n"
    )
    for args in (["init", str(tmp_path / "t"), "--record-key", "id"], ["read", str(tmp_path / "absent")]):
        done = subprocess.run(
            [sys.executable, "-c", hooked, *args], capture_output=True, text=True, timeout=120
        )
        assert "teardown" not in done.stdout
        assert done.returncode == (0 if args[0] == "init" else 1), done.stderr


def test_output_formats_and_meta_columns(tmp_path: Path, inputs: Path) -> None:
    table = str(tmp_path / "orders")
    cowrite("init", table, "--record-key", "id", "--partition-field", "region", "--hive-style")
    cowrite("write", table, "--input", str(inputs / "first.csv"), "--operation", "insert")
    as_csv = cowrite("read", table, "--format", "csv")
    assert sorted(as_csv.stdout.splitlines()[1:]) == ['1,"eu",1,10', '2,"eu",1,20', '3,"us",1,30']
    out = tmp_path / "out.parquet"
    assert cowrite("read", table, "--format", "parquet", "--output", str(out), "--with-meta").returncode == 0
    rows = pq.read_table(out).sort_by("id").to_pylist()
    assert [(r["_hoodie_record_key"], r["_hoodie_partition_path"]) for r in rows] == [
        ("1", "region=eu"),
        ("2", "region=eu"),
        ("3", "region=us"),
    ]


def test_directory_input_mixes_formats(tmp_path: Path, inputs: Path) -> None:
    table = str(tmp_path / "orders")
    cowrite("init", table, "--record-key", "id", "--partition-field", "region", "--ordering-field", "version")
    (inputs / "delete.parquet").unlink()
    assert cowrite("write", table, "--input", str(inputs), "--operation", "upsert").returncode == 0
    assert [r["id"] for r in jsonl(cowrite("read", table))] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["read", "{missing}"], "is not a cowrite/Hudi table"),
        (["write", "{table}", "--input", "{inputs}/nothing.csv"], "does not exist"),
        (
            ["write", "{table}", "--input", "{inputs}/delete.parquet", "--operation", "upsert"],
            "ordering column",
        ),
        (
            ["write", "{table}", "--input", "{inputs}/first.csv", "-o", "hoodie.write.lock.provider=etcd"],
            "unknown lock provider",
        ),
        (["read", "{table}", "--as-of", "yesterday"], "is not an instant time"),
        (["init", "{table}", "--record-key", "id"], "already exists"),
        (  # a setting only the Spark engine reads is checked all the same
            ["init", "{missing}", "--record-key", "id", "-o", "hoodie.upsert.shuffle.parallelism=abc"],
            "invalid value 'abc' for hoodie.upsert.shuffle.parallelism",
        ),
    ],
)
def test_errors_are_one_line_and_exit_non_zero(
    tmp_path: Path, inputs: Path, args: list[str], message: str
) -> None:
    table = str(tmp_path / "orders")
    cowrite("init", table, "--record-key", "id", "--partition-field", "region", "--ordering-field", "version")
    before = sorted(p.relative_to(table).as_posix() for p in Path(table).rglob("*"))
    result = cowrite(*(a.format(missing=tmp_path / "nope", table=table, inputs=inputs) for a in args))
    assert result.returncode == 1
    assert (
        result.stderr.count("\n") == 1 and result.stderr.startswith("cowrite: ") and message in result.stderr
    )
    assert sorted(p.relative_to(table).as_posix() for p in Path(table).rglob("*")) == before
    assert not (tmp_path / "nope").exists()
