"""Idempotent writes across real processes: two processes of one application racing one version."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from support import TESTS, hudi_rs
from support.tables import new_table

from cowrite.local import read
from cowrite.protocol.txn import Committed, last_version

# One writer process: upserts its rows as (app, version), waits at the commit (every file written, the
# lock not yet asked for) until the test lets it go, and prints what happened as JSON.
WRITER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from support.tables import rows
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter
from cowrite.protocol.transaction import WriteOptions
from cowrite.protocol.txn import Txn
from cowrite.steps import Step, observe

_, _, uri, app, version, name, ready, go = sys.argv

def wait_at_commit(step, instant, details):
    if step is Step.WRITTEN:
        Path(ready).touch()
        deadline = time.monotonic() + 60
        while not Path(go).exists():
            if time.monotonic() > deadline:
                sys.exit(9)
            time.sleep(0.005)

table = Table.load(uri)
writer = LocalWriter(table, WriteOptions(config=table.config, txn=Txn(app, int(version))))
with observe(wait_at_commit):
    instant = writer.upsert(rows([name], value=name))
refused = writer.refused
print(json.dumps({
    "instant": instant.requested_time if instant else None,
    "refused_by": refused.committed_by if refused else None,
}))
"""


def _race(uri: str, version: int, tmp_path: Path) -> list[dict[str, str | None]]:
    go = tmp_path / f"go-{version}"
    processes, ready = [], []
    for name in ("left", "right"):
        flag = tmp_path / f"ready-{name}-{version}"
        ready.append(flag)
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(TESTS),
                    uri,
                    "ingest",
                    str(version),
                    name,
                    str(flag),
                    str(go),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 120
    while not all(f.exists() for f in ready):  # both wrote their files, neither has committed
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.01)
    go.touch()
    results = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        results.append(json.loads(out))
    return results


def test_two_processes_of_one_application_racing_one_version_commit_it_once(tmp_path: Path) -> None:
    table = new_table(tmp_path / "t")
    for version in (1, 2, 3):
        results = _race(table.uri, version, tmp_path)
        committed = [r for r in results if r["refused_by"] is None]
        refused = [r for r in results if r["refused_by"] is not None]
        assert len(committed) == 1 and len(refused) == 1, results
        winner = committed[0]["instant"]
        assert winner is not None and refused[0]["refused_by"] == winner == refused[0]["instant"]
        assert last_version(table, "ingest") == Committed(version, winner)
        completed = [i for i in table.timeline() if i.is_completed]
        assert len(completed) == version and completed[-1].requested_time == winner
    names = [r["id"] for r in hudi_rs.rows(read.snapshot(table))]
    assert hudi_rs.snapshot(table.uri) == hudi_rs.rows(read.snapshot(table))
    # each round upserted "left" or "right", whichever won: only winners' rows are visible
    assert set(names) <= {"left", "right"} and len(names) == len(set(names))
    losers = {i.requested_time for i in table.timeline() if not i.is_completed}
    assert len(losers) == 3  # the losers' pending instants, left for the lazy rollback
    assert not [p for p in Path(table.uri).rglob("*.parquet") if any(t in p.name for t in losers)]
