"""Prometheus metrics of the daemon, registered in the registry it is given (tests pass a fresh one).

Events (commits seen, conflicts, rollbacks, lock expiries, cleaner runs) are counters and histograms
updated as they happen. Table state (heartbeat ages, pending instants, garbage, timeline size,
watermark) is a :class:`TableStateCollector` that reports the state of the last poll at scrape time, with
ages taken at the moment of the scrape; a scrape never touches storage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cowrite.format.instant import to_millis
from cowrite.protocol.liveness import PendingInstant


@dataclass(frozen=True)
class TableStatus:
    """What the last poll of one table found."""

    name: str
    uri: str
    up: bool
    error: str | None = None
    polled_at: float = 0.0  # time.time() of the poll
    instants_by_state: dict[str, int] = field(default_factory=dict)
    pending: tuple[PendingInstant, ...] = ()
    garbage_files: int = 0
    garbage_bytes: int = 0
    watermark: str | None = None
    fence: str | None = None
    lock: dict[str, object] | None = None
    corrupt: str | None = None  # a timeline file the last poll could not parse: readers fail on it too


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry, statuses: Callable[[], Sequence[TableStatus]]) -> None:
        labels = ["table"]
        self.commits = Counter(
            "cowrite_commits", "Completed instants seen, by action", ["table", "action"], registry=registry
        )
        self.aborted_writes = Counter(
            "cowrite_aborted_writes",
            "Writers that gave up, by their reason",
            ["table", "reason"],
            registry=registry,
        )
        self.conflicts = Counter(
            "cowrite_write_conflicts", "Writers that aborted on a write conflict", labels, registry=registry
        )
        self.rollbacks = Counter("cowrite_rollbacks", "Failed writes rolled back", labels, registry=registry)
        self.lock_expiries = Counter(
            "cowrite_lock_expiries", "Stale table locks expired (by anyone)", labels, registry=registry
        )
        self.lock_wait = Histogram(
            "cowrite_lock_wait_seconds",
            "How long lock holders waited for the lock",
            labels,
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
        )
        self.cleaner_runs = Counter(
            "cowrite_cleaner_runs",
            "Cleaner runs, by service and outcome",
            ["table", "service", "outcome"],
            registry=registry,
        )
        self.cleaner_duration = Histogram(
            "cowrite_cleaner_duration_seconds",
            "Duration of cleaner runs",
            ["table", "service"],
            registry=registry,
        )
        self.deleted_files = Counter(
            "cowrite_deleted_files",
            "Files deleted by rollbacks and cleans",
            ["table", "service"],
            registry=registry,
        )
        self.polls_skipped = Counter(
            "cowrite_polls_skipped",
            "Polls not started because the table's previous poll was still running",
            labels,
            registry=registry,
        )
        registry.register(TableStateCollector(statuses))


class TableStateCollector(Collector):
    def __init__(
        self, statuses: Callable[[], Sequence[TableStatus]], clock: Callable[[], float] = time.time
    ) -> None:
        self.statuses = statuses
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        up = GaugeMetricFamily(
            "cowrite_table_up", "1 if the last poll of the table succeeded", labels=["table"]
        )
        instants = GaugeMetricFamily(
            "cowrite_timeline_instants",
            "Instants on the active timeline, by state",
            labels=["table", "state"],
        )
        pending = GaugeMetricFamily(
            "cowrite_pending_instants", "Pending writes (requested or inflight)", labels=["table"]
        )
        oldest = GaugeMetricFamily(
            "cowrite_oldest_pending_age_seconds",
            "Age of the oldest pending write's requested time",
            labels=["table"],
        )
        heartbeat = GaugeMetricFamily(
            "cowrite_heartbeat_age_seconds",
            "Age of each pending write's heartbeat",
            labels=["table", "instant"],
        )
        failed = GaugeMetricFamily(
            "cowrite_failed_writes", "Pending writes judged failed, awaiting rollback", labels=["table"]
        )
        garbage_files = GaugeMetricFamily(
            "cowrite_garbage_files", "Data files of failed writes still on storage", labels=["table"]
        )
        garbage_bytes = GaugeMetricFamily(
            "cowrite_garbage_bytes", "Bytes of data files of failed writes", labels=["table"]
        )
        watermark = GaugeMetricFamily(
            "cowrite_watermark_timestamp_seconds",
            "Completion time up to which incremental readers may read",
            labels=["table"],
        )
        corrupt = GaugeMetricFamily(
            "cowrite_corrupt_timeline_file",
            "1 while the table has a timeline file that cannot be parsed (every read of it fails)",
            labels=["table"],
        )
        for status in self.statuses():
            up.add_metric([status.name], 1.0 if status.up else 0.0)
            corrupt.add_metric([status.name], 1.0 if status.corrupt else 0.0)
            if not status.up:
                continue
            elapsed = max(0.0, now - status.polled_at)
            for state, count in sorted(status.instants_by_state.items()):
                instants.add_metric([status.name, state], count)
            pending.add_metric([status.name], len(status.pending))
            times = [to_millis(p.instant.requested_time) / 1000 for p in status.pending]
            oldest.add_metric([status.name], max(0.0, now - min(times)) if times else 0.0)
            for item in status.pending:
                age = item.heartbeat_age if item.heartbeat_age is not None else item.idle
                heartbeat.add_metric([status.name, item.instant.requested_time], age + elapsed)
            failed.add_metric([status.name], sum(1 for p in status.pending if p.failed))
            garbage_files.add_metric([status.name], status.garbage_files)
            garbage_bytes.add_metric([status.name], status.garbage_bytes)
            if status.watermark:
                watermark.add_metric([status.name], to_millis(status.watermark) / 1000)
        yield from (up, corrupt, instants, pending, oldest, heartbeat, failed)
        yield from (garbage_files, garbage_bytes, watermark)
