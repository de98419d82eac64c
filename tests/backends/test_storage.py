"""The storage contract (see ``cowrite.storage.backend``), one body run against local, memory and S3."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dateutil.parser
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.servers import S3Server

from cowrite.errors import BaseFileGoneError, StorageError
from cowrite.format.fs_view import BaseFile, list_base_files, open_base_file
from cowrite.format.markers import create_marker, delete_markers, marked_files
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter
from cowrite.storage import s3
from cowrite.storage.backend import Storage
from cowrite.storage.inotify import Listings, listings

RACERS = 8
RACE_TIMEOUT = 60.0


def test_read_returns_what_write_wrote(storage: Storage) -> None:
    storage.write("a/b/file.bin", b"\x00payload\xff")
    assert storage.read("a/b/file.bin") == b"\x00payload\xff"


def test_write_replaces_the_whole_file(storage: Storage) -> None:
    storage.write("file", b"a long first version")
    storage.write("file", b"short")
    assert storage.read("file") == b"short"
    assert storage.stat("file").size == len(b"short")


def test_read_and_stat_of_a_missing_file_raise_file_not_found(storage: Storage) -> None:
    with pytest.raises(FileNotFoundError):
        storage.read("missing")
    with pytest.raises(FileNotFoundError):
        storage.stat("missing")
    assert not storage.exists("missing")


def test_a_base_file_deleted_before_it_is_read_is_named(storage: Storage) -> None:
    """Deleted before the open, on every backend; on S3 also between the open and a read of what the open
    did not fetch (a local or in-memory file stays readable once open, as does a small one on S3, which
    came whole with the open)."""
    gone = "p/f.parquet was deleted before it was read"
    with pytest.raises(BaseFileGoneError, match=gone), open_base_file(storage, "p/f.parquet"):
        pass
    storage.write("p/f.parquet", b"x" * 100)
    with open_base_file(storage, "p/f.parquet") as stream:
        storage.delete("p/f.parquet")
        assert stream.read() == b"x" * 100
    large = b"x" * 2 * s3.TAIL
    storage.write("p/f.parquet", large)
    read: list[bytes] = []
    if storage.uri.startswith("s3://"):
        with pytest.raises(BaseFileGoneError, match=gone), open_base_file(storage, "p/f.parquet") as stream:
            storage.delete("p/f.parquet")
            read.append(stream.read())
        assert read == []
    else:
        with open_base_file(storage, "p/f.parquet") as stream:
            storage.delete("p/f.parquet")
            read.append(stream.read())
        assert read == [large]


def test_delete_removes_and_tolerates_a_missing_file(storage: Storage) -> None:
    storage.write("file", b"x")
    storage.delete("file")
    assert not storage.exists("file")
    storage.delete("file")
    storage.delete("never/existed")


def test_list_gives_direct_files_with_sizes(storage: Storage) -> None:
    storage.write("dir/one", b"1")
    storage.write("dir/two", b"22")
    storage.write("dir/sub/three", b"333")
    listed = {info.path: info.size for info in storage.list("dir")}
    assert listed == {"dir/one": 1, "dir/two": 2}
    assert {info.name for info in storage.list("dir")} == {"one", "two"}


def test_a_file_removed_while_local_disk_lists_its_directory_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local disk stats each file after reading the directory (S3 has sizes and times in the listing): a
    file a cleaner deletes in between is left out, and only that one. A non-partitioned table's base files
    are all in one directory: a snapshot must not lose them all."""
    storage = Storage.for_uri(str(tmp_path / "t"))
    for name in ("one", "two", "three"):
        storage.write(f"dir/{name}", b"1")
    scandir = os.scandir

    def removed_after_the_directory_read(entry: os.DirEntry[str]) -> os.DirEntry[str]:
        if entry.name == "two":
            os.unlink(entry.path)
        return entry

    @contextmanager
    def racing(path: str) -> Iterator[Iterator[os.DirEntry[str]]]:
        with scandir(path) as entries:
            yield (removed_after_the_directory_read(entry) for entry in entries)

    monkeypatch.setattr(os, "scandir", racing)
    assert sorted(info.name for info in storage.list("dir")) == ["one", "three"]


def test_list_of_a_missing_directory_is_empty(storage: Storage) -> None:
    assert storage.list("missing") == []
    assert storage.list_dirs("missing") == []
    assert storage.walk_files("missing") == []


def test_list_dirs_gives_direct_sub_directories(storage: Storage) -> None:
    storage.write("top/file", b"x")
    storage.write("top/left/file", b"x")
    storage.write("top/right/deeper/file", b"x")
    assert sorted(storage.list_dirs("top")) == ["top/left", "top/right"]
    assert storage.list_dirs("") == ["top"]


def test_walk_files_is_recursive(storage: Storage) -> None:
    storage.write("top/file", b"1")
    storage.write("top/left/file", b"22")
    storage.write("top/right/deeper/file", b"333")
    storage.write("elsewhere", b"x")
    walked = {info.path: info.size for info in storage.walk_files("top")}
    assert walked == {"top/file": 1, "top/left/file": 2, "top/right/deeper/file": 3}
    assert len(storage.walk_files()) == 4


def test_walk_files_leaves_out_the_skipped_sub_directories(storage: Storage) -> None:
    for path in ("root-file", "a/file", "a/b/file", ".hoodie/timeline/x", ".hoodie/y", "c/.hoodie/z"):
        storage.write(path, b"1")
    walked = sorted(info.path for info in storage.walk_files("", skip=(".hoodie",)))
    assert walked == ["a/b/file", "a/file", "c/.hoodie/z", "root-file"]  # only the directory's own
    assert [info.path for info in storage.walk_files("a", skip=("b",))] == ["a/file"]


def s3_table(server: S3Server, **properties: Any) -> tuple[Table, str]:
    """A new table partitioned by ``p`` on the S3 server, and its key prefix in the bucket."""
    name = f"cowrite-test-{uuid.uuid4().hex}"
    table = Table.create(
        f"s3://{server.bucket}/{name}",
        name="t",
        record_key_fields=["id"],
        partition_fields=["p"],
        storage_options=server.storage_options(),
        **properties,
    )
    return table, name


def test_storages_of_one_s3_location_share_one_client(s3_server: S3Server) -> None:
    """Each S3 filesystem holds a client (service model, connection pool): a reader or daemon that opens
    a table over and over must neither build one each time nor keep every one it built."""
    uri, options = s3_server.new_uri("shared"), s3_server.storage_options()
    assert Storage.for_uri(uri, **options).fs is Storage.for_uri(uri, **options).fs
    other = {**options, "key": "someone-else"}
    assert Storage.for_uri(uri, **other).fs is not Storage.for_uri(uri, **options).fs


def test_walking_a_table_on_s3_asks_once_a_page_of_keys_not_once_a_partition(s3_server: S3Server) -> None:
    """Listing every base file (snapshot reads, an insert's small file groups, the cleaner) of a table
    with 40 partitions: one request, where one a partition cost 40."""
    table, name = s3_table(s3_server)
    files = {f"p={p}/{BaseFile.file_name(f'group-{p}', '0-1-0', '20261121000000000')}" for p in range(40)}
    for path in files:
        table.storage.write(path, b"parquet")
    before = s3_server.listings(name)
    assert {b.path for b in list_base_files(table)} == files
    assert s3_server.listings(name) - before == 1


def test_an_insert_lists_only_the_partitions_it_touches(s3_server: S3Server) -> None:
    """An insert looks for small file groups to fill in the partitions its input holds, and only there:
    into a table of 1,000 partitions, an insert touching 3 lists those 3 and no other data directory."""
    table, name = s3_table(s3_server, hive_style_partitioning=True)
    old = "20261121000000000"  # before the table's first instant: a file of an archived commit
    paths = [f"p={p}/{BaseFile.file_name(f'g{p}', '0-1-0', old)}" for p in range(1000)]
    s3_server.load(s3_server.bucket, {f"{name}/{path}": b"" for path in paths})  # one request
    before = s3_server.listed(name)
    LocalWriter(table).insert(pa.table({"id": ["a", "b", "c"], "p": ["x", "y", "z"]}))
    listed = s3_server.listed(name) - before
    data = {prefix: n for prefix, n in listed.items() if not prefix.startswith(f"{name}/.hoodie/")}
    assert data == {f"{name}/p={p}/": 1 for p in "xyz"}
    assert sum(listed.values()) <= 10, listed  # the rest: the timeline and the lock directory


def test_listed_keys_times_are_read_without_dateutil_and_agree_with_the_header(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key a listing returns carries its time in ISO 8601, read by the standard library rather
    than dateutil's general parser (botocore's default, the bulk of its parsing of a listing); a HEAD's
    HTTP date still goes to botocore's parser, and both give the same time."""
    storage = Storage.for_uri(
        s3_server.new_uri("times"), **s3_server.storage_options()
    )
    storage.write("dir/a", b"x")
    from_header = storage.stat("dir/a").modified

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a listed key's time went to dateutil")

    monkeypatch.setattr(dateutil.parser, "parse", refuse)
    assert [i.modified for i in storage.list("dir")] == [from_header]
    assert [i.modified for i in storage.list_after("dir", "")] == [from_header]


def test_portable_options_carry_what_the_aws_environment_gave_to_a_process_without_it(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = s3_server.new_uri("portable")
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    Storage.for_uri(uri).write("a.txt", b"from the driver")
    options = Storage.for_uri(uri).portable_options()
    for name in s3_server.env():
        monkeypatch.delenv(name)

    assert options["key"] == s3_server.storage_options()["key"]
    assert options["client_kwargs"]["endpoint_url"] == s3_server.endpoint_url
    assert Storage.for_uri(uri, **options).read("a.txt") == b"from the driver"
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert "key" not in Storage.for_uri(uri).portable_options()  # this process has no credentials now


def test_stat_gives_size_and_modification_time(storage: Storage) -> None:
    before = time.time()
    storage.write("dir/file", b"12345")
    info = storage.stat("dir/file")
    assert (info.path, info.name, info.size) == ("dir/file", "file", 5)
    # S3 keeps whole seconds; moto runs on this machine's clock.
    assert before - 2 <= info.modified <= time.time() + 2


def test_a_modification_time_is_never_before_the_write(storage: Storage) -> None:
    """Ages measured from modification times err young on every storage, so a judge never finds a lease
    older than its holder does: S3 keeps whole seconds, cut down, and its times are the end of that
    second. (Local file systems stamp with the kernel's coarse clock, a few milliseconds behind.)"""
    for n in range(5):
        began = time.time()
        storage.write(f"dir/f{n}", b"x")
        listed = {info.name: info.modified for info in storage.list("dir")}
        listed_after = {info.name: info.modified for info in storage.list_after("dir", "")}
        for modified in (listed[f"f{n}"], listed_after[f"f{n}"], storage.stat(f"dir/f{n}").modified):
            assert modified >= began - 0.02


def test_writes_make_the_directories_they_need_and_leave_nothing_else(storage: Storage) -> None:
    storage.write("a/b/c/written", b"1")  # none of the directories exists
    assert storage.create_if_absent("a/b/d/linked", b"2")  # the parent exists, the directory not
    assert storage.create_if_absent("a/e/empty", b"")
    assert storage.read("a/b/c/written") == b"1" and storage.read("a/b/d/linked") == b"2"
    expected = ["a/b/c/written", "a/b/d/linked", "a/e/empty"]
    assert sorted(info.path for info in storage.walk_files("")) == expected
    if storage.uri.startswith("/"):  # no temporary file left anywhere, listed or not
        on_disk = [p.relative_to(storage.uri) for p in Path(storage.uri).rglob("*") if p.is_file()]
        assert sorted(map(str, on_disk)) == expected


def test_create_if_absent_creates_once_and_keeps_the_first_content(storage: Storage) -> None:
    assert storage.create_if_absent("dir/instant", b"first") is True
    assert storage.create_if_absent("dir/instant", b"second") is False
    assert storage.read("dir/instant") == b"first"
    assert [info.path for info in storage.list("dir")] == ["dir/instant"]


def test_open_output_writes_a_binary_stream(storage: Storage) -> None:
    with storage.open_output("data/part-0.parquet") as stream:
        stream.write(b"PAR1")
        stream.write(b"\x00" * 10_000)
    assert storage.read("data/part-0.parquet") == b"PAR1" + b"\x00" * 10_000
    with storage.open_input("data/part-0.parquet") as stream:
        assert stream.read(4) == b"PAR1"


def _race(uri: str, options: dict[str, Any], path: str, payload: bytes, barrier: Any) -> bool:
    storage = Storage.for_uri(uri, **options)
    storage.exists(path)  # connect before the start line, so the creates really overlap
    barrier.wait(timeout=RACE_TIMEOUT)
    return storage.create_if_absent(path, payload)


def _race_in_process(
    uri: str, options: dict[str, Any], path: str, payload: bytes, barrier: Any, results: Any
) -> None:
    results.put((payload, _race(uri, options, path, payload, barrier)))


@pytest.mark.slow
def test_new_files_wakes_on_a_wanted_file_only_where_the_storage_can_tell(storage: Storage) -> None:
    storage.write("locks/lock1.acquired", b"{}")
    with storage.new_files("locks", wanted=lambda name: name.endswith(".released")) as new_files:
        began = time.monotonic()
        storage.write("locks/lock2.acquired", b"{}")  # not wanted: no wake-up
        new_files.wait(0.3)
        assert time.monotonic() - began >= 0.3
        timer = threading.Timer(0.2, lambda: storage.create_if_absent("locks/lock1.released", b"{}"))
        timer.start()
        began = time.monotonic()
        new_files.wait(5 if storage.uri.startswith("/") else 0.5)
        waited = time.monotonic() - began
        timer.join()
    if storage.uri.startswith("/"):  # local disk: woken by the kernel, long before the 5 s are up
        assert 0.1 < waited < 4
    else:  # no notifications: the wait is a plain sleep
        assert waited >= 0.5


def test_one_waiter_at_a_time_takes_the_turn_in_a_local_directory(tmp_path: Path) -> None:
    storage = Storage.for_uri(str(tmp_path))
    storage.write("locks/lock1.acquired", b"{}")
    with storage.new_files("locks") as first, storage.new_files("locks") as second:
        with first.turn() as mine:
            assert mine
            with second.turn() as theirs:
                assert not theirs  # in another process it is the same: the lock is the kernel's
        with second.turn() as theirs:
            assert theirs


def test_watched_names_are_the_names_after_every_kind_of_change(storage: Storage) -> None:
    def check() -> None:
        assert storage.watched_names("timeline") == frozenset(storage.names("timeline"))

    assert storage.watched_names("timeline") == frozenset()  # no directory yet
    storage.write("timeline/1.commit.requested", b"")
    check()
    storage.create_if_absent("timeline/1.commit", b"{}")  # through a temporary file, never listed
    storage.write("timeline/1.commit.requested", b"x")  # replaced in place
    check()
    storage.delete("timeline/1.commit.requested")
    check()
    assert storage.watched_names("timeline") == {"1.commit"}
    storage.delete("timeline/1.commit")
    check()
    assert storage.watched_names("timeline") == frozenset()


def _create_files(directory: str, names: list[str]) -> None:
    for name in names:
        Path(directory, name).touch()


def test_watched_names_see_what_another_process_created_before_the_call(tmp_path: Path) -> None:
    storage = Storage.for_uri(str(tmp_path))
    storage.write("timeline/0.commit", b"")
    first = storage.watched_names("timeline")
    names = [f"{i}.commit" for i in range(1, 50)]
    other = multiprocessing.get_context("spawn").Process(
        target=_create_files, args=(str(tmp_path / "timeline"), names)
    )
    other.start()
    other.join(timeout=RACE_TIMEOUT)
    assert other.exitcode == 0
    # no wait: the kernel queued the events before the other process's calls returned
    assert storage.watched_names("timeline") == {"0.commit", *names}
    assert first == {"0.commit"}  # a listing handed out earlier does not change under its holder


def test_watched_names_follow_a_directory_replaced_deleted_or_moved_away(tmp_path: Path) -> None:
    table = tmp_path / "table"
    storage = Storage.for_uri(str(table))
    storage.write("timeline/1.commit", b"")
    assert storage.watched_names("timeline") == {"1.commit"}
    shutil.rmtree(table / "timeline")
    assert storage.watched_names("timeline") == frozenset()
    storage.write("timeline/2.commit", b"")
    assert storage.watched_names("timeline") == {"2.commit"}
    # the table moved away and a new one at its path: the old directory's events say nothing of it
    table.rename(tmp_path / "moved")
    storage.write("timeline/3.commit", b"")
    assert storage.watched_names("timeline") == {"3.commit"}
    (tmp_path / "moved" / "timeline" / "4.commit").touch()
    assert storage.watched_names("timeline") == {"3.commit"}


def test_watched_names_survive_lost_events(tmp_path: Path) -> None:
    storage = Storage.for_uri(str(tmp_path))
    storage.write("timeline/0.commit", b"")
    storage.watched_names("timeline")
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    names = [f"{i}.commit" for i in range(1, limit + 100)]  # more events than the kernel queues
    _create_files(str(tmp_path / "timeline"), names)
    assert storage.watched_names("timeline") == {"0.commit", *names}


def test_a_forked_child_keeps_its_own_listings(tmp_path: Path) -> None:
    storage = Storage.for_uri(str(tmp_path))
    storage.write("timeline/0.commit", b"")
    storage.watched_names("timeline")

    def child() -> None:  # sees its own change, and must not take the parent's events with it
        storage.write("timeline/1.commit", b"")
        assert storage.watched_names("timeline") == {"0.commit", "1.commit"}

    forked = multiprocessing.get_context("fork").Process(target=child)
    forked.start()
    forked.join(timeout=RACE_TIMEOUT)
    assert forked.exitcode == 0
    assert storage.watched_names("timeline") == {"0.commit", "1.commit"}


def test_beyond_its_bound_the_least_recently_used_listing_is_listed_afresh(tmp_path: Path) -> None:
    kept = Listings()
    kept.MAX_DIRECTORIES = 2
    listed: list[str] = []

    def look(name: str) -> frozenset[str] | None:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        return kept.names(str(directory), lambda: listed.append(name) or os.listdir(directory), bool)

    look("a"), look("b"), look("a")  # a is now the more recently used
    look("c")  # b goes
    (tmp_path / "b" / "new").touch()
    assert look("a") == frozenset() and look("b") == {"new"}
    assert listed == ["a", "b", "c", "b"]


def test_a_directory_other_hosts_may_change_is_listed_every_time() -> None:
    # /proc stands for any file system whose changes need not pass through this kernel (NFS, SMB, FUSE)
    assert listings.names("/proc/self", lambda: ["listed"], lambda name: True) is None


def test_create_if_absent_has_exactly_one_winner_among_racers(
    storage: Storage, storage_uri: str, storage_options: dict[str, Any]
) -> None:
    path = "race/20240101000000000.commit"
    payloads = [f"writer-{i}".encode() for i in range(RACERS)]
    outcomes: list[tuple[bytes, bool]] = []
    if storage_uri.startswith("memory://"):
        # A memory file system lives inside one process, so its racers can only be threads.
        thread_barrier = threading.Barrier(RACERS)
        lock = threading.Lock()

        def run(payload: bytes) -> None:
            won = _race(storage_uri, storage_options, path, payload, thread_barrier)
            with lock:
                outcomes.append((payload, won))

        threads = [threading.Thread(target=run, args=(p,)) for p in payloads]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(RACE_TIMEOUT)
    else:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(RACERS)
        results = context.Queue()
        processes = [
            context.Process(
                target=_race_in_process, args=(storage_uri, storage_options, path, p, barrier, results)
            )
            for p in payloads
        ]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=RACE_TIMEOUT) for _ in processes]
        for process in processes:
            process.join(RACE_TIMEOUT)
        assert [process.exitcode for process in processes] == [0] * RACERS

    assert len(outcomes) == RACERS
    winners = [payload for payload, won in outcomes if won]
    assert len(winners) == 1
    assert storage.read(path) == winners[0]


def _the_contract_on(storage: Storage) -> None:
    """What every S3 request of a table's keeps to, on one storage."""
    storage.write("t/a", b"1")
    storage.write("t/sub/c", b"below")
    assert storage.read("t/a") == b"1"
    assert storage.create_if_absent("t/b", b"2") and not storage.create_if_absent("t/b", b"3")
    assert storage.read("t/b") == b"2"
    with storage.open_output("t/d") as out:
        out.write(pa.py_buffer(b"parquet's buffers"))  # pyarrow's buffers, as a parquet writer hands them
    assert [f.path for f in storage.list("t")] == ["t/a", "t/b", "t/d"]
    assert [f.path for f in storage.list_after("t", "a")] == ["t/b", "t/d"]
    assert storage.read("t/d") == b"parquet's buffers"
    data = bytes(range(256)) * 400  # more than an open asks for first (s3.TAIL)
    storage.write("u/r", data)
    storage.write("u/e", b"")
    with storage.open_input("u/r") as stream:
        stream.seek(-10, os.SEEK_END)
        assert stream.read() == data[-10:]
        stream.seek(5)
        assert (stream.read(100), stream.read()) == (data[5:105], data[105:])
    with storage.open_input("u/e") as stream:
        assert stream.read() == b""
    with pytest.raises(FileNotFoundError):
        storage.open_input("u/missing")
    storage.delete_all(["t/a", "t/b"])
    storage.delete("t/d")
    assert [f.path for f in storage.list("t")] == []
    with pytest.raises(FileNotFoundError):
        storage.read("t/a")


def test_s3_requests_go_through_obstore_unless_the_options_ask_for_what_only_s3fs_does(
    s3_server: S3Server,
) -> None:
    honoured = s3_server.storage_options()
    only_s3fs = honoured | {"config_kwargs": {"user_agent_extra": "cowrite-tests"}}
    for options, through_obstore in ((honoured, True), (only_s3fs, False)):
        storage = Storage.for_uri(s3_server.new_uri(), **options)
        assert (s3.object_store(storage.fs, options, s3_server.bucket) is not None) == through_obstore
        _the_contract_on(storage)


def test_a_file_opened_on_s3_is_read_from_its_end_without_a_size_lookup(s3_server: S3Server) -> None:
    """A parquet reader starts at the footer, at the file's end: the open asks for the end, whose answer
    tells the size too (s3fs asks for the size first); a small file comes whole with it, and the rest of
    a larger one in one more request."""
    storage = Storage.for_uri(s3_server.new_uri(), **s3_server.storage_options())
    table = pa.table({"id": [f"key-{i:08d}" for i in range(20_000)], "n": list(range(20_000))})
    sizes = {"small.parquet": 100, "large.parquet": table.num_rows}
    for path, rows in sizes.items():
        encoded = pa.BufferOutputStream()
        pq.write_table(table.slice(0, rows), encoded, compression="none")
        storage.write(path, encoded.getvalue().to_pybytes())
    assert storage.stat("small.parquet").size < s3.TAIL < storage.stat("large.parquet").size
    for path, requests in (("small.parquet", 1), ("large.parquet", 2)):
        before = s3_server.requests()
        with open_base_file(storage, path) as stream:
            assert pq.ParquetFile(stream).read() == table.slice(0, sizes[path])
        assert s3_server.requests() - before == {"GET": requests}, path


def test_an_instants_markers_go_in_one_request_after_their_listing(s3_server: S3Server) -> None:
    """A Spark write leaves a marker for each base file, deleted once the instant completed: one listing
    and one bulk delete, where one DELETE a marker, one after another, took 0.4 s of a 2 s insert."""
    storage = Storage.for_uri(s3_server.new_uri(), **s3_server.storage_options())
    instant = "20261201000000000"
    for n in range(16):
        create_marker(storage, instant, f"p{n % 8}/group-{n}_0-1-0_{instant}.parquet")
    create_marker(storage, "20261201000000001", "p0/other_0-1-0_20261201000000001.parquet")
    before = s3_server.requests()
    delete_markers(storage, instant)
    assert s3_server.requests() - before == {f"LIST .hoodie/.temp/{instant}/": 1, "POST": 1}
    assert marked_files(storage, instant) == []
    assert marked_files(storage, "20261201000000001") == ["p0/other_0-1-0_20261201000000001.parquet"]


def test_s3_endpoint_and_credentials_come_from_the_aws_environment_alone(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    storage = Storage.for_uri(s3_server.new_uri())
    assert s3.object_store(storage.fs, {}, s3_server.bucket) is not None
    _the_contract_on(storage)


def test_an_aws_endpoint_other_than_a_regions_standard_one_keeps_to_s3fs() -> None:
    """A FIPS or dual-stack endpoint is reached as asked (s3fs); a region's own, virtual-hosted (obstore)."""
    for endpoint, through_obstore in (
        ("https://s3.eu-west-1.amazonaws.com", True),
        ("https://s3-fips.eu-west-1.amazonaws.com", False),
        ("https://s3.dualstack.eu-west-1.amazonaws.com", False),
    ):
        options = {
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"},
        }
        storage = Storage.for_uri("s3://bucket/table", **options)
        assert (s3.object_store(storage.fs, options, "bucket") is not None) == through_obstore


_BACKGROUND_AT_EXIT = """
import json, sys
from cowrite.storage.backend import Storage
from cowrite.storage.together import in_background

storage = Storage.for_uri(sys.argv[1], **json.loads(sys.argv[2]))
for n in range(4):
    in_background(storage, lambda n=n: storage.write(f"late/{n}", b"late"), f"writing {n}")
"""


def test_requests_left_in_the_background_are_made_before_a_process_exits(s3_server: S3Server) -> None:
    """A lock's release on an object store is made in the background, and a program that ends right
    after its commit must not leave it undone. Here the requests are the s3fs client's first: it opens
    its connections through the interpreter's thread pools, which refuse work once its teardown began."""
    uri = s3_server.new_uri()
    # an option only s3fs honours: every request goes through s3fs (the test above)
    options = s3_server.storage_options() | {"config_kwargs": {"user_agent_extra": "cowrite-tests"}}
    done = subprocess.run(
        [sys.executable, "-c", _BACKGROUND_AT_EXIT, uri, json.dumps(options)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    late = Storage.for_uri(uri, **options).list("late")
    assert sorted(f.path for f in late) == [f"late/{n}" for n in range(4)]


def _write_from_a_fork(uri: str, options: dict[str, Any]) -> None:
    storage = Storage.for_uri(uri, **options)
    storage.write("child", storage.read("parent") + b" and child")


def test_a_process_forked_after_s3_requests_makes_its_own_and_exits(s3_server: S3Server) -> None:
    """obstore's threads do not survive a fork, and a store used in a forked child would wait for them for
    ever: the child makes its requests through s3fs."""
    uri, options = s3_server.new_uri(), s3_server.storage_options()
    storage = Storage.for_uri(uri, **options)
    storage.write("parent", b"parent")  # through obstore: its runtime runs in this process now
    child = multiprocessing.get_context("fork").Process(target=_write_from_a_fork, args=(uri, options))
    child.start()
    child.join(timeout=60)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0
    assert storage.read("child") == b"parent and child"


def test_an_unreachable_s3_endpoint_raises_storage_error_naming_the_path() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    storage = Storage.for_uri(
        "s3://bucket/table",
        key="unused",
        secret="unused",
        client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
        config_kwargs={"connect_timeout": 1, "retries": {"max_attempts": 1}},
    )
    started = time.monotonic()
    with pytest.raises(StorageError, match="bucket/table/.hoodie/hoodie.properties"):
        storage.read(".hoodie/hoodie.properties")
    with pytest.raises(StorageError, match="bucket/table/.hoodie/x.commit"):
        storage.create_if_absent(".hoodie/x.commit", b"{}")
    with pytest.raises(StorageError, match="bucket/table/.hoodie"):
        storage.list(".hoodie")
    assert time.monotonic() - started < 15


def test_list_after_returns_the_files_named_after_a_name_sorted(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cowrite.storage.s3.PAGE", 2)  # S3: the answer joins several pages
    for name in ["b", "a", "c_y", "c.x", "d"]:
        storage.write(f"dir/{name}", name.encode() * 3)
    storage.write("dir/sub/e", b"")  # in a sub-directory: not a file of dir
    storage.write("dirt", b"")  # beside it, its name starting like the directory's
    assert [i.name for i in storage.list_after("dir", "b")] == ["c.x", "c_y", "d"]
    every = ["dir/a", "dir/b", "dir/c.x", "dir/c_y", "dir/d"]
    assert [i.path for i in storage.list_after("dir", "")] == every
    assert [(i.size, i.modified > 0) for i in storage.list_after("dir", "c_y")] == [(3, True)]
    assert storage.list_after("dir", "d") == []
    assert storage.list_after("missing", "") == []


def test_delete_all_deletes_what_exists_and_nothing_else(storage: Storage) -> None:
    for name in ("a", "b", "keep"):
        storage.write(f"dir/{name}", b"1")
    storage.delete_all(["dir/a", "dir/b", "dir/missing"])
    storage.delete_all([])
    assert storage.names("dir") == ["keep"]
