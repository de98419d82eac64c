"""``cowrite demo``, the main job the README promises, run as a user runs it: every step it narrates
happens, and it claims only what it checked (the streaming consumer's reads against the timeline, hudi-rs
reads the table it made)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cowrite.format.instant import Action, State
from cowrite.format.table import Table
from cowrite.protocol.txn import TXN_VERSION_KEY


@pytest.mark.slow
def test_the_demo_runs_end_to_end_and_claims_only_what_it_checked(tmp_path: Path) -> None:
    table_path = tmp_path / "orders"
    done = subprocess.run(
        [sys.executable, "-m", "cowrite", "demo", "--path", str(table_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Traceback" not in out + done.stderr
    assert "consumer read 1 commit, 30 records" in out  # the history, before any other writer began

    # The stream, killed right after its first commit landed, replays that micro-batch and commits nothing.
    killed = re.search(r"stream +killed with SIGKILL \(its JVM too\) right after commit (\d+) landed", out)
    replayed = re.search(
        r"stream +micro-batch 0: nothing written: application \S+ version 0 was already committed by "
        r"instant (\d+)",
        out,
    )
    assert killed and replayed and killed.group(1) == replayed.group(1), out
    assert re.search(r"stream +micro-batch 1: committed \d+ \(upsert, 20 records of eu-1.jsonl\)", out)
    assert re.search(r"stream +micro-batch 2: committed \d+ \(upsert, 10 records of eu-2.jsonl\)", out)
    assert "stream     caught up: 3 micro-batches, 2 committed (30 records), 1 committed before" in out
    assert re.search(r"backfill +exit 0: committed \d+ \(insert_overwrite, 30 records\)", out)
    assert "correction exit 3: cowrite: write conflict on table orders" in out
    assert "records of it visible: 0" in out
    assert "consumer read 4 commits, 80 records" in out
    assert (
        "in all it read 5 commits, 110 records, in 2 micro-batches: every data commit on the timeline "
        "exactly once, with every record it wrote" in out
    )
    assert "the daemon stopped on SIGTERM (exit 0); the table now holds 80 records" in out
    assert out.rstrip().endswith("hudi-rs reads the same 80 records.")
    assert "Trino" not in out and "Hudi on Spark" not in out  # readers no test here verifies

    # the stream and the backfill start at once: which one claims its instant first is theirs to race
    table = Table.load(str(table_path))
    timeline = table.timeline()
    assert Counter((i.action, i.state) for i in timeline) == {
        (Action.COMMIT, State.COMPLETED): 4,  # the history, the stream's three micro-batches
        (Action.REPLACE_COMMIT, State.COMPLETED): 1,  # the backfill
        (Action.ROLLBACK, State.COMPLETED): 2,  # the aborted correction, the killed writer
    }
    batches = [table.commit_metadata(i).extra.get(TXN_VERSION_KEY) for i in timeline.data_commits()]
    assert sorted(filter(None, batches)) == ["0", "1", "2"]  # each micro-batch committed once
