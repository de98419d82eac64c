"""An upsert never leaves two records with one key, by default: concurrent writers that insert the same new
key into a partition conflict (the later aborts), writers whose new keys differ all commit. The commits'
key summaries decide without reading data files; they are checked here for no false negatives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import hudi_rs

from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.protocol.conflict import inserted_keys
from cowrite.protocol.key_summary import EXACT_LIMIT, INSERTED_KEYS, KeySummary

WRITERS = 8
CONFLICT = 3  # `cowrite write`'s exit code for a write conflict


def _start_writers(tmp_path: Path, table: str, batches: list[list[int]], *options: str) -> list[int]:
    """``cowrite write --operation upsert`` processes, one per batch of ids, started at once."""
    processes = []
    for n, ids in enumerate(batches):
        batch = tmp_path / f"batch{n}.jsonl"
        batch.write_text("".join(json.dumps({"id": i, "part": "p0", "ts": n, "w": n}) + "\n" for i in ids))
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "cowrite", "write", table, "--input", str(batch),
                 "--operation", "upsert", *options],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=os.environ,
            )
        )  # fmt: skip
    codes = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode in (0, CONFLICT), out + err
        assert "Traceback" not in err
        if process.returncode == CONFLICT:
            assert "records with the same keys" in err or "file groups" in err, err
        codes.append(process.returncode)
    return codes


def _new_table(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    Table.create(uri, name="t", record_key_fields=["id"], partition_fields=["part"], ordering_fields=["ts"])
    return uri


def test_concurrent_upserts_of_the_same_new_keys_leave_each_key_once(tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    codes = _start_writers(tmp_path, table, [list(range(100))] * WRITERS)
    assert codes.count(0) >= 1
    rows = read.snapshot(Table.load(table)).to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(100))  # each key once
    assert sorted(r["id"] for r in hudi_rs.snapshot(table)) == list(range(100))
    completed = [i for i in Table.load(table).timeline() if i.is_completed and i.action.writes_data]
    assert len(completed) == codes.count(0)


def test_concurrent_upserts_of_different_new_keys_all_commit(tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    # No small file group filling: a writer that began after another committed would fill its small
    # file group, and two such writers conflict by file group (a conflict of their own kind).
    batches = [list(range(n * 100, n * 100 + 100)) for n in range(WRITERS)]
    codes = _start_writers(tmp_path, table, batches, "-o", "hoodie.parquet.small.file.limit=0")
    assert codes == [0] * WRITERS
    expected = list(range(WRITERS * 100))
    assert sorted(r["id"] for r in read.snapshot(Table.load(table)).to_pylist()) == expected
    assert sorted(r["id"] for r in hudi_rs.snapshot(table)) == expected


def test_the_commit_records_its_inserted_keys(tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    _start_writers(tmp_path, table, [[1, 2, 3]])
    loaded = Table.load(table)
    [commit] = [i for i in loaded.timeline() if i.is_completed]
    summary = inserted_keys(loaded.commit_metadata(commit))
    assert summary is not None and summary.partitions["p0"].keys == {"1", "2", "3"}


KEYS = st.lists(st.tuples(st.sampled_from(["p0", "p1"]), st.text(min_size=1, max_size=6)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(mine=KEYS, theirs=KEYS, many=st.booleans())
def test_summaries_never_miss_a_shared_key(
    mine: list[tuple[str, str]], theirs: list[tuple[str, str]], many: bool
) -> None:
    """Exact or filtered (the filter is forced by padding past the exact limit), a shared key is found:
    surely when both are exact, as a "maybe" otherwise; and a summary survives its JSON round trip."""
    padding = [("p0", f"pad-{i}") for i in range(EXACT_LIMIT + 1)] if many else []
    a, b = KeySummary.of(mine + padding), KeySummary.of(theirs)
    assert KeySummary.from_json(a.to_json()) == a
    a = KeySummary.from_json(a.to_json()) or a
    sure, maybe = a.shared(b)
    common = set(mine) & set(theirs)
    if many:
        assert maybe or not common
    else:
        assert sure == common and not maybe


def test_a_damaged_summary_is_ignored_and_files_decide() -> None:
    for text in (
        "not json",
        '{"p0": {"low": "a"}}',
        '{"p0": {"low": "a", "high": "b", "bits": 99, "bloom": ""}}',
    ):
        assert KeySummary.from_json(text) is None
    assert inserted_keys(CommitMetadata("upsert", extra={INSERTED_KEYS: "{]"})) is None


@pytest.mark.parametrize("count", [10, EXACT_LIMIT * 2])
def test_a_bloom_filter_admits_few_strangers(count: int) -> None:
    summary = KeySummary.of(("p", f"k{i}") for i in range(count))
    strangers = sum(summary.partitions["p"].may_hold(f"k{i}x") for i in range(10_000))  # inside the range
    assert strangers <= (0 if count <= EXACT_LIMIT else 300)  # about 1 % for the filter
