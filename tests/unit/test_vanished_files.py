"""A timeline file that a listing showed and a concurrent rollback, archival or clean removed before it was
read: the reader carries on where that is sound, or fails with a typed error, never a raw
``FileNotFoundError``. On local disk and S3, where the window is widest (each request a round trip)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from cowrite import process
from cowrite.cleaner import service_lock
from cowrite.cleaner.archive import archive
from cowrite.cleaner.rollback import _finish, _start
from cowrite.errors import InstantGoneError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action, State
from cowrite.format.table import Table
from cowrite.format.timeline import ARCHIVE_DIR
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.transaction import Transaction, WriteOptions


@pytest.fixture(params=["local", "s3"])
def table(request: pytest.FixtureRequest, tmp_path: Any) -> Table:
    uri, options = str(tmp_path / "t"), {}
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        uri, options = f"s3://{server.bucket}/vanished-{time.time_ns()}", server.storage_options()
    return Table.create(uri, name="t", record_key_fields=["id"], storage_options=options)


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [str(i) for i in ids]})


def _removed_before_read(table: Table, wanted: Callable[[str], bool]) -> None:
    """The first read of a file ``wanted`` finds it removed, as if another process removed it just then."""
    read = table.storage.read

    def racing(path: str) -> bytes:
        if wanted(path) and table.storage.exists(path):
            table.storage.delete(path)
        return read(path)

    table.storage.read = racing  # type: ignore[method-assign]


def test_a_committer_passes_a_rollback_archived_after_its_listing(table: Table) -> None:
    LocalWriter(table).insert(_rows(1))
    mine = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    dead = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    # judged failed (as by a clock an hour on) and rolled back: a completed rollback after this instant
    lock, policy = service_lock(table), HeartbeatPolicy.from_config(table.config)
    target = table.timeline().get(dead.instant_time)
    assert target is not None
    started = _start(table, lock, target, policy, now=time.time() + 3600)
    assert started is not None and _finish(table, lock, started, time.time() + 3600) is not None
    rollback = started
    _removed_before_read(table, lambda path: rollback.requested_time in path and "rollback" in path)
    completed = mine.commit(CommitMetadata("upsert"))  # the vanished plan was not of this instant
    assert completed.state is State.COMPLETED


def test_a_vanished_plan_is_a_typed_error(table: Table) -> None:
    LocalWriter(table).insert(_rows(1))
    [commit] = list(table.timeline())
    process.forget()  # as a process that had not read it yet
    _removed_before_read(table, lambda path: commit.file_name in path)
    with pytest.raises(InstantGoneError, match="reload the timeline and retry"):
        table.commit_metadata(commit)


def test_archival_archives_nothing_when_the_timeline_changes_under_it(table: Table) -> None:
    writer = LocalWriter(table)
    for n in range(5):
        writer.insert(_rows(n))
    before = [i for i in table.timeline() if i.is_completed]
    _removed_before_read(table, lambda path: path.endswith(".inflight"))
    assert archive(table, service_lock(table), keep_min=1, keep_max=2) is None
    assert [i for i in table.timeline() if i.is_completed] == before
    assert not table.storage.names(ARCHIVE_DIR)
    assert all(i.action is Action.COMMIT for i in before)
