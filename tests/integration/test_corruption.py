"""A completed commit that cannot be parsed is reported, never skipped: every read of the table fails with
``CorruptTimelineError`` naming the file (snapshot, time travel, incremental, pulls, the CLI), and so does
every write that builds on it; ``cowrite timeline`` marks it. On local disk and S3. (The Spark reader and
the daemon: their own test files.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support import hudi_rs
from support.servers import S3Server

from cowrite import process
from cowrite.errors import CorruptTimelineError
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter


def _rows(ids: list[int], part: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "p": [part] * len(ids), "v": [f"v{i}" for i in ids]})


def _damage(table: Table, instant: Instant, how: str) -> str:
    path = table.instant_path(instant)
    data = table.storage.read(path)
    table.storage.write(path, data[:20] if how == "truncated" else bytes(len(data)))  # zeros: the right size
    # Completed files never change, so a process keeps what it parsed; read on as a new process would.
    process.forget()
    return table.storage.full_path(path)


@dataclass
class Damaged:
    """A table of three commits whose second is damaged; how processes and hudi-rs reach it."""

    table: Table
    path: str  # the damaged file
    options: dict[str, Any]
    env: dict[str, str]


@pytest.fixture(params=[("local", "truncated"), ("local", "garbage"), ("s3", "truncated")], ids=str)
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Damaged:
    backend, how = request.param
    options: dict[str, Any] = {}
    env: dict[str, str] = {}
    uri = str(tmp_path / "t")
    if backend == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        uri, options, env = server.new_uri(), server.storage_options(), server.env()
    table = Table.create(
        uri, name="t", record_key_fields=["id"], partition_fields=["p"], storage_options=options
    )
    writer = LocalWriter(table)
    writer.insert(_rows([1], "a"))
    second = writer.insert(_rows([2], "b"))
    writer.insert(_rows([3], "c"))
    return Damaged(table, _damage(table, second, how), options, env)


def test_every_read_fails_naming_the_file(damaged: Damaged) -> None:
    table, path = damaged.table, damaged.path
    [first, _, third] = table.timeline().data_commits().in_completion_order()
    reads = {
        "snapshot": lambda: read.snapshot(table),
        "time travel before it": lambda: read.snapshot(table, as_of=first.requested_time),
        "incremental after it": lambda: read.incremental(table, since=third.completion_time),
        "pull by completion time": lambda: read.pull(table, None),
        "pull behind the fence": lambda: read.pull(table, None, read.PullMode.FENCE),
        "an upsert of its file group": lambda: LocalWriter(table).upsert(_rows([2], "b")),
        "an insert into its partition": lambda: LocalWriter(table).insert(_rows([5], "b")),
    }
    for name, action in reads.items():
        with pytest.raises(CorruptTimelineError, match="cowrite rollback") as raised:
            action()
        assert raised.value.path == path, name
    # A write elsewhere builds on nothing of it, and reads it not: its cost does not grow with the history
    upsert = LocalWriter(table).upsert(_rows([4], "a"))
    assert upsert in table.timeline().data_commits().completed()
    with pytest.raises(CorruptTimelineError):
        read.snapshot(table)
    # hudi-rs reads the middle commit's rows without a word (it parses the latest commit only); damage the
    # latest as well and it refuses the table, as cowrite does
    [*_, last] = table.timeline().data_commits().in_completion_order()
    _damage(table, last, "truncated")
    with pytest.raises(Exception, match="Commit metadata error"):
        hudi_rs.snapshot(table.uri, damaged.options)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cowrite", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_the_cli_fails_in_one_line_and_the_timeline_marks_it(damaged: Damaged) -> None:
    table, path, s3_env = damaged.table, damaged.path, damaged.env
    for args in (["read", table.uri], ["read", table.uri, "--since", "0"]):
        result = _cli(*args, env=s3_env)
        assert result.returncode == 1 and not result.stdout, result.stderr
        assert result.stderr.startswith("cowrite: corrupt timeline file") and result.stderr.count("\n") == 1
        assert path in result.stderr and "Traceback" not in result.stderr
    shown = _cli("timeline", table.uri, env=s3_env)
    assert shown.returncode == 1 and path in shown.stderr
    marked = [line for line in shown.stdout.splitlines() if line.endswith("CORRUPT")]
    assert len(marked) == 1 and marked[0].split()[0] in path
    as_json = [
        json.loads(line) for line in _cli("timeline", table.uri, "--json", env=s3_env).stdout.splitlines()
    ]
    assert [bool(entry.get("corrupt")) for entry in as_json] == [False, True, False]
