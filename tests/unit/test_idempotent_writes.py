"""Idempotent writes: a write carrying an application id and a version commits once, whatever replays it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import hudi_rs
from support.tables import new_table, rows

from cowrite import process
from cowrite.cleaner import service_lock
from cowrite.cleaner.archive import archive
from cowrite.errors import CommitFailedError, ConfigError, CorruptTimelineError, TxnAlreadyCommittedError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.locks import LockHolder, lock_for
from cowrite.protocol.transaction import WriteOptions
from cowrite.protocol.txn import (
    TXN_APP_ID_KEY,
    TXN_VERSION_KEY,
    TXNS_KEY,
    Committed,
    CommittedTxns,
    Txn,
    last_version,
)
from cowrite.steps import Step, observe


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return new_table(tmp_path / "t")


def writer(table: Table, app_id: str | None = None, version: int = 0) -> LocalWriter:
    txn = Txn(app_id, version) if app_id is not None else None
    return LocalWriter(table, WriteOptions(config=table.config, txn=txn))


def exact_rows(table: Table) -> list[dict[str, Any]]:
    """The table's rows as cowrite's reader and hudi-rs both read them (they must agree)."""
    mine = hudi_rs.rows(read.snapshot(table))
    assert hudi_rs.snapshot(table.uri) == mine
    return mine


def completed(table: Table) -> list[str]:
    return [i.file_name for i in table.timeline() if i.is_completed]


def files(table: Table) -> list[str]:
    """Every file of the table, timeline included (heartbeats and locks aside: they come and go)."""
    root = Path(table.uri)
    skipped = (".hoodie/.heartbeat", ".hoodie/locks")
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.relative_to(root).as_posix().startswith(skipped)
    )


def test_a_write_with_a_txn_records_it_in_its_commit(table: Table) -> None:
    instant = writer(table, "ingest", 3).upsert(rows(["a"]))
    assert instant is not None
    extra = table.commit_metadata(instant).extra
    assert extra[TXN_APP_ID_KEY] == "ingest" and extra[TXN_VERSION_KEY] == "3"
    assert json.loads(extra[TXNS_KEY]) == {"ingest": {"version": 3, "instant": instant.requested_time}}
    assert last_version(table, "ingest") == Committed(3, instant.requested_time)
    assert last_version(table, "other") is None


def test_every_commit_carries_the_map_even_empty(table: Table) -> None:
    instant = writer(table).insert(rows(["a"]))
    assert instant is not None
    extra = table.commit_metadata(instant).extra
    assert extra[TXNS_KEY] == "{}" and TXN_APP_ID_KEY not in extra


def test_a_replayed_version_commits_nothing_and_leaves_the_table_as_it_was(table: Table) -> None:
    first = writer(table, "ingest", 1).upsert(rows(["a", "b"], value="first"))
    before_rows, before_completed, before_files = exact_rows(table), completed(table), files(table)
    assert first is not None and before_completed == [first.file_name]

    replay = writer(table, "ingest", 1)
    again = replay.upsert(rows(["a", "c"], value="replayed"))

    assert again == first  # the instant that committed this version, as the original write returned it
    assert replay.refused is not None and replay.records == 0
    assert replay.refused.summary == (
        f"application ingest version 1 was already committed by instant {first.requested_time}"
    )
    assert completed(table) == before_completed
    assert files(table) == before_files  # not even a claim is left behind
    assert exact_rows(table) == before_rows
    assert [r["id"] for r in before_rows] == ["a", "b"] and {r["value"] for r in before_rows} == {"first"}


def test_an_older_version_is_refused_and_a_newer_one_commits(table: Table) -> None:
    writer(table, "ingest", 1).insert(rows(["a"]))
    five = writer(table, "ingest", 5).insert(rows(["b"]))
    assert five is not None
    before = completed(table)

    older = writer(table, "ingest", 3)
    assert older.insert(rows(["c"])) == five
    assert older.refused is not None and older.refused.summary == (
        f"application ingest version 3 is older than its version 5, already committed by instant "
        f"{five.requested_time}"
    )
    assert completed(table) == before

    newer = writer(table, "ingest", 6)
    six = newer.insert(rows(["d"]))
    assert six is not None and newer.refused is None
    assert completed(table) == [*before, six.file_name]
    assert [r["id"] for r in exact_rows(table)] == ["a", "b", "d"]
    assert last_version(table, "ingest") == Committed(6, six.requested_time)


def test_other_applications_survive_commits_without_txn_and_archival(table: Table) -> None:
    a = writer(table, "app-a", 4).upsert(rows(["a"]))
    b = writer(table, "app-b", 9).upsert(rows(["b"]))
    assert a is not None and b is not None
    plain = writer(table)
    for n in range(8):
        plain.upsert(rows([f"x{n}"], part=f"p{n % 3}"))
    done = archive(table, service_lock(table), keep_min=2, keep_max=3)
    assert done is not None and a.requested_time in done.instants and b.requested_time in done.instants
    assert table.timeline().get(a.requested_time) is None  # archived
    assert last_version(table, "app-a") == Committed(4, a.requested_time)
    assert last_version(table, "app-b") == Committed(9, b.requested_time)

    before_rows, before_completed = exact_rows(table), completed(table)
    replay = writer(table, "app-a", 4)
    assert replay.upsert(rows(["a"], value="again")) == a  # found in the archive
    assert replay.refused is not None
    assert completed(table) == before_completed and exact_rows(table) == before_rows


def _foreign_commit(table: Table, requested: str, completion: str) -> None:
    """A commit of another Hudi writer: no cowrite.txns key."""
    table.storage.write(f"{TIMELINE_DIR}/{requested}.commit.requested", b"")
    done = Instant(requested, Action.COMMIT, State.COMPLETED, completion)
    table.storage.write(table.instant_path(done), CommitMetadata("upsert").to_bytes(Action.COMMIT))


@pytest.fixture
def reads(table: Table, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The completed commit files of ``table`` read from now on (names, in order)."""
    seen: list[str] = []
    original = table.storage.read

    def counting(path: str) -> bytes:
        name = path.rsplit("/", 1)[-1]
        if path.startswith(TIMELINE_DIR) and "_" in name and name.endswith(("commit", "replacecommit")):
            seen.append(name)
        return original(path)

    monkeypatch.setattr(table.storage, "read", counting)
    yield seen


def test_the_lookup_reads_one_commit_file_of_a_long_timeline(table: Table, reads: list[str]) -> None:
    first = writer(table, "early", 1).upsert(rows(["e"]))
    plain = writer(table)
    for n in range(40):
        plain.upsert(rows([f"k{n}"], part=f"p{n % 4}"))
    newest = table.timeline().data_commits().last
    assert first is not None and newest is not None
    process.forget()
    reads.clear()

    assert last_version(table, "early") == Committed(1, first.requested_time)
    assert reads == [newest.file_name]


def test_the_lookup_walks_back_past_commits_of_other_writers(table: Table, reads: list[str]) -> None:
    mine = writer(table, "ingest", 2).upsert(rows(["a"]))
    assert mine is not None and mine.completion_time is not None
    later = str(int(mine.completion_time) + 10)
    _foreign_commit(table, later, str(int(later) + 1))
    process.forget()
    reads.clear()

    assert last_version(table, "ingest") == Committed(2, mine.requested_time)
    assert reads == [f"{later}_{int(later) + 1}.commit", mine.file_name]
    # and the next cowrite commit carries the map forward again
    nxt = writer(table).upsert(rows(["b"]))
    assert nxt is not None
    assert json.loads(table.commit_metadata(nxt).extra[TXNS_KEY]) == {
        "ingest": {"version": 2, "instant": mine.requested_time}
    }


def test_a_version_committed_meanwhile_by_another_process_aborts_under_the_lock(table: Table) -> None:
    """Both writes pass the check at begin; the second to take the lock finds the version committed."""
    rival: list[Instant | None] = []

    def commit_rival_first(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.WRITTEN and not rival:
            rival.append(None)
            rival[0] = writer(table, "ingest", 7).upsert(rows(["r"], value="rival"))

    late = writer(table, "ingest", 7)
    with observe(commit_rival_first):
        result = late.upsert(rows(["l"], value="late"))

    winner = rival[0]
    assert winner is not None and result == winner
    assert late.refused is not None and late.refused.committed_by == winner.requested_time
    assert completed(table) == [winner.file_name]
    assert exact_rows(table) == [{"id": "r", "part": "p0", "ts": 1, "value": "rival"}]
    loser = late.refused.instant
    # its base files are deleted; its pending instant stays for the lazy rollback, marked aborted
    assert not [f for f in files(table) if f.endswith(".parquet") and loser in f]
    assert (pending := table.timeline().get(loser)) is not None and not pending.is_completed


def test_the_map_includes_what_completed_while_a_commit_waited_for_the_lock(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit whose payload was encoded before the lock, and whose map changed meanwhile, publishes
    the map it finds under the lock."""
    config = table.config
    lock = lock_for(table.storage, config, LockHolder(), HeartbeatPolicy.from_config(config), table.name)
    acquire_next = lock.acquire_next
    other: list[Instant | None] = []

    def acquire_after_another_commit(turn: int | None) -> bool:
        if not other:
            other.append(writer(table, "app-y", 1).upsert(rows(["y"])))
        return acquire_next(turn)

    monkeypatch.setattr(lock, "acquire_next", acquire_after_another_commit)
    mine = LocalWriter(table, WriteOptions(config=config, lock=lock, txn=Txn("app-x", 1))).upsert(rows(["x"]))
    assert mine is not None and other[0] is not None
    assert json.loads(table.commit_metadata(mine).extra[TXNS_KEY]) == {
        "app-x": {"version": 1, "instant": mine.requested_time},
        "app-y": {"version": 1, "instant": other[0].requested_time},
    }
    assert last_version(table, "app-y") == Committed(1, other[0].requested_time)


def test_a_corrupt_map_is_reported_not_forgotten(table: Table) -> None:
    mine = writer(table, "ingest", 1).upsert(rows(["a"]))
    assert mine is not None and mine.completion_time is not None
    later = str(int(mine.completion_time) + 10)
    table.storage.write(f"{TIMELINE_DIR}/{later}.commit.requested", b"")
    done = Instant(later, Action.COMMIT, State.COMPLETED, str(int(later) + 1))
    bad = CommitMetadata("upsert", extra={TXNS_KEY: '{"ingest": 3}'})
    table.storage.write(table.instant_path(done), bad.to_bytes(Action.COMMIT))
    with pytest.raises(CorruptTimelineError, match=TXNS_KEY):
        writer(table, "ingest", 2).upsert(rows(["b"]))


@pytest.mark.parametrize(
    ("app_id", "version", "message"),
    [
        ("", 1, "non-empty string"),
        ("  ", 1, "non-empty string"),
        ("ingest", -1, "non-negative integer"),
        ("ingest", True, "non-negative integer"),
        ("ingest", 1.5, "non-negative integer"),
    ],
)
def test_bad_txn_values_are_refused(app_id: Any, version: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Txn(app_id, version)


@pytest.mark.parametrize(
    ("app_id", "version", "message"),
    [
        ("ingest", "x", "txnVersion must be a non-negative integer, not 'x'"),
        ("ingest", "-2", "txnVersion must be a non-negative integer"),
        ("ingest", None, "txnAppId and txnVersion go together: txnVersion is missing"),
        (None, "3", "txnAppId is missing"),
    ],
)
def test_txn_options_are_parsed_strictly(app_id: str | None, version: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Txn.parse(app_id, version, ("txnAppId", "txnVersion"))
    assert Txn.parse(None, None, ("txnAppId", "txnVersion")) is None
    assert Txn.parse("ingest", " 12 ", ("txnAppId", "txnVersion")) == Txn("ingest", 12)


def test_the_refusal_is_a_commit_failure_naming_the_table_and_both_instants() -> None:
    error = TxnAlreadyCommittedError("t", "20260101000000001", "ingest", 1, 1, "20260101000000000")
    assert isinstance(error, CommitFailedError)  # nothing committed
    assert str(error) == (
        "application ingest version 1 was already committed by instant 20260101000000000 on table t: "
        "instant 20260101000000001 committed nothing (a retry would not either)"
    )


def test_committed_txns_round_trips() -> None:
    txns = CommittedTxns({"b": Committed(2, "20260101000000000")}).with_commit(
        Txn("a", 0), "20260101000000001"
    )
    assert CommittedTxns.from_json(txns.to_json(), "p") == txns
    assert txns.with_commit(None, "20260101000000002") == txns
