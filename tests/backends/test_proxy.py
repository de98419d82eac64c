"""The benchmarks' delaying proxy in front of the S3 server: every request arrives intact, waits its round
trip, and is counted by kind. What the object-store figures are worth rests on this."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from support import ROOT, hudi_rs
from support.servers import S3Server

from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local.writer import LocalWriter
from cowrite.protocol.locks.lock_files import acquired_path, grouped_path, note_path
from cowrite.storage.backend import Storage

sys.path.insert(0, str(ROOT))
from bench.lock_turns import PARTS, lock_turns  # noqa: E402
from bench.proxy import DelayingProxy, ProxyProcess  # noqa: E402

DELAY = 0.05


def through(server: S3Server, proxy: DelayingProxy | ProxyProcess) -> dict[str, Any]:
    options = server.storage_options()
    return {**options, "client_kwargs": {**options["client_kwargs"], "endpoint_url": proxy.endpoint_url}}


def test_requests_arrive_intact_wait_their_round_trip_and_are_counted(s3_server: S3Server) -> None:
    with DelayingProxy(s3_server.endpoint_url, delay=DELAY) as proxy:
        storage = Storage.for_uri(s3_server.new_uri(), **through(s3_server, proxy))
        payload = bytes(range(256)) * 300
        started = time.monotonic()
        storage.write("a/blob", payload)
        assert time.monotonic() - started >= DELAY
        assert storage.read("a/blob") == payload
        assert storage.stat("a/blob").size == len(payload)  # a HEAD keeps the object's size
        assert storage.create_if_absent("a/once", b"1") and not storage.create_if_absent("a/once", b"2")
        assert storage.read("a/once") == b"1"  # the conditional PUT's 412 came through
        assert sorted(i.path for i in storage.list("a")) == ["a/blob", "a/once"]
        storage.delete("a/blob")
        counts = proxy.reset()
        assert counts["PUT"] >= 3 and counts["LIST"] >= 1 and counts["DELETE"] == 1
        assert set(counts) <= {"GET", "LIST", "HEAD", "PUT", "DELETE"}
        assert proxy.counts() == {}

        # requests in flight wait together, not one after another
        with ThreadPoolExecutor(10) as pool:
            list(pool.map(lambda n: storage.write(f"b/{n}", b"x"), range(10)))
        assert proxy.peak_in_flight > 1


def test_the_cpu_the_proxy_and_the_server_take_from_the_cores_is_measured(s3_server: S3Server) -> None:
    # the benchmark reckons the machine's ceiling from these: each must grow with the requests it serves
    with DelayingProxy(s3_server.endpoint_url, delay=0.0) as proxy:
        storage = Storage.for_uri(s3_server.new_uri(), **through(s3_server, proxy))
        storage.write("warm", b"x")
        proxy_before, server_before = proxy.cpu(), s3_server.cpu()
        for n in range(40):
            storage.write(f"c/{n}", bytes(1000))
            storage.list("c")
        assert proxy.cpu() > proxy_before
        assert s3_server.cpu() > server_before
        idle = proxy.cpu()
        time.sleep(0.2)
        assert proxy.cpu() - idle < 0.1  # the proxy's own thread, not the process's or the wall clock's


def test_a_table_written_through_the_proxy_reads_back_with_hudi_rs(s3_server: S3Server) -> None:
    with DelayingProxy(s3_server.endpoint_url, delay=0.0) as proxy:
        options = through(s3_server, proxy)
        uri = s3_server.new_uri()
        table = Table.create(
            uri, name="t", record_key_fields=["id"], partition_fields=["p"], storage_options=options
        )
        LocalWriter(table).upsert(pa.table({"id": [1, 2], "p": ["a", "b"], "v": ["x", "y"]}))
        assert hudi_rs.snapshot(uri, options) == [
            {"id": 1, "p": "a", "v": "x"},
            {"id": 2, "p": "b", "v": "y"},
        ]
        assert proxy.counts()["PUT"] > 0


def test_a_proxy_in_a_process_of_its_own_delays_traces_and_exits_with_its_parent(s3_server: S3Server) -> None:
    with ProxyProcess(s3_server.endpoint_url, delay=DELAY) as proxy:
        storage = Storage.for_uri(s3_server.new_uri(), **through(s3_server, proxy))
        started = time.monotonic()
        storage.write("a/blob", b"x")
        assert time.monotonic() - started >= DELAY
        assert storage.read("a/blob") == b"x"
        traced = proxy.requests()
        assert [r.kind for r in traced][-1] == "GET" and "PUT" in {r.kind for r in traced}
        assert all(r.ended - r.began >= DELAY for r in traced)
        assert proxy.reset() == traced and proxy.requests() == []
        process = proxy._process
    assert process.returncode == 0  # stopped by closing its stdin


def test_the_lock_turns_of_a_run_are_taken_apart_from_the_proxy_log(s3_server: S3Server) -> None:
    with DelayingProxy(s3_server.endpoint_url, delay=DELAY, trace=True) as proxy:
        options = through(s3_server, proxy)
        uri = s3_server.new_uri()
        table = Table.create(uri, name="t", record_key_fields=["id"], storage_options=options)
        proxy.reset()
        writer = LocalWriter(table)
        for value in ("x", "y", "z"):
            writer.upsert(pa.table({"id": [1], "v": [value]}))
        turns = lock_turns(proxy.requests())
        assert hudi_rs.snapshot(uri, options) == [{"id": 1, "v": "z"}]
    # three turns, each noted and released: the first two are followed by another, the last is not
    assert len(turns.turns) == 2 and turns.commits == [1, 1]
    assert set(turns.parts) == set(PARTS) and all(len(ms) == 2 for ms in turns.parts.values())
    for name in ("create", "publish", "release"):  # round trips: each waited for the proxy
        assert min(turns.parts[name]) >= DELAY * 1000
    for index, turn in enumerate(turns.turns):
        assert min(ms[index] for ms in turns.parts.values()) >= 0
        assert abs(sum(ms[index] for ms in turns.parts.values()) - turn) < 1e-6


def test_a_turn_that_published_waiters_commits_is_taken_apart_too(s3_server: S3Server) -> None:
    """The release of a turn that published waiters' commits names how many (``published+<n>``): the
    proxy logs that name URL-quoted."""
    own, waiter = "20261129000000001_20261129000000003.commit", "20261129000000002_20261129000000004.commit"
    with DelayingProxy(s3_server.endpoint_url, delay=0.0, trace=True) as proxy:
        storage = Storage.for_uri(s3_server.new_uri(), **through(s3_server, proxy))
        paths = [
            acquired_path(1),
            f"{TIMELINE_DIR}/{own}",
            f"{TIMELINE_DIR}/{waiter}",
            grouped_path(1, waiter),
            note_path(1, own, grouped=1),
            acquired_path(2),
        ]
        for path in paths:
            assert storage.create_if_absent(path, b"")
        turns = lock_turns(proxy.requests())
    assert len(turns.turns) == 1 and all(len(ms) == 1 for ms in turns.parts.values())
    assert turns.commits == [2]  # the holder's own and its waiter's
