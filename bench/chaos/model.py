"""The expected table: the completed instants' batches, applied in commit order.

The plan's keys make this exact (see ``plan.py``): an update finds its seeded key in the file group every
concurrent updater of that key also touches, so overlapping updates are serialised by the conflict check;
fresh keys belong to one writer round; deleted keys are never written again; ``insert_overwrite`` owns its
partition. Applying batches in completion order therefore gives the one correct snapshot, rows carrying
the requested time of the instant that last wrote them (``_hoodie_commit_time``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .plan import Row, extra_value

Record = tuple[str, str, int, str, str]  # id, part, ts, value, _hoodie_commit_time


@dataclass
class Model:
    rows: dict[str, Record]
    removed: set[str]  # keys a completed delete or overwrite removed (incremental reads never see that)
    # key -> the extra column its stored version was written with (its value is ``extra_value`` of the
    # record's); a key absent here was written without one, and reads null in every column the rounds added
    extras: dict[str, str] = field(default_factory=dict)
    columns: set[str] = field(default_factory=set)  # the columns completed rounds added to the table

    @classmethod
    def seeded(cls, rows: Iterable[Row], instant: str) -> Model:
        return cls({r.id: (r.id, r.part, r.ts, r.value, instant) for r in rows}, set())

    def apply(self, op: str, rows: Iterable[Row], instant: str, column: str | None = None) -> set[str]:
        """Apply one completed instant; returns the keys whose stored version it wrote."""
        written: set[str] = set()
        rows = list(rows)
        if op == "delete":
            for row in rows:
                if self.rows.pop(row.id, None) is not None:
                    self.removed.add(row.id)
            return written
        if op == "insert_overwrite":
            for part in {r.part for r in rows}:
                for key in [k for k, record in self.rows.items() if record[1] == part]:
                    del self.rows[key]
                    self.removed.add(key)
        if column is not None:
            self.columns.add(column)
        for row in rows:
            stored = self.rows.get(row.id)
            # the larger ordering value wins; a tie goes to the newer write
            if op in ("upsert",) and stored is not None and stored[2] > row.ts:
                continue
            self.rows[row.id] = (row.id, row.part, row.ts, row.value, instant)
            self.removed.discard(row.id)
            if column is not None:
                self.extras[row.id] = column
            else:
                self.extras.pop(row.id, None)
            written.add(row.id)
        return written

    def column_values(self) -> dict[str, dict[str, str | None]]:
        """Each added column's value in every stored row: column -> key -> value (None: null)."""
        return {
            column: {
                key: extra_value(column, record[3]) if self.extras.get(key) == column else None
                for key, record in self.rows.items()
            }
            for column in self.columns
        }
