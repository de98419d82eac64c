"""The object-store benchmark's account of where a write call's time goes (bench/commit_phases.py): taken
from the protocol's steps, part by part, with nothing left over."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from support import ROOT

from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter
from cowrite.steps import Step, observe

sys.path.insert(0, str(ROOT))
from bench.commit_phases import HANDED, OWN, Seen, phases, watcher  # noqa: E402


def test_calls_that_published_in_their_own_turn_are_taken_apart_without_a_gap(tmp_path: Path) -> None:
    table = Table.create(str(tmp_path / "t"), name="t", record_key_fields=["id"])
    writer, seen, calls = LocalWriter(table), [], []
    with observe(watcher(seen)):
        for value in ("x", "y", "z"):
            began = time.time()
            writer.upsert(pa.table({"id": [1], "v": [value]}))
            calls.append((began, time.time()))
    taken = phases([(calls, seen)])
    assert all(len(taken.own[name]) == 3 for name in OWN)
    assert not any(taken.handed.values())
    for index, (began, ended) in enumerate(calls):
        parts = [taken.own[name][index] for name in OWN]
        assert min(parts) >= 0
        assert sum(parts) == pytest.approx((ended - began) * 1000)
    assert [line.split(":")[0] for line in taken.describe()] == ["3 published in their own turn"]


def test_a_handed_over_commit_is_timed_to_the_holder_s_create_and_to_its_writer_learning_of_it() -> None:
    waiter: list[Seen] = [
        (10.100, Step.REQUESTED, "w1", False),
        (10.150, Step.WRITTEN, "w1", False),
        (10.600, Step.PUBLISHED, "w1", True),  # learned from the lock's files
    ]
    holder: list[Seen] = [
        (10.200, Step.REQUESTED, "h1", False),
        (10.210, Step.WRITTEN, "h1", False),
        (10.300, Step.LOCKED, "h1", False),
        (10.350, Step.PUBLISHED, "h1", False),
        (10.400, Step.GROUPED, "w1", False),  # the waiter's commit, created by this holder
    ]
    taken = phases([([(10.0, 10.601)], waiter), ([(10.190, 10.450)], holder)])
    handed = {name: round(taken.handed[name][0]) for name in HANDED}
    assert handed == {"begin": 100, "write": 50, "to be published": 250, "to learn": 200, "rest": 1}
    own = {name: round(taken.own[name][0]) for name in OWN}
    assert own == {"begin": 10, "write": 10, "to the lock": 90, "publish": 50, "rest": 100}


def test_a_call_that_failed_or_whose_steps_are_missing_is_left_out() -> None:
    aborted: list[Seen] = [(1.1, Step.REQUESTED, "a", False), (1.2, Step.WRITTEN, "a", False)]
    taken = phases([([(1.0, 1.3), (2.0, 2.1)], aborted)])
    assert not any(taken.own.values()) and not any(taken.handed.values())
    assert taken.describe() == []
