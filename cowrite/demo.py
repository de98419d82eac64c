"""``cowrite demo``: concurrent writers, a conflict, a killed writer and incremental reads on a local table.

Every step uses the real parts: writer processes are separate ``cowrite write`` commands sharing the table
through the filesystem lock, and the killed writer is stopped with SIGKILL in the middle of its write.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .timeline.commit_metadata import CommitMetadata
from .timeline.fs_view import list_base_files
from .timeline.instant import Instant
from .timeline.table import Table
from .writer import read

_COWRITE = [sys.executable, "-m", "cowrite"]


def _batch(directory: Path, name: str, rows: list[dict[str, object]]) -> str:
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _rows(region: str, ids: range, version: int) -> list[dict[str, object]]:
    return [{"id": i, "region": region, "version": version, "amount": i * 10 + version} for i in ids]


def slow_write(pause: float, *args: str) -> None:
    """``cowrite write`` that pauses between writing its files and committing: a long backfill."""
    from .cli import main
    from .timeline.transaction import Transaction

    commit = Transaction.commit

    def paused_commit(self: Transaction, metadata: CommitMetadata, *args: Any, **kwargs: Any) -> Instant:
        time.sleep(pause)
        return commit(self, metadata, *args, **kwargs)

    Transaction.commit = paused_commit  # type: ignore[method-assign]
    sys.argv = ["cowrite", "write", *args]
    main()


def _start_write(table: str, batch: str, pause: float = 0.0) -> subprocess.Popen[str]:
    args = ["write", table, "--input", batch, "--operation", "upsert"]
    command = (
        [*_COWRITE, *args]
        if not pause
        else [
            sys.executable,
            "-c",
            "import sys, cowrite.demo as d; d.slow_write(float(sys.argv[1]), *sys.argv[2:])",
            str(pause),
            *args[1:],
        ]
    )
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(path: str | None = None, say: Callable[[str], None] = print) -> None:
    work = Path(tempfile.mkdtemp(prefix="cowrite-demo-"))
    table_path = path or str(work / "orders")
    if path and Path(path).exists():
        shutil.rmtree(path)
    say(f"== a table at {table_path}")
    subprocess.run(
        [
            *_COWRITE,
            "init",
            table_path,
            "--record-key",
            "id",
            "--partition-field",
            "region",
            "--ordering-field",
            "version",
            "--name",
            "orders",
        ],
        check=True,
    )
    table = Table.load(table_path)

    say("== two writers (ingestion into 'eu', backfill into 'us') commit at the same time")
    writers = [
        _start_write(table_path, _batch(work, "ingest", _rows("eu", range(0, 50), 1))),
        _start_write(table_path, _batch(work, "backfill", _rows("us", range(100, 150), 1))),
    ]
    for process in writers:
        out, err = process.communicate()
        say(f"   exit {process.returncode}: {(out or err).strip()}")
    checkpoint = table.timeline().latest_completion_time

    say("== two writers update the same file group: the first to commit wins, the other aborts")
    first = _start_write(table_path, _batch(work, "fix-a", _rows("eu", range(0, 5), 2)), pause=3.0)
    time.sleep(1.0)
    second = subprocess.run(
        [*_COWRITE, "write", table_path, "--input", _batch(work, "fix-b", _rows("eu", range(5, 10), 3))],
        capture_output=True,
        text=True,
    )
    say(f"   fast writer exit {second.returncode}: {(second.stdout or second.stderr).strip()}")
    out, err = first.communicate()
    say(f"   slow writer exit {first.returncode} (3 = write conflict): {(out or err).strip()}")

    say("== a writer is killed with SIGKILL mid-write: its files stay on disk, invisible")
    doomed = _start_write(table_path, _batch(work, "doomed", _rows("apac", range(200, 230), 1)), pause=600.0)
    deadline = time.time() + 30
    while time.time() < deadline and not any(b.partition == "apac" for b in list_base_files(table)):
        time.sleep(0.1)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    garbage = [b.path for b in list_base_files(table) if b.partition == "apac"]
    visible = read.snapshot(table).column("region").to_pylist().count("apac")
    say(f"   files left by the killed writer: {len(garbage)}; rows of it visible: {visible}")
    pending = [i.file_name for i in table.timeline().pending()]
    say(f"   pending instants (rolled back lazily once their heartbeat expires): {pending}")

    say("== an incremental reader that checkpoints by completion time")
    changes = read.incremental(table, since=checkpoint)
    say(
        f"   since {checkpoint}: {changes.num_rows} changed records, ids "
        f"{sorted(changes.column('id').to_pylist())}"
    )
    say(f"== the table now: {read.snapshot(table).num_rows} records; timeline:")
    for instant in table.timeline():
        say(f"   {instant.file_name}")
    say("   (hudi-rs, Spark and Trino read this table as a Hudi v8 table)")
