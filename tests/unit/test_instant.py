"""Instants are values: names round-trip, times convert exactly, bad names are rejected, order is fixed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cowrite.errors import CowriteError
from cowrite.format.instant import (
    Action,
    Instant,
    InvalidInstantError,
    State,
    check_time,
    from_millis,
    to_millis,
)

FIRST_MILLIS = int(datetime(1, 1, 1, tzinfo=UTC).timestamp() * 1000)
LAST_MILLIS = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp() * 1000) + 999


def _format(moment: datetime) -> str:
    return f"{moment.year:04d}{moment:%m%d%H%M%S}{moment.microsecond // 1000:03d}"


times = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999999)).map(
    _format
)


@st.composite
def instants(draw: st.DrawFn) -> Instant:
    state = draw(st.sampled_from(State))
    completion = draw(times) if state is State.COMPLETED else None
    return Instant(draw(times), draw(st.sampled_from(Action)), state, completion)


# -- file names ------------------------------------------------------------------------------------------
@given(instants())
def test_parse_of_file_name_round_trips(instant: Instant) -> None:
    assert Instant.parse(instant.file_name) == instant
    assert str(instant) == instant.file_name


@pytest.mark.parametrize(
    ("instant", "file_name"),
    [
        (Instant("20260101120000000", Action.COMMIT, State.REQUESTED), "20260101120000000.commit.requested"),
        (Instant("20260101120000000", Action.COMMIT, State.INFLIGHT), "20260101120000000.inflight"),
        (
            Instant("20260101120000000", Action.COMMIT, State.COMPLETED, "20260101120005123"),
            "20260101120000000_20260101120005123.commit",
        ),
        (
            Instant("20260101120000000", Action.REPLACE_COMMIT, State.REQUESTED),
            "20260101120000000.replacecommit.requested",
        ),
        (
            Instant("20260101120000000", Action.REPLACE_COMMIT, State.INFLIGHT),
            "20260101120000000.replacecommit.inflight",
        ),
        (
            Instant("20260101120000000", Action.REPLACE_COMMIT, State.COMPLETED, "20260101120000001"),
            "20260101120000000_20260101120000001.replacecommit",
        ),
        (Instant("20260101120000000", Action.CLEAN, State.INFLIGHT), "20260101120000000.clean.inflight"),
        (
            Instant("20260101120000000", Action.CLEAN, State.COMPLETED, "20260101120000002"),
            "20260101120000000_20260101120000002.clean",
        ),
        (
            Instant("20260101120000000", Action.ROLLBACK, State.REQUESTED),
            "20260101120000000.rollback.requested",
        ),
        (
            Instant("20260101120000000", Action.ROLLBACK, State.COMPLETED, "20260101120000003"),
            "20260101120000000_20260101120000003.rollback",
        ),
    ],
)
def test_file_names_follow_timeline_layout_2(instant: Instant, file_name: str) -> None:
    assert instant.file_name == file_name
    assert Instant.parse(file_name) == instant


@pytest.mark.parametrize(
    "name",
    [
        "",
        "garbage",
        ".commit",
        "hoodie.properties",
        "2026010112000000.commit.requested",  # 16 digits
        "202601011200000000.commit.requested",  # 18 digits
        "2026010112000000a.commit.requested",  # not a digit
        "20261301120000000.commit.requested",  # month 13
        "20260230120000000.commit.requested",  # 30 February
        "20260101250000000.commit.requested",  # hour 25
        "20260101126000000.commit.requested",  # minute 60
        "00000101120000000.commit.requested",  # year 0
        "٢٠٢٦٠١٠١١٢٠٠٠٠٠٠٠.commit.requested",  # Arabic-Indic digits are digits to \d, not to Hudi
        "20260101120000000.deltacommit.requested",  # not a COPY_ON_WRITE action
        "20260101120000000.compaction.requested",
        "20260101120000000.commit.completed",
        "20260101120000000.commit.requested.crc",
        "20260101120000000.commit",  # completed without a completion time (layout 1)
        "20260101120000000_20260101120000001.commit.requested",  # completion time on a pending instant
        "20260101120000000_20260101120000001.inflight",
        "20260101120000000_20260101120000001.replacecommit.inflight",
        "20260101120000000_2026.commit",  # bad completion time
        "20260101120000000_20261301120000001.commit",  # completion month 13
        "20260101120000000__20260101120000001.commit",
        "_20260101120000001.commit",
        "20260101120000000.inflight.commit",
        "20260101120000000.COMMIT.REQUESTED",
    ],
)
def test_invalid_names_raise_invalid_instant_error(name: str) -> None:
    with pytest.raises(InvalidInstantError):
        Instant.parse(name)


@given(st.text(max_size=60))
def test_parse_accepts_nothing_but_instants(name: str) -> None:
    try:
        instant = Instant.parse(name)
    except InvalidInstantError:
        return
    assert instant.file_name == name or name == f"{instant.requested_time}.commit.inflight"


def test_constructor_rejects_inconsistent_states() -> None:
    with pytest.raises(InvalidInstantError):
        Instant("20260101120000000", Action.COMMIT, State.REQUESTED, "20260101120000001")
    with pytest.raises(InvalidInstantError):
        Instant("20260101120000000", Action.COMMIT, State.INFLIGHT, "20260101120000001")
    with pytest.raises(InvalidInstantError):
        Instant("20260101120000000", Action.COMMIT, State.COMPLETED)
    with pytest.raises(InvalidInstantError):
        Instant("2026", Action.COMMIT, State.REQUESTED)
    with pytest.raises(InvalidInstantError):
        Instant("20260101120000000", Action.COMMIT, State.COMPLETED, "20261301120000000")


def test_invalid_instant_error_is_a_cowrite_error() -> None:
    # errors.py: "Every error cowrite raises on purpose derives from CowriteError" — callers catch one root.
    assert issubclass(InvalidInstantError, CowriteError)
    assert issubclass(InvalidInstantError, ValueError)


# -- times -----------------------------------------------------------------------------------------------
def test_known_times() -> None:
    assert from_millis(0) == "19700101000000000"
    assert from_millis(1767268805123) == "20260101120005123"
    assert to_millis("20260101120005123") == 1767268805123
    assert from_millis(-1) == "19691231235959999"
    assert to_millis("99991231235959999") == LAST_MILLIS


@given(st.integers(min_value=FIRST_MILLIS, max_value=LAST_MILLIS))
@example(FIRST_MILLIS)
@example(LAST_MILLIS)
@example(0)
@example(-1)
def test_from_millis_and_to_millis_round_trip(millis: int) -> None:
    time = from_millis(millis)
    assert check_time(time) == time
    assert to_millis(time) == millis


@given(times)
def test_to_millis_and_from_millis_round_trip(time: str) -> None:
    assert from_millis(to_millis(time)) == time


@given(times, times)
def test_time_strings_sort_like_their_moments(a: str, b: str) -> None:
    assert (a < b) == (to_millis(a) < to_millis(b))


@pytest.mark.parametrize("bad", ["", "2026", "20260101120000000 ", "2026-01-01T12:00", "20260231000000000"])
def test_bad_times_raise(bad: str) -> None:
    with pytest.raises(InvalidInstantError):
        check_time(bad)
    with pytest.raises(InvalidInstantError):
        to_millis(bad)


# -- order and transitions -------------------------------------------------------------------------------
def test_states_are_ordered() -> None:
    assert State.REQUESTED < State.INFLIGHT < State.COMPLETED


def test_order_is_requested_time_then_state() -> None:
    early_done = Instant("20260101120000000", Action.COMMIT, State.COMPLETED, "20260101130000000")
    late_requested = Instant("20260101120000001", Action.CLEAN, State.REQUESTED)
    same_requested = Instant("20260101120000000", Action.COMMIT, State.REQUESTED)
    same_inflight = Instant("20260101120000000", Action.COMMIT, State.INFLIGHT)
    shuffled = [late_requested, early_done, same_inflight, same_requested]
    assert sorted(shuffled) == [same_requested, same_inflight, early_done, late_requested]
    assert same_requested < same_inflight < early_done < late_requested
    assert late_requested > early_done >= early_done
    assert same_requested <= same_requested


@given(st.lists(instants(), max_size=12))
def test_sorting_equals_sorting_by_requested_time_and_state(found: list[Instant]) -> None:
    keys = [(i.requested_time, i.state) for i in sorted(found)]
    assert keys == sorted(keys)


def test_transition_moves_forward_only() -> None:
    requested = Instant("20260101120000000", Action.COMMIT, State.REQUESTED)
    inflight = requested.transition(State.INFLIGHT)
    done = inflight.transition(State.COMPLETED, "20260101120000005")
    assert (inflight.file_name, done.file_name) == (
        "20260101120000000.inflight",
        "20260101120000000_20260101120000005.commit",
    )
    assert done.is_completed and not inflight.is_completed
    with pytest.raises(InvalidInstantError):
        done.transition(State.INFLIGHT)
    with pytest.raises(InvalidInstantError):
        inflight.transition(State.INFLIGHT)
    with pytest.raises(InvalidInstantError):
        inflight.transition(State.COMPLETED)  # no completion time


def test_instants_are_hashable_values() -> None:
    a = Instant("20260101120000000", Action.COMMIT, State.REQUESTED)
    b = Instant.parse("20260101120000000.commit.requested")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.requested_time = "20260101120000001"  # type: ignore[misc]


def test_writes_data_only_for_commit_and_replacecommit() -> None:
    assert [a for a in Action if a.writes_data] == [Action.COMMIT, Action.REPLACE_COMMIT]
