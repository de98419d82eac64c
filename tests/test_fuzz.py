"""Hostile input, property-based: every parser of stored bytes and the daemon's HTTP endpoint.

Every case ends in one of cowrite's typed errors, or is skipped with a logged warning: never another
exception, never a crash of the daemon, never the deletion of a committed file. Stored inputs come in three
flavours: arbitrary bytes; valid files mutated (flipped, cut, inserted bytes); and *well-formed files of
the wrong shape* (valid Avro with another writer schema, valid JSON of other types), which pass every
format check and must still be refused by their content.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.follow import TimelineFollower
from cowrite.daemon.service import Daemon
from cowrite.errors import (
    CorruptTimelineError,
    InvalidTablePropertiesError,
    TableNotFoundError,
)
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, InvalidInstantError, State, from_millis, to_millis
from cowrite.format.overlay import CommitEntry, Overlay
from cowrite.format.service_metadata import CleanPlan, RollbackPlan, RollbackResult
from cowrite.format.table import PROPERTIES_FILE, Table, parse_properties
from cowrite.format.timeline import TIMELINE_DIR, Timeline
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import abort_reason, heartbeat_path
from cowrite.protocol.locks import LockHolder
from cowrite.protocol.locks.filesystem import acquired_path
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.storage.backend import Storage

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SLOW_FUZZ = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TIME = "20260101120000000"
LATER = "20260101120000500"


# -- strategies --------------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` with a byte flipped, a piece cut out, or bytes inserted (a torn or bit-rotted file)."""
    raw = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        at = draw(st.integers(0, max(0, len(raw) - 1)))
        if kind == "flip" and raw:
            raw[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del raw[at : at + draw(st.integers(1, 16))]
        elif kind == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del raw[at:]
    return bytes(raw)


def _avro_value(depth: int = 2) -> st.SearchStrategy[tuple[Any, Any]]:
    """An (Avro schema, value of that schema) pair: a type the reader does not expect, holding data."""
    primitives = st.one_of(
        st.just(("null", None)),
        st.booleans().map(lambda v: ("boolean", v)),
        st.integers(-(2**31), 2**31 - 1).map(lambda v: ("int", v)),
        st.integers(-(2**63), 2**63 - 1).map(lambda v: ("long", v)),
        st.floats(allow_nan=False).map(lambda v: ("double", v)),
        st.text(max_size=20).map(lambda v: ("string", v)),
        st.binary(max_size=20).map(lambda v: ("bytes", v)),
    )
    if depth == 0:
        return primitives
    inner = _avro_value(depth - 1)
    arrays = inner.flatmap(
        lambda item: st.lists(st.just(item[1]), max_size=3).map(
            lambda values: ({"type": "array", "items": item[0]}, values)
        )
    )
    maps = inner.flatmap(
        lambda item: st.dictionaries(st.text(max_size=8), st.just(item[1]), max_size=3).map(
            lambda values: ({"type": "map", "values": item[0]}, values)
        )
    )
    return st.one_of(primitives, arrays, maps)


_record_names = iter(range(10**9))


def hostile_avro(fields: list[str]) -> st.SearchStrategy[bytes]:
    """A valid Avro container file of one record with (some of) ``fields``, each of an arbitrary type."""

    def encode(chosen: list[tuple[str, tuple[Any, Any]]]) -> bytes:
        schema = {
            "type": "record",
            "name": f"Hostile{next(_record_names)}",
            "fields": [{"name": name, "type": kind} for name, (kind, _) in chosen],
        }
        buffer = io.BytesIO()
        fastavro.writer(buffer, fastavro.parse_schema(schema), [{n: v for n, (_, v) in chosen}])
        return buffer.getvalue()

    field_values = st.lists(
        st.tuples(st.sampled_from(fields), _avro_value()),
        max_size=len(fields),
        unique_by=lambda item: item[0],
    )
    return field_values.map(encode)


def hostile_json() -> st.SearchStrategy[bytes]:
    """Valid JSON of any shape (and a few pathological ones)."""
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
        ),
        max_leaves=12,
    )
    return st.one_of(
        values.map(lambda v: json.dumps(v).encode()),
        st.sampled_from([b"[" * 3_000, b'{"a":' * 2_000, b"1" * 5_000, b"\xff\xfe", b""]),  # nested past
        # the interpreter's recursion limit
    )


def any_bytes() -> st.SearchStrategy[bytes]:
    return st.binary(max_size=512)


# -- instants and timelines --------------------------------------------------------------------------


@FUZZ
@given(st.text(max_size=60) | st.from_regex(r"\A[0-9_.a-z]{0,50}\Z"))
def test_instant_parse_raises_only_invalid_instant_error(name: str) -> None:
    try:
        instant = Instant.parse(name)
    except InvalidInstantError:
        return
    # whatever parses is an instant in its one canonical form
    assert instant.file_name == name
    assert name.isascii()
    assert from_millis(to_millis(instant.requested_time)) == instant.requested_time


@FUZZ
@given(
    st.integers(0, 253402300799999 - 10**6),
    st.sampled_from(list(Action)),
    st.sampled_from(list(State)),
    st.integers(0, 10**6),
)
def test_instant_file_names_round_trip(millis: int, action: Action, state: State, later: int) -> None:
    completion = from_millis(millis + later) if state is State.COMPLETED else None
    instant = Instant(from_millis(millis), action, state, completion)
    assert Instant.parse(instant.file_name) == instant
    assert to_millis(instant.requested_time) == millis


@FUZZ
@given(st.integers(253402300799999 + 1, 2**70) | st.integers(-(2**70), -62135596800000 - 1))
def test_times_outside_years_1_to_9999_are_invalid_instants(millis: int) -> None:
    with pytest.raises(InvalidInstantError):
        from_millis(millis)


def test_an_instant_at_the_end_of_time_stops_writers_with_a_clear_error(tmp_path: Path) -> None:
    table = _new_table(tmp_path)
    table.storage.write(f"{TIMELINE_DIR}/99991231235959999.commit.requested", b"")
    with pytest.raises(InvalidInstantError, match="years 1 to 9999"):
        LocalWriter(table).insert(_rows(["a"]))


GARBAGE_NAMES = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]), min_size=1, max_size=40
).filter(lambda n: n not in (".", "..") and not n.startswith("."))


@FUZZ
@given(names=st.lists(GARBAGE_NAMES, max_size=6, unique=True))
def test_garbage_names_in_the_timeline_are_skipped_with_a_warning(
    names: list[str], tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    table = _new_table(tmp_path_factory.mktemp("t"))
    committed = LocalWriter(table).insert(_rows(["k1"]))
    garbage = []
    for name in names:
        try:
            Instant.parse(name)
            continue  # a real instant name: not garbage
        except InvalidInstantError:
            pass
        if name.endswith(".crc"):
            continue
        try:
            table.storage.write(f"{TIMELINE_DIR}/{name}", b"garbage")
        except Exception:  # the file system refuses the name (too long for it, ...)
            continue
        garbage.append(name)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        timeline = Timeline.load(table.storage)
        follower = TimelineFollower(table)
        followed = follower.start()
    assert [i.requested_time for i in timeline] == [committed.requested_time]
    assert {i.requested_time for i in followed} == {committed.requested_time}
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for name in garbage:
        assert name in warned, f"{name!r} was skipped without a warning"


# -- hoodie.properties --------------------------------------------------------------------------------

VALID_PROPERTIES = (
    b"hoodie.table.name=t\nhoodie.table.type=COPY_ON_WRITE\nhoodie.table.version=8\n"
    b"hoodie.timeline.layout.version=2\nhoodie.table.recordkey.fields=id\n"
)


@FUZZ
@example(data=VALID_PROPERTIES + b"cowrite.read.filters=" + b"[" * 3000 + b"\n")  # nested past the
# recursion limit in a key the registry parses as JSON
@example(data=VALID_PROPERTIES + b"hoodie.table.version=9\n")
@given(data=any_bytes() | mutated(VALID_PROPERTIES) | st.text(max_size=200).map(str.encode))
def test_properties_parse_or_raise_invalid_table_properties(
    data: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    try:
        parse_properties(data, "p")
    except InvalidTablePropertiesError:
        pass
    root = tmp_path_factory.mktemp("t")
    (root / ".hoodie").mkdir()
    (root / PROPERTIES_FILE).write_bytes(data)
    try:
        table = Table.open(Storage.for_uri(str(root)))
    except (InvalidTablePropertiesError, TableNotFoundError):
        return
    assert table.name and table.record_key_fields


# -- Avro timeline files ------------------------------------------------------------------------------


def _valid_commit() -> bytes:
    stat = WriteStat("f1-0", "p0/f1-0_0-0-0_20260101120000000.parquet", "p0", "null", 1, 1, 0, 0, 100)
    return CommitMetadata("upsert", (stat,), {"p0": ("f0-0",)}, '{"type": "record"}', {"k": "v"}).to_bytes(
        Action.REPLACE_COMMIT
    )


COMMIT_FIELDS = [
    "partitionToWriteStats",
    "extraMetadata",
    "version",
    "operationType",
    "partitionToReplaceFileIds",
]


def _well_typed_commit(metadata: CommitMetadata) -> None:
    assert isinstance(metadata.operation, str) and isinstance(metadata.schema, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.extra.items())
    for stat in metadata.write_stats:
        assert all(
            isinstance(v, str) for v in (stat.file_id, stat.path, stat.partition_path, stat.prev_commit)
        )
        assert all(
            type(v) is int
            for v in (
                stat.num_writes,
                stat.num_inserts,
                stat.num_update_writes,
                stat.num_deletes,
                stat.file_size,
            )
        )
    for partition, ids in metadata.replaced_file_ids.items():
        assert isinstance(partition, str) and all(isinstance(i, str) for i in ids)
    assert isinstance(metadata.touched_file_groups, frozenset)


@FUZZ
@given(data=any_bytes() | mutated(_valid_commit()) | hostile_avro(COMMIT_FIELDS))
def test_commit_metadata_is_parsed_or_refused(data: bytes) -> None:
    try:
        metadata = CommitMetadata.from_bytes(data, "c.commit")
    except CorruptTimelineError as exc:
        assert "c.commit" in str(exc)
        return
    _well_typed_commit(metadata)


WRITE_STAT_FIELDS = [
    "fileId",
    "path",
    "prevCommit",
    "numWrites",
    "numDeletes",
    "numUpdateWrites",
    "numInserts",
    "partitionPath",
    "fileSizeInBytes",
]


@FUZZ
@given(
    stats=st.lists(
        st.fixed_dictionaries({}, optional={n: _avro_value(0) for n in WRITE_STAT_FIELDS}),
        min_size=1,
        max_size=2,
    )
)
def test_hostile_write_stats_are_refused(stats: list[dict[str, tuple[Any, Any]]]) -> None:
    """Write stats of the right container type whose fields have the wrong types."""
    names = sorted({n for s in stats for n in s})
    kinds = {n: next(s[n][0] for s in stats if n in s) for n in names}
    stats = [s for s in stats if all(s[n][0] == kinds[n] for n in s)]
    stat_schema = {
        "type": "record",
        "name": "Stat",
        "fields": [{"name": n, "type": ["null", kinds[n]], "default": None} for n in names],
    }
    schema = {
        "type": "record",
        "name": "HoodieCommitMetadata",
        "fields": [
            {
                "name": "partitionToWriteStats",
                "type": {"type": "map", "values": {"type": "array", "items": stat_schema}},
            }
        ],
    }
    buffer = io.BytesIO()
    fastavro.writer(
        buffer,
        fastavro.parse_schema(schema),
        [{"partitionToWriteStats": {"p0": [{n: v for n, (_, v) in s.items()} for s in stats]}}],
    )
    try:
        metadata = CommitMetadata.from_bytes(buffer.getvalue(), "c.commit")
    except CorruptTimelineError:
        return
    _well_typed_commit(metadata)


SERVICE_FILES: list[tuple[Callable[[bytes, str], Any], bytes, list[str]]] = [
    (
        RollbackPlan.from_bytes,
        RollbackPlan(TIME, "commit", ("p0/a_1_20260101120000000.parquet",)).to_bytes(),
        ["instantToRollback", "filesToDelete", "version"],
    ),
    (
        RollbackResult.from_bytes,
        RollbackResult(LATER, 3, TIME, ("p0/a.parquet",)).to_bytes(),
        ["startRollbackTime", "timeTakenInMillis", "totalFilesDeleted", "commitsRollback", "deletedFiles"],
    ),
    (
        CleanPlan.from_bytes,
        CleanPlan(TIME, ("p0/a.parquet",)).to_bytes(),
        ["earliestInstantToRetain", "policy", "filesToDelete", "version"],
    ),
]


@FUZZ
@pytest.mark.parametrize(
    ("parse", "valid", "fields"), SERVICE_FILES, ids=["rollback-plan", "rollback-result", "clean-plan"]
)
@given(choice=st.data())
def test_rollback_and_clean_files_are_parsed_or_refused(
    parse: Callable[[bytes, str], Any], valid: bytes, fields: list[str], choice: st.DataObject
) -> None:
    data = choice.draw(
        any_bytes()
        | mutated(valid)
        | hostile_avro(fields)
        | hostile_avro(["instantToRollback"]).map(lambda b: b)
    )
    try:
        parsed = parse(data, "x.rollback.requested")
    except CorruptTimelineError:
        return
    for name, value in vars(parsed).items():
        if isinstance(value, tuple):
            assert all(isinstance(item, str) for item in value), (name, value)
        else:
            assert isinstance(value, str | int) and not isinstance(value, bool), (name, value)


def _valid_overlay() -> bytes:
    entry = CommitEntry(
        TIME, LATER, "commit", (("p0", "f1-0", "p0/f1-0_0-0-0_20260101120000000.parquet"),), ()
    )
    return Overlay((entry,), LATER, None).to_bytes()


@FUZZ
@given(data=any_bytes() | mutated(_valid_overlay()) | hostile_json())
def test_overlay_is_parsed_or_refused(data: bytes) -> None:
    try:
        overlay = Overlay.from_bytes(data, "overlay.json")
    except CorruptTimelineError:
        return
    for entry in overlay.entries:
        assert all(isinstance(x, str) for item in entry.written for x in item)
        assert all(len(item) == 3 for item in entry.written)


# -- lock and heartbeat payloads -----------------------------------------------------------------------


@FUZZ
@given(data=any_bytes() | hostile_json() | mutated(LockHolder(owner="h:1:x", instant=TIME).to_bytes()))
def test_lock_payloads_are_parsed_or_refused(data: bytes) -> None:
    try:
        holder = LockHolder.from_bytes(data, "lock1.acquired")
    except CorruptTimelineError:
        return
    assert isinstance(holder.owner, str) and (holder.instant is None or isinstance(holder.instant, str))


@FUZZ
@given(data=any_bytes() | hostile_json())
def test_heartbeat_payloads_never_raise(data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    storage = Storage.for_uri(str(tmp_path_factory.mktemp("t")))
    storage.write(heartbeat_path(TIME), data)
    reason = abort_reason(storage, TIME)
    assert reason is None or isinstance(reason, str)


# -- the daemon over corrupt files --------------------------------------------------------------------


def _rows(ids: list[str], part: str = "p0", ts: int = 1) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "part": pa.array([part] * len(ids), pa.string()),
            "ts": pa.array([ts] * len(ids), pa.int64()),
            "value": pa.array(["v"] * len(ids), pa.string()),
        }
    )


FAST = {
    keys.HEARTBEAT_INTERVAL_MS.key: "200",
    keys.HEARTBEAT_TOLERABLE_MISSES.key: "2",
    keys.LEASE_SAFETY_MARGIN_MS.key: "100",
    keys.CLEANER_COMMITS_RETAINED.key: "10",
}  # every version is
# retained: whatever the daemon deletes of a commit's files is a bug


def _new_table(root: Path) -> Table:
    return Table.create(
        str(root / "table"),
        name="fuzz",
        record_key_fields=["id"],
        partition_fields=["part"],
        ordering_fields=["ts"],
        properties=FAST,
    )


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
    table = _new_table(tmp_path_factory.mktemp("t"))
    writer = LocalWriter(table)
    writer.insert(_rows(["a", "b"]))
    writer.upsert(_rows(["a"], ts=2))
    writer.insert(_rows(["c"], part="p1"))
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
    elif kind == "overlay":
        table.storage.write(".hoodie/.cowrite/end_commit_time.json", data)
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
    table = _new_table(tmp_path_factory.mktemp("served"))
    LocalWriter(table).insert(_rows(["a"]))
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
