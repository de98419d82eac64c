"""``cowrite demo``: the main job — concurrent Spark writers, the daemon, a conflict, a rollback, and an
incremental read by completion time, on a local table.

Every part is real: the daemon is a ``cowrite daemon`` process serving HTTP on 127.0.0.1, each writer is
a ``cowrite write --engine spark`` process with its own SparkSession, and the killed writer dies by
SIGKILL in the middle of its write. The heartbeat tolerance is shortened (1 s x 2) so the daemon's
rollback happens within seconds instead of minutes.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

import cowrite

_COWRITE = [sys.executable, "-m", "cowrite"]
_FAST_HEARTBEAT = {
    "hoodie.client.heartbeat.interval_in_ms": "1000",
    "hoodie.client.heartbeat.tolerable.misses": "2",
}


def _batch(directory: Path, name: str, rows: list[dict[str, object]]) -> str:
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _rows(region: str, ids: range, version: int) -> list[dict[str, object]]:
    return [{"id": i, "region": region, "version": version, "amount": i * 10 + version} for i in ids]


def _spark_write(
    table: str, batch: str, operation: str = "upsert", hold_until: Path | None = None
) -> subprocess.Popen[str]:
    args = [table, "--input", batch, "--operation", operation, "--engine", "spark", "--master", "local[1]"]
    command = (
        [*_COWRITE, "write", *args]
        if hold_until is None
        else [
            sys.executable,
            "-m",
            "cowrite.held_write",
            str(hold_until),
            *args,
        ]
    )
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _outcome(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate()
    lines = [line for line in (out or err).splitlines() if line.strip()]
    return f"exit {process.returncode}: {lines[-1] if lines else ''}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (our own loopback daemon)
        return bytes(response.read())


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"the demo waited {seconds:.0f} s for {what}")
        time.sleep(0.2)


def run(path: str | None = None, say: Callable[[str], None] = print) -> None:
    work = Path(tempfile.mkdtemp(prefix="cowrite-demo-"))
    table_path = path or str(work / "orders")
    say(f"== a table at {table_path}")
    settings = [arg for key, value in _FAST_HEARTBEAT.items() for arg in ("-o", f"{key}={value}")]
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
            *settings,
        ],
        check=True,
    )
    table = cowrite.load(table_path)
    subprocess.run(
        [
            *_COWRITE,
            "write",
            table_path,
            "--operation",
            "insert",
            "--input",
            _batch(work, "history", _rows("us", range(100, 130), 1)),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    say(f"== the daemon follows the table and serves {url}/metrics")
    daemon = subprocess.Popen(
        [
            *_COWRITE,
            "daemon",
            table_path,
            "--port",
            str(port),
            "--poll-interval",
            "0.5",
            "--log-level",
            "WARNING",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(lambda: _ready(url), 60, "the daemon to be ready")
        checkpoint = table.timeline().latest_completion_time
        _demonstrate(table, table_path, work, say)
        say("== an incremental consumer that checkpoints by completion time")
        pulled = cowrite.pull(table, checkpoint)
        say(
            f"   since {checkpoint}: {pulled.rows.num_rows} records from commits {list(pulled.commits)}; "
            f"next checkpoint {pulled.checkpoint}"
        )
        say("== what the daemon tells Prometheus")
        metrics = _get(f"{url}/metrics").decode()
        for line in metrics.splitlines():
            if line.startswith(
                (
                    "cowrite_commits_total",
                    "cowrite_write_conflicts_total",
                    "cowrite_rollbacks_total",
                    "cowrite_pending_instants",
                    "cowrite_table_up",
                )
            ):
                say(f"   {line}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    say(
        f"== the daemon stopped on SIGTERM (exit {daemon.returncode}); the table now holds "
        f"{cowrite.snapshot(table).num_rows} records:"
    )
    for instant in table.timeline():
        operation = (
            table.commit_metadata(instant).operation
            if instant.is_completed and instant.action.writes_data
            else ""
        )
        say(f"   {instant.file_name:<48} {operation}")
    _check_with_hudi_rs(table, say)


def _check_with_hudi_rs(table: cowrite.Table, say: Callable[[str], None]) -> None:
    """Read the table with hudi-rs, Hudi's Rust reader, and say whether it returns exactly cowrite's
    records. It is the one other reader this project verifies; without it installed nothing is claimed."""
    try:
        from hudi import HudiTableBuilder
    except ImportError:
        say("   hudi-rs is not installed: no other reader checked this table.")
        return
    theirs = pa.Table.from_batches(HudiTableBuilder.from_base_uri(table.uri).build().read())
    mine = cowrite.snapshot(table)
    columns = mine.column_names
    if sorted(theirs.select(columns).to_pylist(), key=repr) == sorted(mine.to_pylist(), key=repr):
        say(f"   hudi-rs reads the same {mine.num_rows} records.")
    else:
        say(f"   hudi-rs reads {theirs.num_rows} records, cowrite {mine.num_rows}: the readers disagree.")
        raise SystemExit(1)


def _ready(url: str) -> bool:
    try:
        return json.loads(_get(f"{url}/readyz"))["ready"] is True
    except OSError:
        return False


def _demonstrate(table: cowrite.Table, table_path: str, work: Path, say: Callable[[str], None]) -> None:
    say("== two Spark applications at once: ingestion of new data (eu), a backfill rewriting history (us)")
    ingestion = _spark_write(table_path, _batch(work, "ingest", _rows("eu", range(0, 50), 1)))
    backfill = _spark_write(
        table_path, _batch(work, "backfill", _rows("us", range(100, 130), 2)), "insert_overwrite"
    )
    say(f"   ingestion {_outcome(ingestion)}")
    say(f"   backfill  {_outcome(backfill)}")

    say("== a correction job and the ingestion update the same file group: the first to commit wins")
    release = work / "release-correction"
    correction = _spark_write(
        table_path, _batch(work, "fix", _rows("eu", range(0, 5), 3)), hold_until=release
    )
    before = table.timeline().requested_times
    _wait(
        lambda: bool(table.timeline().pending().requested_times - before), 120, "the correction job to begin"
    )
    ingestion = _spark_write(table_path, _batch(work, "ingest2", _rows("eu", range(5, 10), 2)))
    say(f"   ingestion  {_outcome(ingestion)}")
    release.touch()
    say(f"   correction {_outcome(correction)}   (3 = write conflict; nothing of it is visible)")

    say("== a writer is killed with SIGKILL mid-write; the daemon rolls it back once its heartbeat is stale")
    doomed = _spark_write(
        table_path, _batch(work, "doomed", _rows("apac", range(200, 230), 1)), hold_until=work / "never"
    )
    apac = Path(table_path) / "apac"  # the demo's table is on local disk
    _wait(lambda: any(apac.glob("*.parquet")), 120, "the writer's files")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    visible = cowrite.snapshot(table).column("region").to_pylist().count("apac")
    say(
        f"   killed; files it left: {len(list(apac.glob('*.parquet')))}, "
        f"records of it visible: {visible}"
    )
    _wait(lambda: not any(apac.glob("*.parquet")), 60, "the daemon's rollback")
    rollbacks = [i.file_name for i in cowrite.timeline(table) if i.action == "rollback"]
    say(f"   the daemon rolled it back (and the aborted correction before it): {rollbacks}; files left: 0")
