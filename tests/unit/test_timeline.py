"""Timeline snapshots and their views: states, actions, completion order, identity, stray files."""

from __future__ import annotations

import logging

import pytest

from cowrite.format.instant import Action, Instant, InvalidInstantError, State
from cowrite.format.timeline import TIMELINE_DIR, InstantRange, Timeline
from cowrite.storage.backend import Storage


def requested(t: str, action: Action = Action.COMMIT) -> Instant:
    return Instant(t, action, State.REQUESTED)


def inflight(t: str, action: Action = Action.COMMIT) -> Instant:
    return Instant(t, action, State.INFLIGHT)


def done(t: str, completion: str, action: Action = Action.COMMIT) -> Instant:
    return Instant(t, action, State.COMPLETED, completion)


T1, T2, T3, T4, T5, T6 = (f"2026010112000000{i}" for i in range(1, 7))
C = {i: f"2026010113000000{i}" for i in range(1, 10)}

# Requested order T1..T6; completion order differs: T2 completed first, then T1, then T4 (a clean), T3.
# T5 is inflight, T6 requested; every completed instant also left its .requested and .inflight behind.
FILES = [
    requested(T1), inflight(T1), done(T1, C[2]),
    requested(T2, Action.REPLACE_COMMIT), inflight(T2, Action.REPLACE_COMMIT),
    done(T2, C[1], Action.REPLACE_COMMIT),
    requested(T3), inflight(T3), done(T3, C[5]),
    requested(T4, Action.CLEAN), inflight(T4, Action.CLEAN), done(T4, C[3], Action.CLEAN),
    requested(T5), inflight(T5),
    requested(T6, Action.ROLLBACK),
]  # fmt: skip

LATEST = [
    done(T1, C[2]),
    done(T2, C[1], Action.REPLACE_COMMIT),
    done(T3, C[5]),
    done(T4, C[3], Action.CLEAN),
    inflight(T5),
    requested(T6, Action.ROLLBACK),
]


@pytest.fixture
def timeline() -> Timeline:
    return Timeline(reversed(FILES))


def test_keeps_the_latest_state_per_requested_time_in_requested_order(timeline: Timeline) -> None:
    assert list(timeline) == LATEST
    assert len(timeline) == 6 and bool(timeline) and not Timeline(())
    assert timeline.first == done(T1, C[2])
    assert Timeline(()).first is None
    assert timeline.requested_times == frozenset({T1, T2, T3, T4, T5, T6})
    assert timeline.get(T5) == inflight(T5)
    assert timeline.get("20990101000000000") is None
    assert timeline.last == requested(T6, Action.ROLLBACK) and Timeline(()).last is None
    assert list(timeline.after(T4)) == LATEST[4:]
    assert list(timeline.after("20260101115959999")) == LATEST and not timeline.after(T6)


def test_state_views(timeline: Timeline) -> None:
    assert list(timeline.completed()) == LATEST[:4]
    assert list(timeline.pending()) == [inflight(T5), requested(T6, Action.ROLLBACK)]
    assert list(timeline.data_commits()) == [
        done(T1, C[2]),
        done(T2, C[1], Action.REPLACE_COMMIT),
        done(T3, C[5]),
    ]
    assert list(timeline.filter(actions=[Action.CLEAN])) == [done(T4, C[3], Action.CLEAN)]
    assert list(timeline.filter(states=[State.REQUESTED])) == [requested(T6, Action.ROLLBACK)]


def test_adding_instants_keeps_each_times_latest_state_as_building_anew_does(timeline: Timeline) -> None:
    # older states of times it holds, later ones, and new times, one of them in two states
    added = [requested(T1), requested(T3), done(T5, C[6]), inflight(T6, Action.ROLLBACK)]
    added += [requested(T6, Action.ROLLBACK), requested("20260101120000007")]
    added += [requested("20990101000000000"), inflight("20990101000000000")]
    grown = timeline.adding(added)
    assert list(grown) == list(Timeline([*timeline, *added]))
    assert grown.get(T1) == done(T1, C[2]) and grown.get(T5) == done(T5, C[6])
    assert grown.get(T6) == inflight(T6, Action.ROLLBACK)
    assert grown.get("20990101000000000") == inflight("20990101000000000")
    assert grown.get("20260101120000007") == requested("20260101120000007") and len(grown) == 8
    assert list(timeline) == LATEST  # the timeline added to is unchanged
    assert list(grown.data_commits()) == [*timeline.data_commits(), done(T5, C[6])]


def test_completion_order(timeline: Timeline) -> None:
    assert [i.requested_time for i in timeline.in_completion_order()] == [T2, T1, T4, T3]
    assert timeline.latest_completion_time == C[5]
    assert Timeline([requested(T1)]).latest_completion_time is None


def test_completed_in_ranges_by_completion_time(timeline: Timeline) -> None:
    def times(window: InstantRange) -> list[str]:
        return [i.requested_time for i in timeline.completed_in(window)]

    assert times(InstantRange.all()) == [T2, T1, T4, T3]
    assert times(InstantRange.since(C[1])) == [T1, T4, T3]  # start exclusive
    assert times(InstantRange.since(C[2])) == [T4, T3]
    assert times(InstantRange.until(C[3])) == [T2, T1, T4]  # end inclusive
    assert times(InstantRange.within(C[1], C[3])) == [T1, T4]
    assert times(InstantRange.within(C[3], C[4])) == []
    assert times(InstantRange.within(None, C[1])) == [T2]
    assert times(InstantRange.within(C[5], None)) == []
    # requested times are not completion times: a window of requested times selects nothing
    assert times(InstantRange.within(T1, T6)) == []


def test_requested_in_ranges_by_requested_time(timeline: Timeline) -> None:
    assert [i.requested_time for i in timeline.requested_in(InstantRange.within(T2, T5))] == [T3, T4, T5]


def test_completed_since_is_by_identity_not_by_clock(timeline: Timeline) -> None:
    # A writer that began when T2 and T4 were completed: T1 completed later although requested earlier.
    seen = frozenset({T2, T4})
    assert timeline.completed_since(seen) == [done(T1, C[2]), done(T3, C[5])]
    assert timeline.completed_since(timeline.completed().requested_times) == []
    assert timeline.completed_since(frozenset()) == LATEST[:4]


def test_instant_range_membership() -> None:
    window = InstantRange.within(T2, T4)
    assert [t for t in (T1, T2, T3, T4, T5) if t in window] == [T3, T4]
    assert None not in window and 5 not in window
    assert T1 in InstantRange.all()
    with pytest.raises(InvalidInstantError):
        InstantRange.since("yesterday")
    with pytest.raises(InvalidInstantError):
        InstantRange.until("2026")
    with pytest.raises(InvalidInstantError):
        InstantRange.within(T1, "20261301000000000")


def test_load_lists_instants_and_skips_stray_files(
    storage: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    for instant in FILES:
        storage.write(f"{TIMELINE_DIR}/{instant.file_name}", b"")
    stray = [
        "notes.txt",
        "20260101120000001.commit.requested.crc",
        "20260101120000009.deltacommit.requested",
        "20260101120000000_20260101120000001.commit.requested",
        ".hidden",
    ]
    for name in stray:
        storage.write(f"{TIMELINE_DIR}/{name}", b"x")
    storage.write(f"{TIMELINE_DIR}/history/20250101000000000_20250101000000001.commit", b"archived")
    storage.write(".hoodie/20250101000000000.commit.requested", b"")  # outside the timeline directory
    with caplog.at_level(logging.WARNING, logger="cowrite.format.timeline"):
        loaded = Timeline.load(storage)
    assert list(loaded) == LATEST
    warned = caplog.text
    for name in (
        "notes.txt",
        "deltacommit",
        ".hidden",
        "20260101120000000_20260101120000001.commit.requested",
    ):
        assert name in warned
    assert ".crc" not in warned  # checksum files are expected, not worth a warning


def test_loading_again_sees_exactly_what_was_added_and_removed(storage: Storage) -> None:
    def write(*instants: Instant) -> None:
        for instant in instants:
            storage.write(f"{TIMELINE_DIR}/{instant.file_name}", b"")

    write(*FILES)
    first = Timeline.load(storage)
    assert Timeline.load(storage) is first  # nothing changed: the same snapshot
    T7 = "20260101120000007"
    write(done(T5, C[6]), requested(T7))  # T5 completes, T7 begins
    assert list(Timeline.load(storage)) == [*LATEST[:4], done(T5, C[6]), LATEST[5], requested(T7)]
    for instant in (requested(T3), inflight(T3), done(T3, C[5])):  # archived or rolled back
        storage.delete(f"{TIMELINE_DIR}/{instant.file_name}")
    write(inflight(T7))
    assert list(Timeline.load(storage)) == [*LATEST[:2], LATEST[3], done(T5, C[6]), LATEST[5], inflight(T7)]
    assert list(first) == LATEST  # an earlier snapshot never changes


def test_two_claims_of_one_time_show_the_same_one_whatever_came_first(storage: Storage) -> None:
    """A time claimed by two actions (one claim left behind) shows one instant: the same in every process,
    or two cleaners could each miss what the other sees (names come in a set's order, per process)."""
    for first, second in (
        (requested(T1, Action.ROLLBACK), requested(T1)),
        (requested(T2), requested(T2, Action.ROLLBACK)),
    ):
        storage.write(f"{TIMELINE_DIR}/{first.file_name}", b"")
        assert Timeline.load(storage).get(first.requested_time) == first
        storage.write(f"{TIMELINE_DIR}/{second.file_name}", b"")
        assert Timeline.load(storage).get(first.requested_time) == requested(first.requested_time)
        storage.write(f"{TIMELINE_DIR}/{inflight(first.requested_time, Action.ROLLBACK).file_name}", b"")
        assert Timeline.load(storage).get(first.requested_time) == inflight(
            first.requested_time, Action.ROLLBACK
        )
    assert Timeline.shared_times(storage) == {T1, T2}


def test_load_of_an_empty_or_missing_timeline(storage: Storage) -> None:
    assert list(Timeline.load(storage)) == []


def test_repr_names_the_files() -> None:
    assert repr(Timeline([inflight(T1)])) == f"Timeline({T1}.inflight)"
