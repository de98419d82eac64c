"""Every error cowrite raises on purpose derives from :class:`CowriteError`.

Each subclass names one situation and its message says what to do about it. The split that matters most
for callers is *failed* versus *unknown*: a :class:`CommitFailedError` means the instant
definitely did not complete, so its garbage may be rolled back and the work retried under a new instant;
:class:`CommitStateUnknownError` means the outcome is unknown and the caller must reload the timeline and
look for its own instant before doing anything else.
"""

from __future__ import annotations

from collections.abc import Iterable


class CowriteError(Exception):
    """Root of all cowrite errors."""


class TableNotFoundError(CowriteError):
    """The path holds no table (no ``.hoodie/hoodie.properties``)."""


class TableExistsError(CowriteError):
    """``init`` was asked to create a table where one already exists."""


class InvalidTablePropertiesError(CowriteError):
    """``hoodie.properties`` is unreadable, incomplete or describes a table cowrite cannot serve."""


class ConfigError(CowriteError):
    """A configuration value is missing or malformed."""


class SchemaError(CowriteError):
    """Input data does not fit the table: a missing key column, a null key, an incompatible schema."""


class CorruptTimelineError(CowriteError):
    """A timeline file cannot be read: a truncated or garbage commit file, a malformed payload."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(
            f"corrupt timeline file {path}: {problem}. The file was not changed; inspect it, and if it "
            "belongs to an instant that never completed, `cowrite rollback` removes it"
        )
        self.path = path


class StorageError(CowriteError):
    """The storage backend failed (permission, network, unavailable service)."""


class InstantGoneError(StorageError):
    """A timeline file that a listing showed was removed before it was read: a concurrent rollback,
    archival or clean moved the timeline on. Nothing was changed; reload the timeline and retry."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} vanished while reading the timeline (archived or rolled back meanwhile); reload the "
            "timeline and retry"
        )
        self.path = path


class CommitFailedError(CowriteError):
    """The instant definitely did not complete; its data is invisible garbage and the write may be retried."""


class WriteConflictError(CommitFailedError):
    """Another instant that completed since this one began touched the same file groups."""

    def __init__(
        self, table: str, instant: str, winner: str, file_groups: Iterable[str], what: str = "file groups"
    ) -> None:
        groups = sorted(file_groups)
        shown = ", ".join(groups[:10]) + (f" (+{len(groups) - 10} more)" if len(groups) > 10 else "")
        super().__init__(
            f"write conflict on table {table}: instant {instant} and instant {winner} (which wins) "
            f"both changed {what} {shown}. Nothing of {instant} is visible; re-run the write, "
            "which starts a new instant"
        )
        self.table = table
        self.instant = instant
        self.winner = winner
        self.file_groups = groups


class LockTimeoutError(CommitFailedError):
    """The table lock could not be acquired within the configured wait."""


class LeaseLostError(CommitFailedError):
    """The writer's heartbeat expired or its lock was released by someone else; it must not publish."""


class TxnAlreadyCommittedError(CommitFailedError):
    """The write's application id and version were already committed, or a newer version of that
    application was: the write committed nothing, on purpose. Do not retry it; the batch is in the table
    (``committed_by`` names the instant that committed the application's last version)."""

    def __init__(
        self, table: str, instant: str, app_id: str, version: int, last_version: int, committed_by: str
    ) -> None:
        self.table = table
        self.instant = instant
        self.app_id = app_id
        self.version = version
        self.last_version = last_version
        self.committed_by = committed_by
        super().__init__(
            f"{self.summary} on table {table}: instant {instant} committed nothing (a retry would not either)"
        )

    @property
    def summary(self) -> str:
        """What was found, in one line without the table."""
        if self.version == self.last_version:
            return (
                f"application {self.app_id} version {self.version} was already committed by instant "
                f"{self.committed_by}"
            )
        return (
            f"application {self.app_id} version {self.version} is older than its version "
            f"{self.last_version}, already committed by instant {self.committed_by}"
        )


class CommitStateUnknownError(CowriteError):
    """Publishing may or may not have happened; reload the timeline and look for the instant first."""


class TimeTravelCleanedError(CowriteError):
    """A time travel to an instant whose file versions the cleaner may have deleted (Hudi refuses it too).

    Travel to the cleaner's earliest retained commit or later, or retain more commits
    (``hoodie.cleaner.commits.retained``).
    """


class BaseFileGoneError(CowriteError):
    """A base file that a read (or a write) planned to use was deleted before it got there."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"base file {path} was deleted before it was read: the cleaner keeps only the file versions "
            "the last hoodie.cleaner.commits.retained commits need. Retry a snapshot read or a write; end "
            "an incremental range at a later commit; or retain more commits"
        )
        self.path = path


class StreamDataLossError(CowriteError):
    """Commits a streaming query had still to read were archived, or their base files cleaned, first.

    Set ``failOnDataLoss=false`` to skip them and read on, or start a new query; keep more commits
    (``hoodie.keep.min.commits``, ``hoodie.cleaner.commits.retained``) so that a consumer can fall further
    behind.
    """


class CheckpointArchivedError(CowriteError):
    """Commits after an incremental consumer's checkpoint were archived: pulling on would skip them.

    The consumer fell behind archival; it has to start over from a snapshot.
    """
