"""A write's plan drafted before the timeline it begins on is listed (object stores), and a write that goes
ahead of that listing.

A plan names every base file a write may create and exists before any of them, so a failed write is rolled
back from it. On an object store the local engine drafts it beside its claim, from the timeline its process
knew, and writes it beside the listing after the claim, which confirms it or sends the writer to plan again
(:meth:`~cowrite.protocol.transaction.Transaction.begin`). A process that knows the files of the partitions
it writes drafts it before the claim instead, which carries it, and goes ahead: its one file and one try for
the lock's next turn are made beside that listing, so its commit takes three round trips one after another
(the claim; the listing, the plan, the file and the turn; the completed file) where it took four.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from cowrite.format.claims import Ahead
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action
from cowrite.storage.backend import Storage
from cowrite.storage.together import beside


class Drafts:
    """The plans drafted for one write, by the instant time each names, with when each was made (the plan
    judges see is no older)."""

    def __init__(self, action: Action, draft: Callable[[str], CommitMetadata | None] | None) -> None:
        self._action, self._draft = action, draft
        self.made: dict[str, tuple[CommitMetadata, float]] = {}

    def __call__(self, time_: str) -> CommitMetadata | None:
        """The plan for a claim of ``time_``, drafted once, or None."""
        if self._draft is not None and time_ not in self.made and (planned := self._draft(time_)) is not None:
            self.made[time_] = planned, time.time()
        return self.made[time_][0] if time_ in self.made else None

    def content(self, time_: str) -> bytes | None:
        """What ``.inflight`` holds for a claim of ``time_`` that stood: its plan, where one was drafted."""
        return self.made[time_][0].to_bytes(self._action) if time_ in self.made else None

    def ahead(
        self,
        storage: Storage,
        write: Callable[[str], object],
        turn: Callable[[str], object],
        give_back: Callable[[], object],
    ) -> Ahead:
        """Going ahead of the listing where the plan writes one file, so that the lock, taken beside that
        file, is never held over more than one upload: ``write(time)`` writes it beside ``turn(time)``, a
        try for the lock's next turn, which a claim withdrawn since gives back."""

        def one_file(time_: str) -> CommitMetadata | None:
            planned = self(time_)
            return planned if planned is not None and len(planned.write_stats) == 1 else None

        def file_and_turn(time_: str) -> None:
            beside(storage, partial(write, time_), partial(turn, time_))

        return Ahead(one_file, file_and_turn, give_back)
