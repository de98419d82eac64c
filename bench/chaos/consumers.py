"""Incremental consumers: threads that pull a table over and over, each keeping its own checkpoint.

A consumer stores what every pull returned (rows with their ``_hoodie_commit_time``) and the checkpoints,
so the checker can prove that the pulls together deliver the snapshot, each row version at most once.
A pull that fails because a file it needs was cleaned meanwhile (the consumer fell behind the retention
window) is retried from the same checkpoint, as a real consumer would; it is counted, never hidden.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

from cowrite.engine.file_group import read_base_file
from cowrite.errors import BaseFileGoneError, CheckpointArchivedError, CowriteError, StorageError
from cowrite.format.fs_view import FileSystemView
from cowrite.format.table import Table
from cowrite.local.read import PullMode, pull

Pulled = tuple[str, str, int, str, str]  # id, part, ts, value, _hoodie_commit_time


@dataclass
class PullRecord:
    before: str | None
    after: str | None
    commits: tuple[str, ...]
    rows: list[Pulled]
    resync: bool = False  # a snapshot the consumer started over from (its checkpoint had been archived)


@dataclass
class Consumer:
    uri: str
    storage_options: dict[str, Any]
    mode: str
    name: str
    period: float = 0.05
    pulls: list[PullRecord] = field(default_factory=list)
    retries: int = 0  # pulls that failed on a cleaned file and were repeated
    resyncs: int = 0  # times the consumer fell behind archival and started over from a snapshot
    waits: int = 0  # overlay pulls before the daemon wrote an overlay
    crashes: list[str] = field(default_factory=list)
    checkpoint: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"consumer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.pull_once()

    def pull_once(self) -> str:
        """One pull: "new" if it returned commits, "none" if there were none, "retry" if it failed."""
        try:
            table = Table.load(self.uri, **self.storage_options)
            got = pull(table, self.checkpoint, PullMode(self.mode), with_meta=True)
        except CheckpointArchivedError:
            return self._resync()
        except (BaseFileGoneError, FileNotFoundError, StorageError):  # raced the cleaner or a fault
            self.retries += 1
            return "retry"
        except CowriteError as exc:
            if "no END_COMMIT_TIME overlay" in str(exc):
                self.waits += 1
            else:
                self.crashes.append(f"{type(exc).__name__}: {exc}")
            return "retry"
        except Exception as exc:  # reported by the checker
            self.crashes.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")
            return "retry"
        rows: list[Pulled] = []
        if got.rows.num_rows:
            columns = [
                got.rows.column(c).to_pylist() for c in ("id", "part", "ts", "value", "_hoodie_commit_time")
            ]
            rows = list(zip(*columns, strict=True))
        self.pulls.append(PullRecord(self.checkpoint, got.checkpoint, got.commits, rows))
        self.checkpoint = got.checkpoint
        return "new" if got.commits else "none"

    def drain(self, tries: int = 20) -> None:
        """Pull until a pull brings nothing new (after the writers and cleaners are done)."""
        for _ in range(tries):
            if self.pull_once() == "none":
                return

    def _resync(self) -> str:
        """Start over from a snapshot, with the checkpoint of the timeline the snapshot was read from."""
        try:
            table = Table.load(self.uri, **self.storage_options)
            timeline = table.timeline()
            commits = list(timeline.data_commits())
            if self.mode == "fence":
                if any(i.action.writes_data for i in timeline.pending()):
                    return "retry"  # a pending write may complete below the checkpoint: wait for it
                checkpoint = max((i.requested_time for i in commits), default=None)
            else:
                checkpoint = max((i.completion_time or "" for i in commits), default=None)
            view = FileSystemView.build(table, timeline)
            parts = [read_base_file(table.storage, b.path) for b in view.latest_base_files()]
        except (FileNotFoundError, StorageError):
            self.retries += 1
            return "retry"
        rows: list[Pulled] = []
        for part in parts:
            columns = [
                part.column(c).to_pylist() for c in ("id", "part", "ts", "value", "_hoodie_commit_time")
            ]
            rows += list(zip(*columns, strict=True))
        self.pulls.append(PullRecord(self.checkpoint, checkpoint, (), rows, resync=True))
        self.checkpoint = checkpoint
        self.resyncs += 1
        return "new"
