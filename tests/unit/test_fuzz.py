"""Hostile input, property-based: every parser of stored bytes
(the daemon over the same input, and its HTTP endpoint: tests/integration/test_daemon_fuzz.py).

Every case ends in one of cowrite's typed errors, or is skipped with a logged warning: never another
exception, never a crash of the daemon, never the deletion of a committed file. Stored inputs come in three
flavours: arbitrary bytes; valid files mutated (flipped, cut, inserted bytes); and *well-formed files of
the wrong shape* (valid Avro with another writer schema, valid JSON of other types), which pass every
format check and must still be refused by their content.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzz import (
    COMMIT_FIELDS,
    FUZZ,
    LATER,
    TIME,
    any_bytes,
    avro_value,
    hostile_avro,
    hostile_json,
    mutated,
    new_table,
)
from support.tables import rows

from cowrite.daemon.follow import TimelineFollower
from cowrite.daemon.state import TableState
from cowrite.errors import (
    CorruptTimelineError,
    InvalidTablePropertiesError,
    TableNotFoundError,
)
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, InvalidInstantError, State, from_millis, to_millis
from cowrite.format.overlay import CommitEntry, Kind, LogFile, LogRecord
from cowrite.format.service_metadata import CleanPlan, RollbackPlan, RollbackResult
from cowrite.format.table import PROPERTIES_FILE, Table, parse_properties
from cowrite.format.timeline import TIMELINE_DIR, Timeline, instant_named
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import abort_reason, heartbeat_path
from cowrite.protocol.locks import LockHolder
from cowrite.storage.backend import Storage

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
    table = new_table(tmp_path)
    table.storage.write(f"{TIMELINE_DIR}/99991231235959999.commit.requested", b"")
    with pytest.raises(InvalidInstantError, match="years 1 to 9999"):
        LocalWriter(table).insert(rows(["a"]))


GARBAGE_NAMES = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]), min_size=1, max_size=40
).filter(lambda n: n not in (".", "..") and not n.startswith("."))


@FUZZ
@given(names=st.lists(GARBAGE_NAMES, max_size=6, unique=True))
def test_garbage_names_in_the_timeline_are_skipped_with_a_warning(
    names: list[str], tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    table = new_table(tmp_path_factory.mktemp("t"))
    committed = LocalWriter(table).insert(rows(["k1"]))
    garbage = []
    for name in names:
        try:
            instant_named(name)
            continue  # an instant, or not one by design (a checksum, the archive directory): not garbage
        except InvalidInstantError:
            pass
        try:
            table.storage.write(f"{TIMELINE_DIR}/{name}", b"garbage")
        except Exception:  # the file system refuses the name (too long for it, ...)
            continue
        garbage.append(name)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        timeline = Timeline.load(table.storage)
        followed = TableState()
        for event in TimelineFollower(table).look(followed):
            followed.apply(event)
    assert [i.requested_time for i in timeline] == [committed.requested_time]
    assert [i.requested_time for i in followed.timeline] == [committed.requested_time]
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
        st.fixed_dictionaries({}, optional={n: avro_value(0) for n in WRITE_STAT_FIELDS}),
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


OVERLAY_FILE = LogFile(LATER, 1, None, Kind.SEGMENT)


def _valid_overlay() -> bytes:
    entry = CommitEntry(
        TIME, LATER, "commit", (("p0", "f1-0", "p0/f1-0_0-0-0_20260101120000000.parquet"),), ()
    )
    return LogRecord(OVERLAY_FILE, None, None, (entry,)).to_bytes()


@FUZZ
@given(data=any_bytes() | mutated(_valid_overlay()) | hostile_json())
def test_overlay_is_parsed_or_refused(data: bytes) -> None:
    try:
        overlay = LogRecord.from_bytes(data, OVERLAY_FILE, OVERLAY_FILE.name)
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


