"""Following a timeline as an event log.

Each poll compares the timeline directory's names with those of the last poll and parses only the new
ones. On local disk the storage keeps that listing current from the kernel's change events
(:meth:`~cowrite.storage.backend.Storage.watched_names`): a poll with nothing new is one comparison of
identity, and nothing is listed after the first look. Object stores have no events: one listing per
poll. A rollback deletes the failed instant's files: deletions are followed too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from cowrite.format.instant import Instant, InvalidInstantError
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR, Timeline, instant_named

log = logging.getLogger(__name__)


class TimelineFollower:
    """The current timeline of one table, kept up to date cheaply. Not thread-safe: one poller."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._listed: frozenset[str] = frozenset()
        self._names: dict[str, Instant] = {}
        self._timeline: Timeline | None = None  # built from _names when asked, kept until they change

    def start(self) -> list[Instant]:
        """Load the timeline; returns its instants (the events so far)."""
        return self.poll()[0]

    def poll(self) -> tuple[list[Instant], list[Instant]]:
        """(instant files that appeared, instant files that vanished) since the last poll."""
        listed = self.table.storage.watched_names(TIMELINE_DIR)
        if listed is self._listed:  # a kept listing is the same object until the directory changes
            return [], []
        previous, self._listed = self._listed, listed
        return self._add(sorted(listed - previous)), self._remove(previous - listed)

    @property
    def timeline(self) -> Timeline:
        if self._timeline is None:  # sorting tens of thousands of instants every poll would dominate it
            self._timeline = Timeline(self._names.values())
        return self._timeline

    # -- internals -------------------------------------------------------------------------------
    def _add(self, names: Iterable[str]) -> list[Instant]:
        added = []
        for name in names:
            if name in self._names:
                continue
            try:
                instant = instant_named(name)
            except InvalidInstantError as exc:
                log.warning("skipping %s in the timeline of %s: %s", name, self.table.uri, exc)
                continue
            if instant is None:
                continue
            self._names[name] = instant
            added.append(instant)
        if added:
            self._timeline = None
        return added

    def _remove(self, names: Iterable[str]) -> list[Instant]:
        removed = [self._names.pop(name) for name in list(names) if name in self._names]
        if removed:
            self._timeline = None
        return removed
