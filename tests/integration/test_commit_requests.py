"""What a commit costs on S3 under the table lock, counted request by request at a proxy in a process of
its own, and what a writer may skip when the lock's notes tell it what the turns since its begin
published — and that it still sees every conflict, and lists the timeline whenever a note is missing.

Each writer signs with an access key of its own, so the proxy tells whose request it answered. Tables
are read back with cowrite and hudi-rs after every scenario.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa
import pytest
from support import hudi_rs
from support.hudi_rs import rows as as_rows
from support.request_counts import ProxyProcess, Request, sequential, what
from support.servers import S3Server
from support.tables import new_table, rows

from cowrite import process
from cowrite.cleaner import archive, service_lock
from cowrite.cleaner.clean import clean
from cowrite.errors import StorageError, WriteConflictError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import EarlyListing, FileSystemView
from cowrite.format.instant import Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR, Timeline
from cowrite.local import read
from cowrite.local import writer as local_writer
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.locks import filesystem
from cowrite.protocol.locks.base import LockHolder
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.protocol.locks.lock_files import LOCK_DIR, is_release, scan
from cowrite.protocol.sketch import MARK
from cowrite.protocol.transaction import WriteOptions
from cowrite.protocol.txn import TXNS_KEY, Txn
from cowrite.steps import Step, observe
from cowrite.storage.together import finish_background

NO_RETRY = {keys.RETRIES_ON_CONFLICT.key: "0"}


def through(table: Table, proxy: ProxyProcess, client: str) -> Table:
    """``table`` opened again through the proxy, signing with the access key ``client``."""
    options: dict[str, Any] = {
        "key": client,
        "secret": "secret",
        "client_kwargs": {"endpoint_url": proxy.endpoint_url, "region_name": "us-east-1"},
    }
    return Table.load(table.uri, **options)


def critical_section(requests: list[Request], client: str) -> list[tuple[str, str]]:
    """What ``client`` asked from its lock's acquisition (the last ``.acquired`` it created) to its
    release, in the order the answers came."""
    mine = [r for r in requests if r.client == client]
    taken = max(i for i, r in enumerate(mine) if r.kind == "PUT" and r.path.endswith(".acquired"))
    released = next(
        i for i, r in enumerate(mine) if r.kind == "PUT" and is_release(r.path.rsplit("/", 1)[-1])
    )
    return [what(r) for r in mine[taken : released + 1]]


@pytest.fixture(autouse=True)
def fresh_listings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing collects lock files here: every listing of the lock directory counts as fresh however slow
    the machine, so what is counted is the protocol's requests, not the machine's speed."""
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 60.0)


@pytest.fixture
def table(s3_server: S3Server) -> Table:
    created = new_table(
        s3_server.new_uri("commit-requests"),
        properties=NO_RETRY,
        **s3_server.storage_options(),
    )
    LocalWriter(created).insert(rows(["a", "b"], part="p0"))  # the file group both writers touch
    return created


def test_a_lone_writer_holds_the_lock_for_three_round_trips(table: Table, proxy: ProxyProcess) -> None:
    """Nobody took a turn since its begin: the writer takes the next turn with one try beside its file,
    from the turn it noted at its begin, and publishes without listing the timeline or the lock directory
    again: acquire, the completed file, and the lock's note of it, which releases the lock. (The file, the
    plan and the timeline's listing go at once with the acquire: the write goes ahead of that listing.)"""
    writer = LocalWriter(through(table, proxy, "alone"))
    writer.upsert(rows(["a"], ts=2, value="first"))  # this process's first commit reads what it needs
    proxy.reset()
    writer.upsert(rows(["b"], ts=2, value="second"))
    mine = [r for r in proxy.reset() if r.client == "alone"]
    [acquired] = [r for r in mine if r.kind == "PUT" and r.path.endswith(".acquired")]
    beside = [
        r for r in mine if r.path.endswith((".parquet", ".inflight")) or what(r) == ("LIST", "timeline")
    ]
    after = [r for r in mine if r.began >= acquired.ended and r not in beside]
    assert [what(r) for r in after] == [("PUT", "timeline"), ("PUT", "locks")]
    assert after[0].path.endswith(".commit") and is_release(after[1].path.rsplit("/", 1)[-1])
    assert sequential([acquired, *after]) == 3
    expected = [{"id": "a", "part": "p0", "ts": 2, "value": "first"},
                {"id": "b", "part": "p0", "ts": 2, "value": "second"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_writer_reads_only_the_commits_it_builds_on_whatever_the_history(
    table: Table, proxy: ProxyProcess
) -> None:
    """A process's first upsert into p0, after a dozen commits to another partition: it reads the commit
    that wrote p0's file group and the latest one (the table's schema), none of the rest of the history,
    which costs a read each in every new process before the write could stop growing with it."""
    history = [LocalWriter(table).upsert(rows([f"h{n}"], part="elsewhere")) for n in range(12)]
    [built_on] = [i for i in table.timeline().data_commits() if i.requested_time < history[0].requested_time]
    process.forget()  # what a new writer process knows
    LocalWriter(through(table, proxy, "new")).upsert(rows(["a"], ts=2, value="again"))
    reads = [unquote(r.path).rsplit("/", 1)[-1] for r in proxy.reset() if what(r) == ("GET", "timeline")]
    assert sorted(reads) == sorted([built_on.file_name, history[-1].file_name])
    snapshot = as_rows(read.snapshot(table))
    assert [r for r in snapshot if r["part"] == "p0"] == [
        {"id": "a", "part": "p0", "ts": 2, "value": "again"},
        {"id": "b", "part": "p0", "ts": 1, "value": "v"},
    ]
    assert len(snapshot) == 14 and snapshot == hudi_rs.snapshot(table.uri, table.storage.options)


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead-of-the-listing", "after-the-listing"])
def test_a_last_file_that_fails_beside_the_lock_aborts_and_releases_the_lock(
    table: Table, proxy: ProxyProcess, monkeypatch: pytest.MonkeyPatch, ahead: bool
) -> None:
    """The lone writer takes the lock's next turn beside its last file, and that file's write fails: the
    write fails with the storage's error, publishes nothing, and releases the turn at once rather than
    leave it to expire; the next write takes the turn after it. Written ahead of the listing after its
    claim (a process's write of what it wrote last), the claim, not known to stand, is withdrawn at once;
    written after that listing (a writer's first write), the write aborts, its instant left failed for
    the rollback."""
    first = LocalWriter(through(table, proxy, "alone"))
    first.upsert(rows(["a"], ts=2, value="first"))
    writer = first if ahead else LocalWriter(through(table, proxy, "alone"))
    before = scan(table.storage).highest

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise StorageError("the base file could not be written")

    monkeypatch.setattr(local_writer, "write_file_group", failing)
    with pytest.raises(StorageError, match="could not be written"):
        writer.upsert(rows(["b"], ts=3, value="lost"))
    proxy.reset()  # the release, made in the background
    files = scan(table.storage)
    assert files.highest == before + 1 and before + 1 in files.acquired and not files.is_held(before + 1)
    assert [i.state for i in table.timeline().pending()] == ([] if ahead else [State.INFLIGHT])
    monkeypatch.undo()
    writer.upsert(rows(["b"], ts=4, value="second"))
    assert scan(table.storage).highest == before + 2
    expected = [{"id": "a", "part": "p0", "ts": 2, "value": "first"},
                {"id": "b", "part": "p0", "ts": 4, "value": "second"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


@pytest.fixture
def slow_proxy(s3_server: S3Server) -> Iterator[ProxyProcess]:
    """The S3 server behind a proxy that holds each request 50 ms: two requests made at once are then in
    flight together, which an undelayed proxy may answer one before the other has left."""
    with ProxyProcess(s3_server.endpoint_url, delay=0.05) as running:
        yield running


def test_a_lone_writer_commits_in_three_round_trips(table: Table, slow_proxy: ProxyProcess) -> None:
    """A process's next upsert, nobody else writing: no listing before its claim (its input is held to the
    schema of the timeline it listed last time) or beside it (the lock's turn is the one after its last,
    taken just now; the partition's files it knows from its last write). Its plan, drafted from what the
    process knew, goes with the claim, and the write goes ahead: the timeline's listing, the plan again as
    ``.inflight``, the file and one try for the lock's next turn at once, then the completed file. The
    upsert returns once its commit is complete, and the release follows in the background. The claim's
    millisecond is even (a replacecommit's is odd)."""
    writer = LocalWriter(through(table, slow_proxy, "alone"))
    writer.upsert(rows(["a"], ts=2, value="first"))
    slow_proxy.reset()
    turn = scan(table.storage).highest
    assert (turn + 1) % filesystem._KEPT_ON_RELEASE  # not a turn that collects old lock files
    done = writer.upsert(rows(["b"], ts=2, value="second"))
    returned = time.time()
    mine = [r for r in slow_proxy.reset() if r.client == "alone"]
    first = [what(r) for r in mine if r.began < min(r.ended for r in mine)]
    assert first == [("PUT", "timeline")]
    [release] = [r for r in mine if r.ended > returned]
    assert ".published." in release.path  # the note of the commit ends the turn
    assert sequential(mine) == 4 and sequential([r for r in mine if r is not release]) == 3
    [listing] = [r for r in mine if what(r) == ("LIST", "timeline")]
    beside = [r for r in mine if r.path.endswith((".inflight", ".parquet", ".acquired"))]
    assert len(beside) == 3 and all(r.began < listing.ended and listing.began < r.ended for r in beside)
    assert Counter(what(r) for r in mine) == {
        ("PUT", "timeline"): 3, ("LIST", "timeline"): 1, ("PUT", "p0"): 1, ("PUT", "locks"): 2,
    }  # fmt: skip
    assert f"lock{turn + 1}.acquired" in unquote(next(r.path for r in mine if r.path.endswith(".acquired")))
    claim = table.instant_path(Instant(done.requested_time, done.action, State.REQUESTED))
    carried = CommitMetadata.from_bytes(table.storage.read(claim), claim)
    assert [s.path for s in carried.write_stats] == [s.path for s in table.commit_metadata(done).write_stats]
    assert int(done.requested_time) % 2 == 0
    expected = [{"id": "a", "part": "p0", "ts": 2, "value": "first"},
                {"id": "b", "part": "p0", "ts": 2, "value": "second"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_claim_that_went_ahead_and_does_not_stand_takes_its_file_and_turn_back_first(
    table: Table, proxy: ProxyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that goes ahead of the listing after its claim has written its file, and taken the lock's
    next turn, when that listing shows another action's claim at its time (here a clean's, made just
    before). Withdrawing, it deletes the file first, then its plan and its claim — the file carries the
    claim's time, which the other action may complete at — and gives the turn back at once; it claims
    again, plans after that listing and commits."""
    writer = LocalWriter(through(table, proxy, "writer"))
    writer.upsert(rows(["z"], ts=1, value="writer"))
    turn = scan(table.storage).highest
    create, clashes = writer.table.storage.create_if_absent, []

    def a_clean_claims_the_same_time(path: str, data: bytes) -> bool:
        made = create(path, data)
        if made and path.endswith(".commit.requested") and not clashes:
            clashes.append(path.rsplit("/", 1)[-1].split(".")[0])
            create(f"{TIMELINE_DIR}/{clashes[0]}.clean.requested", b"")
        return made

    monkeypatch.setattr(writer.table.storage, "create_if_absent", a_clean_claims_the_same_time)
    proxy.reset()
    done = writer.upsert(rows(["c"], ts=2, value="writer"))
    [clash] = clashes
    assert done.requested_time > clash
    mine = [r for r in proxy.reset() if r.client == "writer"]
    gone = [unquote(r.path).rsplit("/", 1)[-1] for r in mine if r.kind in ("DELETE", "POST")]
    assert gone[0].endswith(f"_{clash}.parquet")  # the file first, then the plan and the claim
    assert gone[1:] == [f"{clash}.inflight", f"{clash}.commit.requested"]
    assert [f.path for f in table.storage.list("p0") if clash in f.path] == []
    files = scan(table.storage)
    assert turn + 1 in files.release_files and files.highest == turn + 2  # given back, then taken again
    assert [i.file_name for i in table.timeline().pending()] == [f"{clash}.clean.requested"]
    expected = [{"id": "a", "part": "p0", "ts": 1, "value": "v"},
                {"id": "b", "part": "p0", "ts": 1, "value": "v"},
                {"id": "c", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "z", "part": "p0", "ts": 1, "value": "writer"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_listing_beside_the_claim_that_missed_a_commit_is_made_again(
    table: Table, proxy: ProxyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rival's commit completes between the partition listing a writer made beside its claim and the
    timeline it lists after: the timeline shows the commit, the listing lacks its file. The writer lists
    the partition again and builds on that file — built on the listing, it would drop the rival's key.
    Its next write lists no partition: it knows p0's files from that listing, and nobody committed since."""
    writer = LocalWriter(through(table, proxy, "writer"))
    rival = LocalWriter(through(table, proxy, "rival"))
    writer.upsert(rows(["z"], part="p9"))
    take = EarlyListing.take
    done: list[Instant | None] = []

    def take_then_rival_commits(*args: Any) -> EarlyListing:
        listing = take(*args)
        if not done:  # the rival lists beside its claim too
            done.append(None)
            done[0] = rival.upsert(rows(["k", "r"], ts=1, value="rival"))  # into p0's one file group
        return listing

    monkeypatch.setattr(EarlyListing, "take", take_then_rival_commits)
    proxy.reset()
    writer.upsert(rows(["k", "c"], ts=2, value="writer"))
    assert done[0] is not None
    expected = [{"id": "a", "part": "p0", "ts": 1, "value": "v"},
                {"id": "b", "part": "p0", "ts": 1, "value": "v"},
                {"id": "c", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "k", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "r", "part": "p0", "ts": 1, "value": "rival"},
                {"id": "z", "part": "p9", "ts": 1, "value": "v"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)
    mine = [r for r in proxy.reset() if r.client == "writer"]
    assert len([r for r in mine if what(r) == ("LIST", "p0")]) == 2
    # the rival's commit, of a later time, completed meanwhile: the writer withdrew its first claim, the
    # plan made beside its listing first, and claimed again (that claim plans after its listing: the draft
    # was for the first)
    withdrawn = [r.path.rsplit("/", 1)[-1] for r in mine if r.kind == "DELETE"]
    assert len(withdrawn) == 2 and withdrawn[0].endswith(".inflight") and withdrawn[1].endswith(".requested")
    assert [i for i in table.timeline() if not i.is_completed] == []
    writer.upsert(rows(["d"], ts=2, value="writer"))
    mine = [r for r in proxy.reset() if r.client == "writer"]
    assert [what(r) for r in mine if r.kind in ("LIST", "GET")] == [("LIST", "timeline")]
    expected.insert(3, {"id": "d", "part": "p0", "ts": 2, "value": "writer"})
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_plan_made_before_the_listing_is_made_again_when_the_listing_shows_a_new_commit(
    table: Table, proxy: ProxyProcess
) -> None:
    """A rival commits into the writer's file group after the writer last looked at the timeline. The
    writer's plan, made with its claim from the timeline it knew and the partition's files it knew from
    its last write, does not stand: the listing after the claim shows the rival's commit. Its file,
    written ahead of that listing, is no base of the commit: the writer lists the partition, plans again
    on what it listed, writes the plan and the file again, and builds on the rival's file — on the first
    plan, it would drop the rival's key."""
    writer = LocalWriter(through(table, proxy, "writer"))
    rival = LocalWriter(through(table, proxy, "rival"))
    writer.upsert(rows(["z"], ts=1, value="writer"))  # into p0's one file group, as the others
    rival.upsert(rows(["k"], ts=1, value="rival"))
    proxy.reset()
    done = writer.upsert(rows(["c"], ts=2, value="writer"))
    expected = [{"id": "a", "part": "p0", "ts": 1, "value": "v"},
                {"id": "b", "part": "p0", "ts": 1, "value": "v"},
                {"id": "c", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "k", "part": "p0", "ts": 1, "value": "rival"},
                {"id": "z", "part": "p0", "ts": 1, "value": "writer"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)
    mine = [r for r in proxy.reset() if r.client == "writer"]
    [listing] = [r for r in mine if what(r) == ("LIST", "timeline")]
    [partition] = [r for r in mine if what(r) == ("LIST", "p0")]
    _, again = [r for r in mine if r.path.endswith(".inflight")]
    assert partition.began >= listing.ended and again.began >= partition.ended
    ahead, written = [r for r in mine if what(r) == ("PUT", "p0")]
    assert ahead.ended <= partition.began and written.began >= again.ended
    # of this instant's files, only those its commit names are left
    files = [f.path for f in table.storage.list("p0") if done.requested_time in f.path]
    assert files == [s.path for s in table.commit_metadata(done).write_stats]
    # the plan in place names what the commit wrote
    inflight = table.instant_path(Instant(done.requested_time, done.action, State.INFLIGHT))
    plan = CommitMetadata.from_bytes(table.storage.read(inflight), inflight)
    assert [s.path for s in plan.write_stats] == [s.path for s in table.commit_metadata(done).write_stats]


def test_a_writer_lists_no_partition_when_the_notes_say_the_commits_since_left_it_alone(
    table: Table, proxy: ProxyProcess
) -> None:
    """A rival commits to another partition after the writer's last write, and a listing of the lock
    directory in the writer's process (a waiter's, say) shows the rival's note: its sketch says the commit
    touched none of p0's file groups, inserted no key into p0 and carried the map and schema the writer
    knows. The writer's next upsert into p0 lists no partition and reads no commit. A rival that then
    updates a key in p0's file group is not left out: the writer lists p0 again and builds on the rival's
    file (built on what it knew, it would take the rival's update back)."""
    writer = LocalWriter(through(table, proxy, "writer"))
    rival = LocalWriter(through(table, proxy, "rival"))
    writer.upsert(rows(["c"], ts=2, value="writer"))  # the writer knows p0's files from here on

    def rival_commits(data: Any) -> None:
        rival.upsert(data)
        finish_background()  # its release: the note
        scan(writer.table.storage)  # the writer's process sees it
        proxy.reset()

    rival_commits(rows(["r"], part="p9", value="rival"))
    writer.upsert(rows(["d"], ts=2, value="writer"))
    mine = [r for r in proxy.reset() if r.client == "writer"]
    assert [what(r) for r in mine if r.kind in ("LIST", "GET")] == [("LIST", "timeline")]
    rival_commits(rows(["a"], ts=3, value="rival"))  # into p0's file group
    writer.upsert(rows(["b"], ts=3, value="writer"))
    mine = [r for r in proxy.reset() if r.client == "writer"]
    assert [what(r) for r in mine if r.kind == "LIST"] == [("LIST", "timeline"), ("LIST", "p0")]
    expected = [{"id": "a", "part": "p0", "ts": 3, "value": "rival"},
                {"id": "b", "part": "p0", "ts": 3, "value": "writer"},
                {"id": "c", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "d", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "r", "part": "p9", "ts": 1, "value": "rival"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_writer_reads_the_commits_since_that_no_note_sketched_rather_than_list_and_plan_again(
    table: Table, proxy: ProxyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the writer's process knows no note of the rival's commit: with many writers a note is
    made after the commit, in the background, and a listing of the lock directory made between the two
    shows the commit's turn still held. The writer reads the rival's commit instead: it wrote nothing in
    p0, so the plan the writer made with its claim stands, and it neither lists p0 nor writes its plan
    again. A rival commit into p0's file group, read the same way, is not left out: the writer lists p0,
    plans again, and builds on the rival's file."""
    monkeypatch.setattr(local_writer, "noted_sketches", lambda storage, commits: dict.fromkeys(commits))
    writer = LocalWriter(through(table, proxy, "writer"))
    rival = LocalWriter(through(table, proxy, "rival"))
    writer.upsert(rows(["c"], ts=2, value="writer"))  # the writer knows p0's files from here on
    rival.upsert(rows(["r"], part="p9", value="rival"))
    proxy.reset()
    writer.upsert(rows(["d"], ts=2, value="writer"))
    mine = [what(r) for r in proxy.reset() if r.client == "writer"]
    reads = [w for w in mine if w[0] in ("LIST", "GET") and w[1] != "locks"]
    assert reads == [("LIST", "timeline"), ("GET", "timeline")]
    # the claim, the plan once, the completed file; the file, written ahead of the listing, once
    assert mine.count(("PUT", "timeline")) == 3 and mine.count(("PUT", "p0")) == 1
    rival.upsert(rows(["a"], ts=3, value="rival"))  # into p0's file group
    proxy.reset()
    writer.upsert(rows(["b"], ts=3, value="writer"))
    mine = [what(r) for r in proxy.reset() if r.client == "writer"]
    reads = [w for w in mine if w[0] in ("LIST", "GET") and w[1] != "locks"]
    assert reads[:3] == [("LIST", "timeline"), ("GET", "timeline"), ("LIST", "p0")]  # then p0's files
    assert mine.count(("PUT", "timeline")) == 4  # the plan again, made on the listing of p0
    expected = [{"id": "a", "part": "p0", "ts": 3, "value": "rival"},
                {"id": "b", "part": "p0", "ts": 3, "value": "writer"},
                {"id": "c", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "d", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "r", "part": "p9", "ts": 1, "value": "rival"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_plan_stands_on_a_commit_its_process_listed_that_left_its_partition_alone(
    table: Table, proxy: ProxyProcess
) -> None:
    """A rival commits to another partition, and the writer's process lists the table's timeline (it reads
    the table, say; a holder of the lock publishing a waiter's commit knows of it the same way): its
    timeline holds the rival's commit, but the files of p0 it keeps from its last write do not name it.
    Its next upsert into p0 lists p0 beside its claim and plans on that timeline; the rival's note says
    the commit left p0 alone, so after the timeline's listing that plan stands, though the files the
    listing's view of p0 builds on name no such commit: the writer writes its plan and its file once."""
    writer = LocalWriter(through(table, proxy, "writer"))
    rival = LocalWriter(through(table, proxy, "rival"))
    writer.upsert(rows(["c"], ts=2, value="writer"))  # the writer knows p0's files from here on
    rival.upsert(rows(["r"], part="p9", value="rival"))
    finish_background()  # its note
    scan(writer.table.storage)  # which the writer's process sees
    writer.table.timeline()
    proxy.reset()
    writer.upsert(rows(["d"], ts=2, value="writer"))
    mine = [what(r) for r in proxy.reset() if r.client == "writer"]
    reads = [w for w in mine if w[0] in ("LIST", "GET") and w[1] != "locks"]
    assert reads == [("LIST", "p0"), ("LIST", "timeline")]  # p0 beside the claim, then the timeline
    assert mine.count(("PUT", "timeline")) == 3 and mine.count(("PUT", "p0")) == 1  # the plan, the file: once
    expected = [{"id": "a", "part": "p0", "ts": 1, "value": "v"},
                {"id": "b", "part": "p0", "ts": 1, "value": "v"},
                {"id": "c", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "d", "part": "p0", "ts": 2, "value": "writer"},
                {"id": "r", "part": "p9", "ts": 1, "value": "rival"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_writer_learns_what_was_published_meanwhile_from_the_notes_and_still_sees_the_conflict(
    table: Table, slow_proxy: ProxyProcess
) -> None:
    """While A writes, B commits to the same file group and notes it with the lock. A, whose begin
    preceded B's turn, takes the turn after B's without listing the timeline: it reads B's commit, which
    the note names, finds the conflict, publishes nothing and notes that. (A writer that waited for the
    lock has read such commits while it waited.)"""
    proxy = slow_proxy
    slow, fast = LocalWriter(through(table, proxy, "slow")), LocalWriter(through(table, proxy, "fast"))
    slow.upsert(rows(["z"], part="p9"))  # each writer's first commit reads what it needs
    fast.upsert(rows(["y"], part="p8"))

    done: list[Instant | None] = []

    def meanwhile(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.PLANNED and not done:
            with observe(lambda *_: None):
                done.append(fast.upsert(rows(["a"], ts=3, value="fast")))

    proxy.reset()
    with observe(meanwhile), pytest.raises(WriteConflictError):
        slow.upsert(rows(["a"], ts=4, value="slow"))
    # the lock, and the release, a note that this turn published nothing (later holders need not list
    # for it); B's commit, which B's note names, was read beside taking the lock (one round trip for
    # both); the abort marks the heartbeat while the release is on its way
    requests = proxy.reset()
    section = critical_section(requests, "slow")
    expected = [("PUT", "locks"), ("PUT", "locks")]
    assert [r for r in section if r not in [("GET", "timeline"), ("PUT", ".heartbeat")]] == expected
    mine = [r for r in requests if r.client == "slow"]
    # its one try for the next turn, beside its file, in vain (B took it); then, once it listed, the one after
    tries = [r for r in mine if r.kind == "PUT" and r.path.endswith(".acquired")]
    assert len(tries) == 2
    taking = tries[-1]
    assert done[0] is not None
    reading = [r for r in mine if r.kind == "GET" and unquote(r.path).endswith(done[0].file_name)]
    assert len(reading) == 1 and reading[0].began < taking.ended and taking.began < reading[0].ended
    assert sum(name.endswith(".published.nothing") for name in table.storage.names(LOCK_DIR)) == 1
    expected = [{"id": "a", "part": "p0", "ts": 3, "value": "fast"}, {"id": "b", "part": "p0", "ts": 1,
                "value": "v"}, {"id": "y", "part": "p8", "ts": 1, "value": "v"},
                {"id": "z", "part": "p9", "ts": 1, "value": "v"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


@pytest.mark.parametrize("rival", ["another partition", "the column both add", "an application's version"])
def test_a_writer_leaves_unread_the_commits_whose_sketch_rules_them_out(
    table: Table, slow_proxy: ProxyProcess, rival: str
) -> None:
    """While A writes, B commits and notes its commit with a sketch of it. A takes the turn after B's
    without listing the timeline. B's sketch rules out every check when B wrote another partition, also
    when both added the same column (B made the table's schema the one A records): A commits without
    reading B's commit, and no commit of the schema follows. When B carries an application's version, the
    map of versions A must carry forward changed: A reads B's commit, and its own carries B's version."""
    proxy = slow_proxy
    slow, fast = LocalWriter(through(table, proxy, "slow")), LocalWriter(through(table, proxy, "fast"))
    slow.upsert(rows(["z"], part="p9"))  # each writer's first commit reads what it needs
    fast.upsert(rows(["y"], part="p8"))
    if rival == "an application's version":
        fast = LocalWriter(
            through(table, proxy, "fast"), WriteOptions(config=table.config, txn=Txn("app", 7))
        )
    added = rival == "the column both add"

    def upsert(ids: list[str], **kwargs: Any) -> pa.Table:
        data = rows(ids, **kwargs)
        return data.append_column("note", pa.array([kwargs["value"]] * len(ids))) if added else data

    done: list[Instant | None] = []

    def meanwhile(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.PLANNED and not done:
            with observe(lambda *_: None):
                done.append(fast.upsert(upsert(["y"], part="p8", ts=3, value="fast")))

    proxy.reset()
    with observe(meanwhile):
        mine = slow.upsert(upsert(["a"], ts=4, value="slow"))
    assert done[0] is not None and mine is not None
    read_b = [r for r in proxy.reset() if r.client == "slow" and unquote(r.path).endswith(done[0].file_name)]
    assert len(read_b) == (rival == "an application's version")
    carried = table.commit_metadata(mine).extra[TXNS_KEY]
    assert ('"app"' in carried) == (rival == "an application's version")
    assert [i.file_name for i in table.timeline()][-2:] == sorted([done[0].file_name, mine.file_name])
    notes = [n for n in table.storage.names(LOCK_DIR) if ".published." in n and "nothing" not in n]
    assert {n.split(".published.")[1].partition(MARK)[0] for n in notes} >= {
        done[0].file_name,
        mine.file_name,
    }
    assert all(MARK in n for n in notes)
    expected = [{"id": "a", "part": "p0", "ts": 4, "value": "slow"}, {"id": "b", "part": "p0", "ts": 1,
                "value": "v"}, {"id": "y", "part": "p8", "ts": 3, "value": "fast"},
                {"id": "z", "part": "p9", "ts": 1, "value": "v"}]  # fmt: skip
    if added:
        expected = [{**row, "note": row["value"] if row["ts"] > 1 else None} for row in expected]
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


@pytest.mark.parametrize("between", ["a service's turn", "a note naming no completed file"])
def test_a_writer_lists_the_timeline_under_the_lock_when_a_turn_left_no_usable_note(
    table: Table, proxy: ProxyProcess, between: str
) -> None:
    """A turn that noted nothing (a table service's, an expired holder's) or whose note names a commit
    that is not there (its holder died between the two) tells nothing: the writer lists the timeline under
    the lock and asks whether it still holds it, as it always did, and commits. A rival's commit before
    that turn, in another partition, it still leaves unread: the rival's note, which the writer's listing
    of the lock directory showed, sketches it."""
    writer = LocalWriter(through(table, proxy, "writer"))
    writer.upsert(rows(["z"], part="p9"))
    rival = LocalWriter(through(table, proxy, "rival"))
    rival.upsert(rows(["y"], part="p8"))

    done: list[Instant | None] = []

    def meanwhile(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is not Step.PLANNED or done:
            return
        with observe(lambda *_: None):
            done.append(rival.upsert(rows(["y"], part="p8", ts=3, value="rival")))
        if between == "a service's turn":
            with service_lock(table, "cleaner"):
                pass
        else:
            policy = HeartbeatPolicy.from_config(table.config)
            lock = FileSystemLock(table.storage, LockHolder("dead"), policy)
            lock.acquire(timeout=5)
            lock.note_published("20261126000000000_20261126000000001.commit")
            lock.release()

    proxy.reset()
    with observe(meanwhile):
        writer.upsert(rows(["a"], ts=5, value="after"))
    requests = proxy.reset()
    section = critical_section(requests, "writer")
    assert section.count(("LIST", "timeline")) == 1 and section.count(("LIST", "locks")) == 1
    assert done[0] is not None
    assert [r for r in requests if r.client == "writer" and unquote(r.path).endswith(done[0].file_name)] == []
    expected = [{"id": "a", "part": "p0", "ts": 5, "value": "after"}, {"id": "b", "part": "p0", "ts": 1,
                "value": "v"}, {"id": "y", "part": "p8", "ts": 3, "value": "rival"},
                {"id": "z", "part": "p9", "ts": 1, "value": "v"}]  # fmt: skip
    assert as_rows(read.snapshot(table)) == expected == hudi_rs.snapshot(table.uri, table.storage.options)


def file_names(timeline: Timeline) -> list[str]:
    return [i.file_name for i in timeline]


def test_a_writer_lists_only_the_tail_of_the_timeline_from_its_third_listing(
    table: Table, proxy: ProxyProcess
) -> None:
    """A rival's claim is pending while the writer lists: the writer's next listing after its claim starts
    no later than that claim (the oldest pending), and none starts before the newest commit its first
    listing showed: the history below is not listed again. They show what a listing in full shows, the
    rival's commit completed included."""
    history = [LocalWriter(table).upsert(rows([f"h{n}"], part="elsewhere")) for n in range(6)]
    assert history[-1] is not None
    writer = LocalWriter(through(table, proxy, "writer"))
    rival = LocalWriter(through(table, proxy, "rival"))
    writer.upsert(rows(["w0"], part="w"))
    pending: list[str] = []

    def meanwhile(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.PLANNED and instant is not None and not pending:
            pending.append(instant)
            writer.upsert(rows(["w1"], part="w"))  # lists while the rival's claim is pending

    with observe(meanwhile):
        rival.upsert(rows(["r0"], part="r"))
    proxy.reset()
    writer.upsert(rows(["w2"], part="w"))
    writer.upsert(rows(["w3"], part="w"))
    listed = [r for r in proxy.reset() if r.client == "writer" and what(r) == ("LIST", "timeline")]
    starts = [parse_qs(urlsplit(r.path).query).get("start-after", [""])[0].rsplit("/", 1)[-1] for r in listed]
    assert len(starts) == 2 and starts[0] <= pending[0] and min(starts) >= history[-1].requested_time, starts
    full = Table.load(table.uri, **table.storage.options).timeline()  # another storage: listed in full
    assert file_names(writer.table.timeline(tail=True)) == file_names(full)
    assert len(full.data_commits().completed()) == 12 and not full.pending()
    assert as_rows(read.snapshot(table)) == hudi_rs.snapshot(table.uri, table.storage.options)
    assert {r["id"] for r in as_rows(read.snapshot(table))} == {"a", "b", "r0"} | {
        f"h{n}" for n in range(6)
    } | {f"w{n}" for n in range(4)}


def test_a_writer_whose_tail_start_archival_passed_lists_in_full_and_sees_the_archived_commits_files(
    table: Table,
) -> None:
    """Archival removes the oldest instants first, at and above a writer's start point too: then what the
    writer's tail keeps below that point (the table's first commit, archived as well) would start its
    timeline before the active one, and the files of the commits archived above it would count as a failed
    write's. A rival rewrote p0's file group and its commit was archived; the first version of the group
    was cleaned. The writer sees names gone above its start point, lists in full, and its delete finds the
    key in the rival's version of the group (it found no group at all, and committed a delete of nothing)."""
    first = table.timeline().data_commits().first
    assert first is not None
    writer = LocalWriter(Table.load(table.uri, **table.storage.options))
    for n in range(3):  # its third listing on is a tail, which starts after the first commit
        writer.upsert(rows([f"w{n}"], part="elsewhere"))
    rival = LocalWriter(Table.load(table.uri, **table.storage.options))
    rewrote = rival.delete(rows(["a"]))
    for n in range(3):
        rival.upsert(rows([f"r{n}"], part="other"))
    service = Table.load(table.uri, **table.storage.options)
    assert clean(service, service_lock(service), commits_retained=1) is not None
    archived = archive(service, service_lock(service), keep_min=2, keep_max=2)
    assert rewrote is not None and archived is not None
    assert {first.requested_time, rewrote.requested_time} <= set(archived.instants)

    writer.delete(rows(["b"]))
    expected = [{"id": n, "part": p, "ts": 1, "value": "v"} for n, p in
                [("r0", "other"), ("r1", "other"), ("r2", "other"), ("w0", "elsewhere"), ("w1", "elsewhere"),
                 ("w2", "elsewhere")]]  # fmt: skip
    snapshot = as_rows(read.snapshot(table))
    assert sorted(snapshot, key=lambda r: r["id"]) == expected
    assert snapshot == hudi_rs.snapshot(table.uri, table.storage.options)


def test_a_write_that_builds_on_a_commit_archived_since_its_tail_listing_lists_in_full_and_commits(
    table: Table,
) -> None:
    """Archival removes instants below a writer's start point, where its tail listings do not look: the
    writer still holds the commit that wrote p0's file group, archived since. A view for a write on that
    timeline finds the commit gone, lists the timeline in full and builds on the file group, as on any
    archived commit's; the writer's upsert into p0 commits."""
    built_on = table.timeline().data_commits().first
    assert built_on is not None
    LocalWriter(table).upsert(rows(["e"], part="elsewhere"))  # newer: what a writer reads for the schema
    writer = LocalWriter(Table.load(table.uri, **table.storage.options))  # has not read the p0 commit
    for n in range(4):
        writer.upsert(rows([f"h{n}"], part="elsewhere"))
    service = Table.load(table.uri, **table.storage.options)
    archived = archive(service, service_lock(service), keep_min=3, keep_max=3)  # below its start point
    assert archived is not None and built_on.requested_time in archived.instants
    kept = writer.table.timeline(tail=True)
    assert built_on in kept  # the tail does not show the archival

    view = FileSystemView.build(writer.table, kept, partitions=["p0"], for_write=True)
    assert [b.instant_time for b in view.latest_base_files()] == [built_on.requested_time]
    writer.upsert(rows(["a"], ts=2, value="again"))
    assert built_on not in writer.table.timeline(tail=True)
    expected = [
        {"id": "a", "part": "p0", "ts": 2, "value": "again"},
        {"id": "b", "part": "p0", "ts": 1, "value": "v"},
    ] + [{"id": n, "part": "elsewhere", "ts": 1, "value": "v"} for n in ["e", "h0", "h1", "h2", "h3"]]
    snapshot = as_rows(read.snapshot(table))
    assert sorted(snapshot, key=lambda r: r["id"]) == sorted(expected, key=lambda r: r["id"])
    assert snapshot == hudi_rs.snapshot(table.uri, table.storage.options)
