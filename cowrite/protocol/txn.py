"""Idempotent writes: an application id and a version carried by a write, as Delta's ``txnAppId`` /
``txnVersion`` and the checkpoint Hudi keeps in commit metadata.

A write that carries a :class:`Txn` commits only if its version is newer than the last version that
application committed; otherwise it commits nothing and raises :class:`TxnAlreadyCommittedError` (the
writers turn that into a return value). A job that replays a batch after a crash — its commit landed,
its own checkpoint did not — thus writes the batch once.

Every data commit a :class:`~cowrite.protocol.transaction.Transaction` publishes records, in one
``extraMetadata`` key (:data:`TXNS_KEY`), the last committed version of every application: the map of
the newest data commit carrying the key, read under the table lock, plus its own entry. So the last
version of every application is in the newest data commit, and a lookup reads that one file; it reads
older ones only past commits without the key (written by other Hudi writers, or by cowrite before this
feature). The key's value is a JSON object ``{app id: {"version": n, "instant": requested time}}``, the
instant being the commit that recorded that version; it is present, possibly ``{}``, in every data
commit cowrite publishes, so a lookup stops at the first commit it meets. Archival removes old commits
only: the newest, which carries the map forward, stays.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from cowrite.errors import ConfigError, CorruptTimelineError, TxnAlreadyCommittedError
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline, archived
from cowrite.protocol.carried import TXNS_KEY
from cowrite.protocol.sketch import carried_by

TXN_APP_ID_KEY = "cowrite.txn.app.id"  # the write's own application id and version, when it has them
TXN_VERSION_KEY = "cowrite.txn.version"

_completion_time = attrgetter("completion_time")


@dataclass(frozen=True)
class Txn:
    """An application id and a version of one write; raises :class:`ConfigError` unless the id is a
    non-empty string and the version a non-negative integer."""

    app_id: str
    version: int

    def __post_init__(self) -> None:
        if not isinstance(self.app_id, str) or not self.app_id.strip():
            raise ConfigError(
                f"a transaction's application id must be a non-empty string, not {self.app_id!r}"
            )
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 0:
            raise ConfigError(
                f"a transaction's version must be a non-negative integer, not {self.version!r} "
                f"(application {self.app_id})"
            )

    @classmethod
    def parse(cls, app_id: str | None, version: str | None, names: tuple[str, str]) -> Txn | None:
        """The txn that string options give (``names`` are the options' names, for the message): None
        when neither is given; :class:`ConfigError` when one is missing or a value is malformed."""
        if app_id is None and version is None:
            return None
        if app_id is None or version is None:
            missing = names[0] if app_id is None else names[1]
            raise ConfigError(f"{names[0]} and {names[1]} go together: {missing} is missing")
        if not app_id.strip():
            raise ConfigError(f"{names[0]} must be a non-empty string")
        try:
            number = int(version.strip())
        except ValueError:
            raise ConfigError(f"{names[1]} must be a non-negative integer, not {version!r}") from None
        if number < 0:
            raise ConfigError(f"{names[1]} must be a non-negative integer, not {version!r}")
        return cls(app_id, number)


@dataclass(frozen=True)
class Committed:
    """The last version an application committed, and the commit that recorded it (requested time)."""

    version: int
    instant: str


@dataclass(frozen=True)
class CommittedTxns:
    """The last committed version of every application, as the newest data commit carrying them says."""

    versions: Mapping[str, Committed] = field(default_factory=dict)

    @classmethod
    def of(cls, table: Table, timeline: Timeline) -> CommittedTxns:
        """The map of the data commit of ``timeline`` that completed last and carries :data:`TXNS_KEY`,
        or an empty one when none does. Reads commits newest first and stops at the first that carries
        it: one file, unless newer commits were written by writers that do not carry it; none where its
        note names what it carries (:func:`~cowrite.protocol.sketch.carried_by`).

        Raises :class:`CorruptTimelineError` for a commit whose map cannot be read (a write that goes on
        could forget every application's version), and what reading a commit raises.
        """
        for instant in _newest_first(timeline.data_commits()):
            text = carried_by(table, instant).txns
            if text is not None:
                return cls.from_json(text, table.storage.full_path(table.instant_path(instant)))
        return cls()

    @classmethod
    def from_json(cls, text: str, path: str) -> CommittedTxns:
        try:
            found = json.loads(text)
            if not isinstance(found, dict):
                raise ValueError("not a JSON object")
            versions = {}
            for app, entry in found.items():
                version, instant = entry["version"], entry["instant"]
                if not isinstance(version, int) or isinstance(version, bool) or not isinstance(instant, str):
                    raise ValueError(f"malformed entry of application {app!r}")
                versions[app] = Committed(version, instant)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise CorruptTimelineError(path, f"extraMetadata {TXNS_KEY} cannot be read ({exc})") from None
        return cls(versions)

    def to_json(self) -> str:
        return json.dumps(
            {app: {"version": c.version, "instant": c.instant} for app, c in sorted(self.versions.items())},
            separators=(",", ":"),
        )

    def with_commit(self, txn: Txn | None, instant_time: str) -> CommittedTxns:
        """The map a commit of ``instant_time`` carrying ``txn`` (if any) publishes."""
        if txn is None:
            return self
        return CommittedTxns({**self.versions, txn.app_id: Committed(txn.version, instant_time)})

    def check(self, txn: Txn, table: str, instant_time: str) -> None:
        """Raise :class:`TxnAlreadyCommittedError` if ``txn``'s version, or a newer one of its
        application, is committed."""
        last = self.versions.get(txn.app_id)
        if last is not None and txn.version <= last.version:
            raise TxnAlreadyCommittedError(
                table, instant_time, txn.app_id, txn.version, last.version, last.instant
            )

    def extra(self, txn: Txn | None) -> dict[str, str]:
        """The ``extraMetadata`` entries of a commit publishing this map and carrying ``txn``."""
        own = {TXN_APP_ID_KEY: txn.app_id, TXN_VERSION_KEY: str(txn.version)} if txn is not None else {}
        return {TXNS_KEY: self.to_json(), **own}


def _newest_first(commits: Timeline) -> Iterator[Instant]:
    """Completed ``commits`` by completion time, newest first. Asked under the table lock on every commit,
    and mostly for the newest only: that one is found in one pass, the rest sorted only if asked for."""
    newest = max(commits, key=_completion_time, default=None)
    if newest is not None:
        yield newest
        yield from sorted((i for i in commits if i is not newest), key=_completion_time, reverse=True)


def last_version(table: Table, app_id: str) -> Committed | None:
    """The last version application ``app_id`` committed on ``table`` (see :meth:`CommittedTxns.of`)."""
    return CommittedTxns.of(table, table.timeline()).versions.get(app_id)


def committing_instant(table: Table, refused: TxnAlreadyCommittedError) -> Instant | None:
    """The completed instant that committed the version ``refused`` names: on the active timeline, else
    in the archive; None when neither holds it any more."""
    for timeline in (table.timeline(), archived(table.storage)):
        instant = timeline.get(refused.committed_by)
        if instant is not None and instant.is_completed:
            return instant
    return None
