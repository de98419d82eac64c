"""A timeline file that a listing showed and a concurrent rollback, archival or clean removed before it was
read: the reader carries on where that is sound, or fails with a typed error, never a raw
``FileNotFoundError``. On local disk and S3, where the window is widest (each request a round trip)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from cowrite import process
from cowrite.cleaner import clean, rollback_failed, service_lock
from cowrite.cleaner.archive import archive
from cowrite.cleaner.rollback import _finish, _start
from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.metrics import DaemonMetrics
from cowrite.daemon.service import TableService
from cowrite.errors import InstantGoneError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import FileSystemView, list_base_files
from cowrite.format.instant import Action, Instant, State
from cowrite.format.overlay import read_since
from cowrite.format.table import Table
from cowrite.format.timeline import ARCHIVE_DIR, archived
from cowrite.local import read
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


# -- readers, the cleaner and the daemon: a timeline file archived or rolled back after their listing -----


def _other_process(table: Table) -> Table:
    """The same table opened afresh, as another process would: its own storage, nothing read yet."""
    return Table.load(table.uri, **table.storage.options)


def _meanwhile_at_first_read(
    table: Table, wanted: Callable[[str], bool], meanwhile: Callable[[], Any]
) -> None:
    """Just before ``table`` first reads a file ``wanted``, ``meanwhile`` runs (another process's work)."""
    read = table.storage.read
    pending = [meanwhile]

    def racing(path: str) -> bytes:
        if pending and wanted(path):
            pending.pop()()
        return read(path)

    table.storage.read = racing  # type: ignore[method-assign]


def _archived_meanwhile(table: Table, keep: int = 1) -> Callable[[], Any]:
    """Another process archiving all but the newest ``keep`` commits of ``table``."""
    other = _other_process(table)
    return lambda: archive(other, service_lock(other), keep_min=keep, keep_max=keep)


def _history(table: Table) -> list[Instant]:
    """Four commits on id 1 (each a new version of its file group), then ids 2 and 3 added."""
    writer = LocalWriter(table)
    return [
        writer.insert(_rows(1)),
        writer.upsert(pa.table({"id": pa.array([1], pa.int64()), "v": ["1b"]})),
        writer.upsert(pa.table({"id": pa.array([1], pa.int64()), "v": ["1c"]})),
        writer.insert(_rows(2, 3)),
    ]


def _by_id(rows: pa.Table) -> dict[int, str]:
    return dict(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))


def test_a_snapshot_reads_on_when_commits_are_archived_after_its_listing(table: Table) -> None:
    commits = _history(table)
    reader = _other_process(table)
    _meanwhile_at_first_read(
        reader, lambda path: path.endswith(commits[0].file_name), _archived_meanwhile(table)
    )
    assert _by_id(read.snapshot(reader)) == {1: "1c", 2: "2", 3: "3"}
    assert [i.requested_time for i in reader.timeline()] == [commits[-1].requested_time]  # it did move on


def test_a_snapshot_that_meets_a_vanished_file_in_two_listings_is_a_typed_error(table: Table) -> None:
    commits = _history(table)
    reader = _other_process(table)
    _removed_before_read(reader, lambda path: path.endswith(tuple(c.file_name for c in commits)))
    with pytest.raises(InstantGoneError, match="reload the timeline and retry"):
        read.snapshot(reader)


def test_an_incremental_read_reads_on_when_commits_are_archived_after_its_listing(table: Table) -> None:
    commits = _history(table)
    reader = _other_process(table)
    _meanwhile_at_first_read(
        reader, lambda path: path.endswith(commits[0].file_name), _archived_meanwhile(table)
    )
    rows = read.incremental(reader, since=commits[2].completion_time, with_meta=True)
    assert [i.requested_time for i in table.timeline()] == [commits[-1].requested_time]  # archived
    assert _by_id(rows) == {2: "2", 3: "3"}
    assert set(rows.column("_hoodie_commit_time").to_pylist()) == {commits[-1].requested_time}


def test_a_pull_reads_on_when_commits_before_its_checkpoint_are_archived_after_its_listing(
    table: Table,
) -> None:
    commits = _history(table)
    reader = _other_process(table)
    _meanwhile_at_first_read(
        reader, lambda path: path.endswith(commits[0].file_name), _archived_meanwhile(table)
    )
    pulled = read.pull(reader, commits[2].completion_time)
    assert [i.requested_time for i in table.timeline()] == [commits[-1].requested_time]  # archived
    assert _by_id(pulled.rows) == {2: "2", 3: "3"}
    assert (pulled.checkpoint, pulled.commits) == (commits[-1].completion_time, (commits[-1].requested_time,))


def test_a_clean_finishes_when_commits_are_archived_after_it_planned(table: Table) -> None:
    commits = _history(table)
    versions = {b.path for b in list_base_files(table)}
    latest = {b.path for b in FileSystemView.build(table).latest_base_files()}
    assert len(versions - latest) >= 3  # id 1's superseded versions
    if table.uri.startswith("s3://"):
        # Archival moves only what every pending instant (the clean) saw: on S3 modification times are
        # whole seconds, so the commits must be a second older than the clean's claim.
        time.sleep(1.0)
    cleaner = _other_process(table)
    # having planned under the lock, the clean reads the timeline again for the files it must keep
    _meanwhile_at_first_read(
        cleaner, lambda path: path.endswith(commits[0].file_name), _archived_meanwhile(table)
    )
    done = clean(cleaner, service_lock(cleaner), commits_retained=1)
    assert done is not None and set(done.deleted) == versions - latest
    assert {b.path for b in list_base_files(table)} == latest
    assert [(i.requested_time, i.action, i.state) for i in table.timeline()] == [
        (commits[-1].requested_time, Action.COMMIT, State.COMPLETED),
        (done.clean.requested_time, Action.CLEAN, State.COMPLETED),
    ]
    assert _by_id(read.snapshot(_other_process(table))) == {1: "1c", 2: "2", 3: "3"}


def test_a_rollback_recorded_by_another_cleaner_and_archived_after_the_listing_is_passed_over(
    table: Table,
) -> None:
    first = LocalWriter(table).insert(_rows(1))
    dead = Transaction.begin(table, "upsert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None
    dead.heartbeat.stop(delete=False)
    later = time.time() + 3600  # as judged by a clock an hour on: the writer is long dead
    lock, policy = service_lock(table), HeartbeatPolicy.from_config(table.config)
    target = table.timeline().get(dead.instant_time)
    assert target is not None
    rollback = _start(table, lock, target, policy, now=later)  # recorded by cleaner A, not carried out yet
    assert rollback is not None
    cleaner = _other_process(table)  # cleaner B lists the pending rollback; then it is finished and archived
    commits: list[Instant] = []

    def finished_and_archived() -> None:
        assert _finish(table, lock, rollback, time.time()) is not None
        commits.extend(LocalWriter(table).insert(_rows(n)) for n in (2, 3, 4))
        _archived_meanwhile(table)()

    _meanwhile_at_first_read(cleaner, lambda path: rollback.requested_time in path, finished_and_archived)
    assert rollback_failed(cleaner, service_lock(cleaner), policy, now=later) == []
    assert [(i.requested_time, i.state) for i in table.timeline()] == [
        (commits[-1].requested_time, State.COMPLETED)
    ]
    archived_times = {i.requested_time for i in archived(table.storage)}
    assert archived_times == {first.requested_time, rollback.requested_time} | {
        c.requested_time for c in commits[:-1]
    }
    assert _by_id(read.snapshot(_other_process(table))) == {n: str(n) for n in (1, 2, 3, 4)}


def test_a_daemon_poll_follows_commits_archived_after_its_listing(
    table: Table, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if table.uri.startswith("s3://"):  # the daemon finds S3 through the AWS variables, as deployed
        for name, value in request.getfixturevalue("s3_server").env().items():
            monkeypatch.setenv(name, value)
    writer = LocalWriter(table)
    writer.insert(_rows(1))
    config = DaemonConfig(tables=(TableEntry(table.uri),), port=0)
    service = TableService(config.tables[0], config, DaemonMetrics(CollectorRegistry(), lambda: []))
    service.poll()
    assert service.status.up and service.table is not None
    commits = [writer.insert(_rows(n)) for n in (2, 3, 4)]
    _meanwhile_at_first_read(
        service.table, lambda path: path.endswith(commits[0].file_name), _archived_meanwhile(table)
    )
    service.poll()
    assert (service.status.up, service.status.error) == (True, None)
    assert service.status.instants_by_state == {"completed": 1}
    assert service.overlay is not None  # the log records how far archival went, and has what is left
    assert service.overlay.archived_through == commits[1].completion_time
    logged = read_since(table.storage, service.overlay.archived_through)
    assert logged is not None and [e.requested_time for e in logged.entries] == [commits[-1].requested_time]
    service.poll()
    assert service.status.up and service.status.instants_by_state == {"completed": 1}
