"""The END_COMMIT_TIME overlay: completed data commits in the order they completed (RFC-22 option 3).

With several writers, commits complete out of requested-time order; a consumer that checkpoints by
requested time would skip a slow commit that completes after its checkpoint moved past it. Completion
times are taken under the table lock, strictly increasing, so a consumer that checkpoints by completion
time and reads up to a *watermark* — the latest completion time of one consistent look at the timeline —
sees every commit exactly once.

The daemon keeps the overlay in :data:`OVERLAY_PATH` (JSON, replaced whole): each entry is a completed
commit with the base files it wrote and the file groups it replaced, so a consumer needs neither a
timeline listing nor the commit files. ``fence`` is the requested time of the oldest pending write: a
consumer that checkpoints by requested time reads only below it (RFC-22 option 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property

from cowrite.errors import CorruptTimelineError
from cowrite.format.instant import Instant, check_time
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline

OVERLAY_PATH = ".hoodie/.cowrite/end_commit_time.json"


@dataclass(frozen=True)
class CommitEntry:
    """One completed data commit, as incremental readers need it."""

    requested_time: str
    completion_time: str
    action: str
    written: tuple[tuple[str, str, str], ...]  # (partition, file id, base file path)
    replaced: tuple[tuple[str, str], ...]  # (partition, file id)

    @cached_property
    def encoded(self) -> str:
        """The entry as JSON, as :meth:`Overlay.to_bytes` writes it."""
        return json.dumps(asdict(self))

    @classmethod
    def of(cls, table: Table, instant: Instant) -> CommitEntry:
        metadata = table.commit_metadata(instant)
        return cls(
            instant.requested_time,
            instant.completion_time or "",
            instant.action.value,
            tuple((s.partition_path, s.file_id, s.path) for s in metadata.write_stats),
            tuple(sorted((p, f) for p, ids in metadata.replaced_file_ids.items() for f in ids)),
        )


@dataclass(frozen=True)
class Overlay:
    entries: tuple[CommitEntry, ...]  # in completion order
    watermark: str | None  # every commit completed at or before it is in ``entries``
    fence: str | None  # requested time of the oldest pending data write, if any

    @classmethod
    def build(
        cls,
        table: Table,
        timeline: Timeline,
        previous: Overlay | None = None,
        earlier: Timeline | None = None,
    ) -> Overlay:
        """The overlay of ``timeline``, reading commit files only for commits ``previous`` lacks.

        The watermark comes from ``earlier``, a look at the timeline taken before ``timeline`` was
        (default: ``timeline`` itself). A listing is no snapshot: one taken while commits land may show a
        later commit but not an earlier one. Everything that had completed when the earlier look showed
        its newest commit is certainly in the later one.
        """
        known = {e.requested_time: e for e in previous.entries} if previous else {}
        entries = tuple(
            known.get(i.requested_time) or CommitEntry.of(table, i)
            for i in timeline.data_commits().in_completion_order()
        )
        pending = [i.requested_time for i in timeline.pending() if i.action.writes_data]
        watermark = (earlier if earlier is not None else timeline).latest_completion_time
        return cls(entries, watermark, min(pending) if pending else None)

    def since(self, checkpoint: str | None) -> list[CommitEntry]:
        """Entries completed after ``checkpoint`` and at or before the watermark."""
        return [
            e
            for e in self.entries
            if (checkpoint is None or e.completion_time > checkpoint)
            and self.watermark is not None
            and e.completion_time <= self.watermark
        ]

    def to_bytes(self) -> bytes:
        # Each entry is encoded once (CommitEntry.encoded): the daemon saves the whole overlay whenever the
        # timeline changes, and re-encoding ten thousand entries each time cost more than all else it does.
        head = json.dumps({"watermark": self.watermark, "fence": self.fence})
        return f'{head[:-1]}, "entries": [{", ".join(e.encoded for e in self.entries)}]}}'.encode()

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> Overlay:
        try:
            payload = json.loads(data)
            entries = tuple(
                CommitEntry(
                    check_time(e["requested_time"]),
                    check_time(e["completion_time"]),
                    str(e["action"]),
                    tuple((str(p), str(f), str(x)) for p, f, x in e["written"]),
                    tuple((str(p), str(f)) for p, f in e["replaced"]),
                )
                for e in payload["entries"]
            )
            watermark, fence = payload["watermark"], payload["fence"]
            for time in (watermark, fence):
                if time is not None:
                    check_time(time)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CorruptTimelineError(path, f"not an END_COMMIT_TIME overlay ({exc})") from None
        return cls(entries, watermark, fence)

    @classmethod
    def load(cls, table: Table) -> Overlay | None:
        """The overlay the daemon last wrote, or None if there is none."""
        try:
            data = table.storage.read(OVERLAY_PATH)
        except FileNotFoundError:
            return None
        return cls.from_bytes(data, table.storage.full_path(OVERLAY_PATH))

    def save(self, table: Table) -> None:
        table.storage.write(OVERLAY_PATH, self.to_bytes())


def entries_of(table: Table, instants: Iterable[Instant]) -> list[CommitEntry]:
    return [CommitEntry.of(table, i) for i in instants if i.action.writes_data]


def newest_files(entries: Sequence[CommitEntry]) -> list[str]:
    """The newest base file each file group got from ``entries``, minus groups replaced among them."""
    newest: dict[tuple[str, str], tuple[str, str]] = {}
    for entry in entries:
        for partition, file_id, path in entry.written:
            key = (partition, file_id)
            if key not in newest or newest[key][0] < entry.requested_time:
                newest[key] = (entry.requested_time, path)
    for entry in entries:
        for group in entry.replaced:
            newest.pop(group, None)
    return sorted(path for _, path in newest.values())
