"""Hostile input, property-based, against a running daemon: corrupt stored files never crash it nor make it
delete a committed file; any request, and raw garbage on its socket, gets an answer and leaves it serving
(the parsers alone: tests/unit/test_fuzz.py)."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from support.fuzz import (
    COMMIT_FIELDS,
    FAST,
    SLOW_FUZZ,
    TIME,
    any_bytes,
    hostile_avro,
    hostile_json,
    new_table,
)
from support.tables import rows

from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.service import Daemon
from cowrite.format.instant import from_millis, to_millis
from cowrite.format.overlay import Kind, LogFile
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import heartbeat_path
from cowrite.protocol.locks.lock_files import acquired_path
from cowrite.protocol.transaction import Transaction, WriteOptions

# -- the daemon over corrupt files --------------------------------------------------------------------


def _committed(table: Table) -> dict[str, bytes]:
    """Every committed file (completed instants and the base files they reference), with its content."""
    timeline = table.timeline()
    files = {}
    for instant in timeline.completed():
        files[table.instant_path(instant)] = table.storage.read(table.instant_path(instant))
    view_paths = {s.path for i in timeline.data_commits() for s in table.commit_metadata(i).write_stats}
    for path in view_paths:
        if table.storage.exists(path):
            files[path] = table.storage.read(path)
    return files


CORRUPTIONS = ["commit", "lock", "heartbeat", "rollback-plan", "clean-plan", "overlay", "inflight-plan"]


@SLOW_FUZZ
@given(
    kind=st.sampled_from(CORRUPTIONS),
    data=any_bytes()
    | hostile_json()
    | hostile_avro(
        COMMIT_FIELDS + ["instantToRollback", "filesToDelete", "earliestInstantToRetain", "policy"]
    ),
)
def test_the_daemon_survives_corrupt_files_and_deletes_no_committed_file(
    kind: str, data: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    table = new_table(tmp_path_factory.mktemp("t"))
    writer = LocalWriter(table)
    writer.insert(rows(["a", "b"]))
    writer.upsert(rows(["a"], ts=2))
    writer.insert(rows(["c"], part="p1"))
    before = _committed(table)
    latest = table.timeline().latest_completion_time or TIME
    later = from_millis(to_millis(latest) + 10)
    after = from_millis(to_millis(latest) + 20)
    if kind == "commit":
        table.storage.write(f"{TIMELINE_DIR}/{later}_{after}.commit", data)
    elif kind == "lock":
        table.storage.write(acquired_path(99), data)
    elif kind == "heartbeat":
        pending = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
        assert pending.heartbeat is not None
        pending.heartbeat.stop(delete=False)
        table.storage.write(heartbeat_path(pending.instant_time), data)
    elif kind == "rollback-plan":
        table.storage.write(f"{TIMELINE_DIR}/{later}.rollback.requested", data)
    elif kind == "clean-plan":
        table.storage.write(f"{TIMELINE_DIR}/{later}.clean.requested", data)
    elif kind == "overlay":  # the log's first file, as if it had been written and then damaged
        table.storage.write(LogFile(latest, 0, None, Kind.SNAPSHOT).path, data)
    else:
        table.storage.write(f"{TIMELINE_DIR}/{later}.commit.requested", b"")
        table.storage.write(f"{TIMELINE_DIR}/{later}.inflight", data)
    config = DaemonConfig(
        tables=(TableEntry(table.uri, "fuzz", FAST),), port=0, poll_interval=0.05, clean_interval=0.05
    )
    daemon = Daemon(config, registry=CollectorRegistry())
    daemon.start(serve_http=True)
    try:
        service = daemon.services[0]
        deadline = time.monotonic() + 10
        while service.polls < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # past the tolerance: the pending writer is failed, a stale lock expires
        polls = service.polls
        while service.polls < polls + 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert service.polls >= polls + 3, "the daemon stopped polling"
        port = daemon.http.server_address[1]  # type: ignore[attr-defined]
        assert _get(port, "/healthz")[0] == 200
        assert _get(port, "/api/tables/fuzz/status")[0] == 200
    finally:
        daemon.stop()
    for path, content in before.items():
        assert table.storage.exists(path), f"the daemon deleted committed file {path}"
        assert table.storage.read(path) == content


# -- HTTP ----------------------------------------------------------------------------------------------

TOKEN = "fuzz-token"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    table = new_table(tmp_path_factory.mktemp("served"))
    LocalWriter(table).insert(rows(["a"]))
    config = DaemonConfig(
        tables=(TableEntry(table.uri, "orders", FAST),),
        port=0,
        poll_interval=0.2,
        clean_interval=3600,
        token=TOKEN,
    )
    daemon = Daemon(config, registry=CollectorRegistry())
    daemon.start(serve_http=True)
    try:
        yield daemon.http.server_address[1]  # type: ignore[attr-defined]
    finally:
        daemon.stop()


def _get(
    port: int,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


SEGMENTS = st.sampled_from(
    [
        "api",
        "tables",
        "orders",
        "nope",
        "timeline",
        "heartbeats",
        "locks",
        "watermark",
        "overlay",
        "status",
        "rollback",
        "clean",
        "metrics",
        "healthz",
        "readyz",
        "..",
        "%2e%2e",
        "..%2F..%2Fetc",
        "%00",
        "",
        "a" * 300,
    ]
)
PATHS = st.lists(SEGMENTS | st.text(max_size=12).map(lambda s: s.replace("/", "")), max_size=5).map(
    lambda parts: "/" + "/".join(parts)
)
QUERIES = st.one_of(
    st.just(""), st.text(max_size=40), st.builds(lambda v: f"since={v}", st.text(max_size=20))
)
HEADERS = st.dictionaries(
    st.sampled_from(
        ["Authorization", "Content-Length", "Content-Type", "X-Anything", "Transfer-Encoding", "Host"]
    ),
    st.one_of(
        st.just(f"Bearer {TOKEN}"),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
    ),
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW"]),
    path=PATHS,
    query=QUERIES,
    headers=HEADERS,
    body=st.none() | st.binary(max_size=200),
)
def test_http_answers_every_request_and_keeps_serving(
    served: int, method: str, path: str, query: str, headers: dict[str, str], body: bytes | None
) -> None:
    target = path + (f"?{query}" if query else "")
    if "Content-Length" in headers and body is None:
        body = b""
    try:
        status, payload = _get(served, target, method, headers, body)
    except (ValueError, http.client.InvalidURL, UnicodeEncodeError):
        assume(False)  # the client refuses to send it: nothing reached the server
        return
    except (http.client.HTTPException, ConnectionError, OSError) as exc:
        raise AssertionError(f"{method} {target!r} {headers} got no answer: {exc!r}") from None
    assert 200 <= status < 600
    assert b"Traceback" not in payload and b'File "' not in payload
    if method == "POST" and status == 200:
        assert headers.get("Authorization") == f"Bearer {TOKEN}"
    assert _get(served, "/healthz")[0] == 200


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.binary(max_size=300)
    | st.builds(
        lambda line, rest: line + b"\r\n" + rest + b"\r\n\r\n",
        st.binary(max_size=80),
        st.binary(max_size=200),
    )
)
def test_raw_garbage_on_the_socket_never_kills_the_server(served: int, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", served), timeout=10) as connection:
        try:
            connection.sendall(raw + b"\r\n\r\n")
            connection.shutdown(socket.SHUT_WR)
            answer = connection.recv(65536)
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            answer = b""
    # a request line without a version is answered the HTTP/0.9 way: the error page alone
    assert answer == b"" or answer.startswith((b"HTTP/", b"<!DOCTYPE HTML>"))
    assert b"Traceback" not in answer
    assert _get(served, "/healthz")[0] == 200
