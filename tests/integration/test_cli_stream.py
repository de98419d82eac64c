"""``cowrite stream``: the files arriving in a directory written into a table, one commit per micro-batch,
exactly once across restarts — real ``cowrite`` processes with their own Spark, on local disk.

Each test reads the table back with cowrite's reader and with hudi-rs and compares exact rows; a refused
input or a lost conflict must leave one error line, the CLI's exit code, and the table as it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import hudi_rs
from support.spark import forget_commit
from support.tables import new_table, rows

from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.txn import TXN_VERSION_KEY

pytestmark = pytest.mark.slow

COWRITE = [sys.executable, "-m", "cowrite"]
SPARK = ["--master", "local[1]", "-o", "spark.ui.enabled=false"]
WAIT = 180.0  # a run starts a JVM: under load that alone may take tens of seconds
Row = tuple[str, str, int, str]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Streams a test starts; each still running is killed with its JVM (its whole process group)."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def stream(table: Path, source: Path, checkpoint: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [*COWRITE, "stream", str(table), "--input", str(source), "--checkpoint", str(checkpoint)]
    return subprocess.run([*command, *SPARK, *options], capture_output=True, text=True, timeout=WAIT)


def put(source: Path, name: str, records: list[dict[str, object]]) -> None:
    """A JSON Lines file arriving in ``source``: written under a hidden name, then renamed into place."""
    hidden = source / f".{name}"
    hidden.write_text("".join(json.dumps(r) + "\n" for r in records))
    hidden.rename(source / name)


def record(id_: str, part: str, ts: int, value: str) -> dict[str, object]:
    return {"id": id_, "part": part, "ts": ts, "value": value}


def table_rows(path: Path) -> list[Row]:
    """The snapshot as cowrite reads it, checked against hudi-rs's."""
    mine = hudi_rs.rows(read.snapshot(Table.load(str(path))))
    assert hudi_rs.snapshot(str(path)) == mine, "hudi-rs reads other rows than cowrite"
    return [(r["id"], r["part"], r["ts"], r["value"]) for r in mine]


def batch_versions(path: Path) -> list[str | None]:
    """The txn version (micro-batch id) of every completed data commit, in completion order."""
    table = Table.load(str(path))
    commits = table.timeline().data_commits().in_completion_order()
    return [table.commit_metadata(i).extra.get(TXN_VERSION_KEY) for i in commits]


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("cowrite:")]


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert process.poll() is None, f"the stream exited {process.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT:.0f} s"
        time.sleep(0.2)


def test_a_stream_writes_each_file_once_and_a_restart_writes_only_what_is_new(tmp_path: Path) -> None:
    path, source, checkpoint = tmp_path / "t", tmp_path / "in", tmp_path / "checkpoint"
    LocalWriter(new_table(path)).insert(rows(["a"], "p0", value="seed"))
    source.mkdir()
    put(source, "1.jsonl", [record("a", "p0", 2, "a2"), record("b", "p0", 1, "b1")])
    put(source, "2.jsonl", [record("c", "p1", 1, "c1")])
    (source / "notes.txt").write_text("not JSON Lines: ignored\n")

    done = stream(path, source, checkpoint, "--once")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(" committed " in line for line in lines[:2]), done.stdout
    assert lines[-1] == "caught up: 2 micro-batches, 2 committed (3 records), 0 committed before"
    assert table_rows(path) == [("a", "p0", 2, "a2"), ("b", "p0", 1, "b1"), ("c", "p1", 1, "c1")]
    assert batch_versions(path) == [None, "0", "1"]  # the seed, then one commit per micro-batch

    # A crash after micro-batch 1 committed but before Spark recorded it, and files arriving meanwhile:
    # the restart runs batch 1 again, which commits nothing, then writes the new files in one batch.
    forget_commit(checkpoint, 1)
    put(source, "3.jsonl", [record("b", "p0", 2, "b2"), record("d", "p1", 1, "d1")])
    put(source, "4.jsonl", [record("e", "p1", 1, "e1")])

    again = stream(path, source, checkpoint, "--once", "--max-files-per-trigger", "2")

    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert lines[0].startswith("micro-batch 1: nothing written: application ")
    assert " version 1 was already committed by instant " in lines[0]
    assert lines[1].startswith("micro-batch 2: committed ")
    assert "(upsert, 3 records of 3.jsonl, 4.jsonl)" in lines[1]
    assert lines[2] == "caught up: 2 micro-batches, 1 committed (3 records), 1 committed before"
    assert table_rows(path) == [
        ("a", "p0", 2, "a2"), ("b", "p0", 2, "b2"), ("c", "p1", 1, "c1"), ("d", "p1", 1, "d1"),
        ("e", "p1", 1, "e1"),
    ]  # fmt: skip
    assert batch_versions(path) == [None, "0", "1", "2"]


def test_a_running_stream_writes_files_as_they_arrive_and_stops_cleanly_on_sigterm(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    path, source, checkpoint = tmp_path / "t", tmp_path / "in", tmp_path / "checkpoint"
    new_table(path)  # no commit yet: CSV columns the table lacks take their narrowly inferred types
    source.mkdir()
    (source / "1.csv").write_text("id,part,ts,value\na,p0,1,a1\nb,p0,1,b1\n")
    out = tmp_path / "stream.out"
    command = [*COWRITE, "stream", str(path), "--input", str(source), "--checkpoint", str(checkpoint)]
    command += ["--format", "csv", "--operation", "insert", "--interval", "0.5", *SPARK]
    with open(out, "wb") as stdout, open(tmp_path / "stream.err", "wb") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True)
    started.append(process)

    def committed(count: int) -> Callable[[], bool]:
        return lambda: out.read_text().count(" committed ") >= count

    wait_for(committed(1), "first commit", process)
    hidden = source / ".2.csv"
    hidden.write_text("id,part,ts,value\nc,p1,1,c1\n")
    hidden.rename(source / "2.csv")
    wait_for(committed(2), "commit of the file that arrived", process)
    os.kill(process.pid, signal.SIGTERM)

    assert process.wait(timeout=WAIT) == 0, (tmp_path / "stream.err").read_text()
    assert out.read_text().splitlines()[-1] == (
        "stopped on request: 2 micro-batches, 2 committed (3 records), 0 committed before"
    )
    assert table_rows(path) == [("a", "p0", 1, "a1"), ("b", "p0", 1, "b1"), ("c", "p1", 1, "c1")]
    assert batch_versions(path) == ["0", "1"]
    # Spark recorded both micro-batches before the query stopped: a restart has nothing to do.
    again = stream(path, source, checkpoint, "--format", "csv", "--operation", "insert", "--once")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "caught up: 0 micro-batches, 0 committed (0 records), 0 committed before"
    ]


def test_a_stream_of_parquet_files_deletes_the_keys_they_name(tmp_path: Path) -> None:
    path, source = tmp_path / "t", tmp_path / "in"
    LocalWriter(new_table(path)).insert(rows(["a", "b", "c"], "p0"))
    source.mkdir()
    pq.write_table(pa.table({"id": ["a", "c", "x"], "part": ["p0", "p0", "p0"]}), source / "gone.parquet")

    done = stream(
        path, source, tmp_path / "checkpoint", "--format", "parquet", "--operation", "delete", "--once"
    )

    assert done.returncode == 0, done.stderr
    assert "(delete, 3 records of gone.parquet)" in done.stdout
    assert table_rows(path) == [("b", "p0", 1, "v")]


def test_no_table_or_no_input_directory_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()

    missing = stream(tmp_path / "nothing", source, tmp_path / "checkpoint", "--once")
    assert missing.returncode == 1
    assert error_lines(missing) == missing.stderr.splitlines()  # no Spark banner: it never started
    assert len(error_lines(missing)) == 1 and "nothing" in missing.stderr

    path = tmp_path / "t"
    new_table(path)
    no_input = stream(path, tmp_path / "absent", tmp_path / "checkpoint", "--once")
    assert no_input.returncode == 2 and "does not exist" in no_input.stderr


def _periods() -> bytes:
    """A parquet file whose ``week`` column holds pandas periods, an Arrow extension type: Spark's reader
    would read whole numbers."""
    weeks = pd.period_range("2024-01-01", periods=1)
    frame = pd.DataFrame({"id": ["b"], "part": ["p0"], "ts": [1], "value": ["x"], "week": weeks})
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
    return bytes(sink.getvalue())


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("bad.jsonl", '{"id": "a", "part": "p0", "ts": "soon", "value": "x"}\n', "column ts"),
        ("bad.csv", "part,ts,value\np0,1,x\n", "id"),  # no key column
        ("periods.parquet", _periods(), "column week of "),
    ],
    ids=["a value that is not the column's type", "no key column", "an Arrow extension type"],
)
def test_a_file_that_does_not_fit_the_table_stops_the_stream_with_one_line_and_the_table_unchanged(
    tmp_path: Path, name: str, content: str | bytes, says: str
) -> None:
    path, source = tmp_path / "t", tmp_path / "in"
    LocalWriter(new_table(path)).insert(rows(["a"], "p0", value="seed"))
    before = sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir())
    source.mkdir()
    if isinstance(content, bytes):
        (source / name).write_bytes(content)
    else:
        (source / name).write_text(content)
    input_format = name.rpartition(".")[2].replace("jsonl", "json")

    done = stream(path, source, tmp_path / "checkpoint", "--format", input_format, "--once")

    assert done.returncode == 1, done.stdout + done.stderr
    assert len(error_lines(done)) == 1 and done.stderr.splitlines()[-1] == error_lines(done)[0]
    assert says in error_lines(done)[0] and name in error_lines(done)[0], done.stderr
    assert sorted(p.name for p in (path / ".hoodie" / "timeline").iterdir()) == before
    assert table_rows(path) == [("a", "p0", 1, "seed")]


def test_a_micro_batch_that_loses_a_conflict_past_the_retries_exits_3_and_is_not_visible(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    path, source = tmp_path / "t", tmp_path / "in"
    table = new_table(path)
    LocalWriter(table).insert(rows(["a", "b"], "p0", value="seed"))
    source.mkdir()
    put(source, "1.jsonl", [record("a", "p0", 5, "stream")])
    ready, release = tmp_path / "paused", tmp_path / "release"
    # The stream's micro-batch is held once its files are written, before its commit: the correction
    # below commits to the same file group meanwhile, and the stream, with no retry, loses.
    held = (
        "import sys; from pathlib import Path; from cowrite import steps; from cowrite.cli import main; "
        "steps.observe_forever(steps.Pause(steps.Step.WRITTEN, release=Path(sys.argv[1]), "
        "ready=Path(sys.argv[2]))); sys.argv = ['cowrite', *sys.argv[3:]]; main()"
    )
    command = [
        sys.executable,
        "-c",
        held,
        str(release),
        str(ready),
        "stream",
        str(path),
        "--input",
        str(source),
    ]
    command += ["--checkpoint", str(tmp_path / "checkpoint"), "--once", *SPARK]
    command += ["-o", "hoodie.write.num.retries.on.conflict.failures=0"]
    with open(tmp_path / "stream.err", "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    started.append(process)
    wait_for(ready.exists, "the micro-batch to be written", process)
    LocalWriter(table).upsert(rows(["b"], "p0", ts=2, value="correction"))
    release.touch()

    assert process.wait(timeout=WAIT) == 3
    err = (tmp_path / "stream.err").read_text().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert (
        err[-1].startswith("cowrite: write conflict on table t")
        and sum(e.startswith("cowrite:") for e in err) == 1
    )
    assert table_rows(path) == [("a", "p0", 1, "seed"), ("b", "p0", 2, "correction")]
