"""``cowrite demo``, the main job the README promises, run as a user runs it: every step it narrates
happens, and it claims only what it checked (hudi-rs reads the table it made)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cowrite.format.instant import Action, State
from cowrite.format.table import Table


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
    assert re.search(r"ingestion exit 0: committed \d+ \(upsert, 50 records\)", out)
    assert re.search(r"backfill  exit 0: committed \d+ \(insert_overwrite, 30 records\)", out)
    assert "correction exit 3: cowrite: write conflict on table orders" in out
    assert "records of it visible: 0" in out
    assert "the daemon stopped on SIGTERM (exit 0); the table now holds 80 records" in out
    assert out.rstrip().endswith("hudi-rs reads the same 80 records.")
    assert "Trino" not in out and "Hudi on Spark" not in out  # readers no test here verifies

    # the two Spark applications start at once: which one claims its instant first is theirs to race
    timeline = Table.load(str(table_path)).timeline()
    assert Counter((i.action, i.state) for i in timeline) == {
        (Action.COMMIT, State.COMPLETED): 3,  # the seed, the ingestion, its second batch
        (Action.REPLACE_COMMIT, State.COMPLETED): 1,  # the backfill
        (Action.ROLLBACK, State.COMPLETED): 2,  # the aborted correction, the killed writer
    }
