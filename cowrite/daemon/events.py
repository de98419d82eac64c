"""What the daemon learns about a table, one event at a time.

The follower (:mod:`cowrite.daemon.follow`) turns what storage shows into these events; the table's
state (:mod:`cowrite.daemon.state`) is their fold. Each event says what happened, never what to do about
it: decisions (roll back, expire a lock, append to the overlay) are taken from the state.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from cowrite.format.instant import Instant
from cowrite.format.overlay import CommitEntry
from cowrite.protocol.locks import LockHolder


class Change(enum.Enum):
    REQUESTED = "requested"
    INFLIGHT = "inflight"
    COMPLETED = "completed"
    REMOVED = "removed"


@dataclass(frozen=True)
class InstantChanged:
    """A timeline file appeared (``change`` is its state) or was removed."""

    change: Change
    file: Instant  # the instant as this file names it
    modified: float | None = None  # the file's modification time, where it was cheap to know
    # A completed data commit the overlay lacks: what incremental readers need of it, read once.
    entry: CommitEntry | None = None
    service_plan: bool = False  # a requested replacecommit holding a table service's plan (no writer)
    archived: bool = False  # removed by archival: its commit may be missing from the overlay from now on


@dataclass(frozen=True)
class HistoryFound:
    """What a table's first look found completed: the past, reported as one event rather than one per
    instant, because a long timeline is mostly that and the state folds it at once."""

    instants: tuple[Instant, ...]  # each as its completed file names it
    entries: Mapping[str, CommitEntry]  # requested time -> a data commit among them the overlay lacks


@dataclass(frozen=True)
class ArchiveRead:
    """Every instant of the archive file ``name`` (and of those before it) was reported."""

    name: str


@dataclass(frozen=True)
class LockAcquired:
    lock_id: int
    holder: LockHolder
    acquired_at: float | None  # modification time of ``lock<id>.acquired``, where the listing gave it


@dataclass(frozen=True)
class LockReleased:
    lock_id: int
    expired: bool  # by someone else, its holder judged stale


@dataclass(frozen=True)
class HeartbeatRenewed:
    instant: str
    at: float  # modification time of the heartbeat file
    aborted: str | None = None  # the reason its writer gave up, once it says so


@dataclass(frozen=True)
class HeartbeatGone:
    instant: str


@dataclass(frozen=True)
class OverlayAppended:
    """The daemon wrote a file of the END_COMMIT_TIME log (or found it at start): its own event."""

    watermark: str | None
    fence: str | None
    archived_through: str | None
    archive_seen: str | None
    entries: tuple[CommitEntry, ...] = ()


Event = (
    InstantChanged
    | HistoryFound
    | ArchiveRead
    | LockAcquired
    | LockReleased
    | HeartbeatRenewed
    | HeartbeatGone
    | OverlayAppended
)
