"""Instants: the events of the timeline, and their file names in ``.hoodie/timeline/``.

An instant is identified by its *requested time*; it moves through REQUESTED -> INFLIGHT -> COMPLETED and
each step is a new file (timeline layout 2, table version 8)::

    20260101120000000.commit.requested         requested
    20260101120000000.inflight                 inflight ("commit" alone drops its action here)
    20260101120000000_20260101120005123.commit completed at 20260101120005123

Times are ``yyyyMMddHHmmssSSS`` in UTC: as strings they sort exactly like the moments they name, so the
string is the one canonical form of a time in cowrite; :func:`to_millis`/:func:`from_millis` convert.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from cowrite.errors import CowriteError
from cowrite.process import memo

_TIME = re.compile(r"[0-9]{17}")


class InvalidInstantError(CowriteError, ValueError):
    """A string is not an instant time or an instant file name."""


# 0001-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z: the moments 17 digits can name
_MIN_MILLIS = -62135596800000
_MAX_MILLIS = 253402300799999


def from_millis(millis: int) -> str:
    """The instant time of a moment given in milliseconds since the epoch (UTC).

    Raises :class:`InvalidInstantError` outside years 1 to 9999 (a timeline holding an instant at the end
    of time leaves no later time to take).
    """
    if not _MIN_MILLIS <= millis <= _MAX_MILLIS:
        raise InvalidInstantError(f"{millis} ms since the epoch has no instant time (years 1 to 9999)")
    moment = datetime.fromtimestamp(millis // 1000, tz=UTC)
    return f"{moment.year:04d}{moment.strftime('%m%d%H%M%S')}{millis % 1000:03d}"


def to_millis(time: str) -> int:
    """Milliseconds since the epoch of an instant time."""
    moment = _moment(check_time(time)).replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1000 + int(time[14:])


def check_time(time: str) -> str:
    """Return ``time`` if it is a valid instant time, else raise :class:`InvalidInstantError`."""
    if not isinstance(time, str):
        raise InvalidInstantError(f"{time!r} is not an instant time (yyyyMMddHHmmssSSS, 17 digits)")
    return _checked(time)


def _checked(time: str) -> str:
    # Called for both times of every instant made, so cheap without a cache of times: the calendar is
    # checked once per hour named (a timeline's times fall in few), minutes and seconds by their digits;
    # a time that fails that is checked in full, which says what is wrong with it.
    if not _TIME.fullmatch(time):
        raise InvalidInstantError(f"{time!r} is not an instant time (yyyyMMddHHmmssSSS, 17 digits)")
    if not (_an_hour(time[:10]) and time[10:12] < "60" and time[12:14] < "60"):
        try:
            _moment(time)
        except ValueError as exc:
            raise InvalidInstantError(f"{time!r} is not a valid date and time: {exc}") from None
    return time


@memo(1 << 12, "a pure check of an hour (yyyyMMddHH)")
def _an_hour(hour: str) -> bool:
    try:
        datetime(int(hour[0:4]), int(hour[4:6]), int(hour[6:8]), int(hour[8:10]))
    except ValueError:
        return False
    return True


def _moment(time: str) -> datetime:
    # datetime's constructor checks the calendar as strptime does, at a tenth of its cost
    return datetime(
        int(time[0:4]), int(time[4:6]), int(time[6:8]), int(time[8:10]), int(time[10:12]), int(time[12:14])
    )


class Action(enum.StrEnum):
    COMMIT = "commit"
    REPLACE_COMMIT = "replacecommit"
    CLEAN = "clean"
    ROLLBACK = "rollback"

    @property
    def writes_data(self) -> bool:
        """Whether completed instants of this action make base files visible."""
        return self in DATA_ACTIONS


DATA_ACTIONS = frozenset((Action.COMMIT, Action.REPLACE_COMMIT))  # whose completed instants show base files


class State(enum.IntEnum):
    REQUESTED = 0
    INFLIGHT = 1
    COMPLETED = 2


@dataclass(frozen=True)
class Instant:
    """One state of one instant. Ordered by requested time, then state."""

    requested_time: str
    action: Action
    state: State
    completion_time: str | None = None

    def __post_init__(self) -> None:
        check_time(self.requested_time)
        if (self.state is State.COMPLETED) != (self.completion_time is not None):
            raise InvalidInstantError("an instant has a completion time exactly when it is completed")
        if self.completion_time is not None:
            check_time(self.completion_time)

    def _key(self) -> tuple[str, int]:
        return (self.requested_time, self.state)

    def __lt__(self, other: Instant) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Instant) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Instant) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Instant) -> bool:
        return self._key() >= other._key()

    @property
    def is_completed(self) -> bool:
        return self.state is State.COMPLETED

    def transition(self, state: State, completion_time: str | None = None) -> Instant:
        """The same instant in a later state."""
        if state <= self.state:
            raise InvalidInstantError(f"{self} cannot move back to {state.name}")
        return replace(self, state=state, completion_time=completion_time)

    @property
    def file_name(self) -> str:
        if self.state is State.COMPLETED:
            return f"{self.requested_time}_{self.completion_time}.{self.action}"
        if self.state is State.INFLIGHT and self.action is Action.COMMIT:
            return f"{self.requested_time}.inflight"
        return f"{self.requested_time}.{self.action}.{self.state.name.lower()}"

    @staticmethod
    def parse(file_name: str, remember: bool = True) -> Instant:
        """The instant named by a timeline file name; raises :class:`InvalidInstantError`. ``remember``
        keeps it for the next parse of the name (writers list the timeline several times per commit); a
        reader that sees each name once, as the daemon's follower does, passes False, so that a long
        history neither fills that cache nor pays for it."""
        return (_remembered if remember else _parse)(file_name)

    def __str__(self) -> str:
        return self.file_name


def _parse(file_name: str) -> Instant:
    times, _, suffix = file_name.partition(".")
    parts = suffix.split(".")
    try:
        if parts == ["inflight"]:
            action, state = Action.COMMIT, State.INFLIGHT
        elif len(parts) == 1:
            action, state = Action(parts[0]), State.COMPLETED
        elif len(parts) == 2 and parts[1] in ("requested", "inflight"):
            action, state = Action(parts[0]), State[parts[1].upper()]
        else:
            raise ValueError(suffix)
    except ValueError:
        raise InvalidInstantError(f"{file_name!r} is not a timeline file name") from None
    requested, underscore, completion = times.partition("_")
    if bool(underscore) != (state is State.COMPLETED):
        raise InvalidInstantError(
            f"{file_name!r}: completed instants, and only they, carry a completion time"
        )
    return Instant(requested, action, state, completion if underscore else None)  # which checks the times


_remembered = memo(1 << 16, "a pure parse; writers list the timeline several times per commit")(_parse)
