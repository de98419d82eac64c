"""The daemon: per table, follow the timeline, judge writers, expire stale locks, roll back, clean.

Each table is served by its own :class:`TableService`, polled by scheduler jobs of its own, so a table
that fails (corrupt files, no permission, storage down) is reported in logs and metrics
(``cowrite_table_up 0``) while the others carry on. The daemon holds no state that is not on storage:
killed at any point, it loses nothing, and on restart it resumes interrupted rollbacks and cleans from
their plans. Writers never wait for it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from cowrite.cleaner import archive, clean, rollback_failed, service_lock
from cowrite.cleaner.rollback import collect_heartbeats, planned_files
from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.follow import TimelineFollower
from cowrite.daemon.http import serve
from cowrite.daemon.metrics import DaemonMetrics, TableStatus
from cowrite.errors import CorruptTimelineError, CowriteError, InstantGoneError, LockTimeoutError
from cowrite.format import config as keys
from cowrite.format.instant import Action, Instant
from cowrite.format.overlay import Overlay
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.liveness import PendingInstant, pending_writers
from cowrite.protocol.locks import TableLock
from cowrite.protocol.locks.factory import FILESYSTEM, provider_name
from cowrite.protocol.locks.filesystem import (
    LOCK_DIR,
    collect_garbage,
    expire_stale_lock,
    read_holder,
    read_release,
)
from cowrite.storage.backend import FileInfo

log = logging.getLogger(__name__)


@dataclass
class _Seen:
    """What a table service has already counted, so counters count each event once."""

    aborted: dict[str, str] = field(default_factory=dict)  # instant -> the reason its writer gave up
    lock_files: frozenset[str] = frozenset()
    garbage: dict[str, tuple[int, int]] = field(default_factory=dict)  # instant -> (files, bytes)


class TableService:
    """Everything the daemon does for one table."""

    def __init__(self, entry: TableEntry, config: DaemonConfig, metrics: DaemonMetrics) -> None:
        self.entry = entry
        self.config = config
        self.metrics = metrics
        self.name = entry.name or entry.uri.rstrip("/").rsplit("/", 1)[-1]
        self.status = TableStatus(self.name, entry.uri, up=False, error="not polled yet")
        self.table: Table | None = None
        self.follower: TimelineFollower | None = None
        self.lock: TableLock | None = None
        self.policy = HeartbeatPolicy()
        self.overlay: Overlay | None = None
        self._overlay_source: Timeline | None = None  # the timeline ``overlay`` was last built from
        self.seen = _Seen()
        self.polls = 0
        self._mutex = threading.Lock()  # one job at a time per table

    # -- lifecycle -------------------------------------------------------------------------------
    def _open(self) -> Table:
        if self.table is None:
            loaded = Table.load(self.entry.uri)
            table = Table(loaded.storage, loaded.config.with_values(self.entry.settings))
            if self.entry.name is None:
                self.name = table.name
            follower = TimelineFollower(table)
            follower.start()
            owner = f"cowrite-daemon@{socket.gethostname()}"
            self.lock = service_lock(table, owner)
            self.policy = HeartbeatPolicy.from_config(table.config)
            try:
                self.overlay = Overlay.load(table)
            except CorruptTimelineError as exc:  # the daemon's own file: rebuilt on the first poll
                log.warning("rebuilding the END_COMMIT_TIME overlay of %s: %s", self.entry.uri, exc)
                self.overlay = None
            self.table, self.follower = table, follower
            self._count_lock_files(initial=True)
        return self.table

    def abort_reason(self, instant: str) -> str | None:
        """Why the writer of ``instant`` gave up, as a poll of this daemon saw it before the rollback
        deleted the heartbeat that said so. Kept in memory only: a restarted daemon knows the reasons of
        instants still pending, not of those rolled back before."""
        return self.seen.aborted.get(instant)

    # -- jobs ------------------------------------------------------------------------------------
    def poll(self) -> None:
        """Follow the timeline, judge pending writers, expire stale locks, roll back failed writes."""
        with self._mutex:
            try:
                self._poll()
            except Exception as exc:  # a broken table is reported, never fatal for the daemon
                if str(exc) != self.status.error:  # once per new problem, not once per poll
                    trace = None if isinstance(exc, CowriteError) else exc
                    log.error("table %s (%s) failed: %s", self.name, self.entry.uri, exc, exc_info=trace)
                corrupt = exc.path if isinstance(exc, CorruptTimelineError) else None
                self.status = TableStatus(
                    self.name, self.entry.uri, False, str(exc), time.time(), corrupt=corrupt
                )
                if self.table is not None and self.follower is not None and self.polls == 0:
                    self.table = None
            finally:
                self.polls += 1

    def clean(self) -> None:
        with self._mutex:
            try:
                table = self._open()
                assert self.lock is not None
                retained = self.config.commits_retained
                if retained is None:
                    retained = table.config.get(keys.CLEANER_COMMITS_RETAINED)
                with self._timed("clean"):
                    done = clean(table, self.lock, retained)
                if done is not None:
                    self.metrics.deleted_files.labels(self.name, "clean").inc(len(done.deleted))
                with self._timed("archive"):  # after cleaning: replaced files must be gone first
                    archive(table, self.lock)
            except Exception as exc:
                log.error("cleaning %s failed: %s", self.name, exc, exc_info=exc)

    def _poll(self) -> None:
        table = self._open()
        assert self.follower is not None and self.lock is not None
        created = self._follow(table)
        for instant in created:
            if instant.is_completed and self.polls > 0:
                self.metrics.commits.labels(self.name, instant.action.value).inc()
        self._reap_locks(table)
        timeline = self.follower.timeline
        now = time.time()
        pending = pending_writers(table, timeline, self.policy, now)
        self._count_aborts(pending)
        unfinished = timeline.pending().filter(actions=[Action.ROLLBACK])
        if any(p.failed for p in pending) or unfinished:
            try:
                with self._timed("rollback"):
                    done = rollback_failed(table, self.lock, self.policy, now)
            except LockTimeoutError as exc:
                # A live holder keeps the lock: the table is fine and its failed writes (and their garbage)
                # stay reported; a later poll rolls them back.
                log.warning("rollback on %s waits for the table lock: %s", self.name, exc)
                done = []
            for item in done:
                self.metrics.rollbacks.labels(self.name).inc()
                self.metrics.deleted_files.labels(self.name, "rollback").inc(len(item.deleted))
            if done:  # our own changes
                self.follower.poll()
                timeline = self.follower.timeline
                pending = pending_writers(table, timeline, self.policy, now)
        else:
            collect_heartbeats(table, self.policy, now, timeline)  # rollback_failed collects them too
        self._refresh_overlay(table, timeline)
        garbage = self._garbage(table, pending)
        states = {state.name.lower(): n for state, n in Counter(i.state for i in timeline).items()}
        self.status = TableStatus(
            self.name,
            self.entry.uri,
            up=True,
            polled_at=now,
            instants_by_state=states,
            pending=tuple(pending),
            garbage_files=garbage[0],
            garbage_bytes=garbage[1],
            watermark=self.overlay.watermark if self.overlay else None,
            fence=self.overlay.fence if self.overlay else None,
        )

    # -- pieces ----------------------------------------------------------------------------------
    def _follow(self, table: Table) -> list[Instant]:
        """Poll the follower; return the instants that appeared. Every completed commit it shows is
        parsed: a commit no reader can parse stops the table's jobs.

        A commit archived by another process between the follower's listing and its read is no fault
        of the table: the follower looks once more, and that listing no longer shows it. Should the
        timeline move on again, :class:`InstantGoneError` fails this poll only; the next one starts from
        a new listing.
        """
        assert self.follower is not None
        created, _ = self.follower.poll()
        try:
            table.verified(self.follower.timeline)
        except InstantGoneError as exc:
            log.info("table %s moved on while it was read (%s); following it again", self.name, exc)
            created += self.follower.poll()[0]
            table.verified(self.follower.timeline)
        return created

    def _timed(self, service: str) -> _Timed:
        return _Timed(self.metrics, self.name, service)

    def _count_aborts(self, pending: Sequence[PendingInstant]) -> None:
        for item in pending:
            if item.aborted and item.instant.requested_time not in self.seen.aborted:
                self.seen.aborted[item.instant.requested_time] = item.aborted
                self.metrics.aborted_writes.labels(self.name, item.aborted).inc()
                if item.aborted == "conflict":
                    self.metrics.conflicts.labels(self.name).inc()

    def _reap_locks(self, table: Table) -> None:
        """Expire a stale filesystem lock, collect old lock files, and count lock waits and expiries."""
        if provider_name(table.config) != FILESYSTEM:
            return
        expire_stale_lock(table.storage, self.policy, reaper=f"cowrite-daemon@{socket.gethostname()}")
        self._count_lock_files(initial=False)
        collect_garbage(table.storage, keep=self.config.locks_kept)

    def _count_lock_files(self, initial: bool) -> None:
        assert self.table is not None
        if provider_name(self.table.config) != FILESYSTEM:
            return
        names = self.table.storage.watched_names(LOCK_DIR)
        for name in sorted(names - self.seen.lock_files):
            if initial or not name.startswith("lock"):
                continue
            lock_id = int(name[4:].split(".")[0])
            try:
                if name.endswith(".acquired"):
                    waited = read_holder(self.table.storage, lock_id).waited_ms
                    self.metrics.lock_wait.labels(self.name).observe(waited / 1000)
                elif read_release(self.table.storage, lock_id).get("reason") == "expired":
                    self.metrics.lock_expiries.labels(self.name).inc()
            except (FileNotFoundError, CowriteError) as exc:  # collected meanwhile, or unreadable
                log.debug("lock file %s: %s", name, exc)
        self.seen.lock_files = names  # ids only grow: a collected name never comes back

    def _refresh_overlay(self, table: Table, timeline: Timeline) -> None:
        caught_up = self.overlay is not None and self.overlay.watermark == timeline.latest_completion_time
        if timeline is self._overlay_source and caught_up:
            return  # unchanged: the follower hands out the same Timeline until an instant file comes or goes
        # the watermark comes from the previous look at the timeline (see Overlay.build)
        overlay = Overlay.build(table, timeline, self.overlay, self._overlay_source or timeline)
        if overlay != self.overlay:
            overlay.save(table)
            self.overlay = overlay
        self._overlay_source = timeline

    def _garbage(self, table: Table, pending: Sequence[PendingInstant]) -> tuple[int, int]:
        files = size = 0
        current = {p.instant.requested_time for p in pending if p.failed}
        self.seen.garbage = {k: v for k, v in self.seen.garbage.items() if k in current}
        for item in pending:
            if not item.failed:
                continue
            key = item.instant.requested_time
            if key not in self.seen.garbage:
                found = [f for p in planned_files(table, item.instant) if (f := _stat_if_present(table, p))]
                self.seen.garbage[key] = (len(found), sum(f.size for f in found))
            files += self.seen.garbage[key][0]
            size += self.seen.garbage[key][1]
        return files, size


def _stat_if_present(table: Table, path: str) -> FileInfo | None:
    """A file's size and time, or None if it is not there (never written, or deleted since it was listed
    or planned: a concurrent rollback)."""
    try:
        return table.storage.stat(path)
    except FileNotFoundError:
        return None


class _Timed:
    """Counts a cleaner run and its duration, by outcome."""

    def __init__(self, metrics: DaemonMetrics, table: str, service: str) -> None:
        self.metrics, self.table, self.service = metrics, table, service

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.metrics.cleaner_duration.labels(self.table, self.service).observe(
            time.monotonic() - self.started
        )
        self.metrics.cleaner_runs.labels(self.table, self.service, "ok" if kind is None else "error").inc()


class Daemon:
    """Serves several tables: scheduler jobs per table, and the HTTP endpoint."""

    def __init__(self, config: DaemonConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = DaemonMetrics(self.registry, self.statuses)
        self.services = [TableService(entry, config, self.metrics) for entry in config.tables]
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )
        self.http: ThreadingHTTPServer | None = None
        self._stopped = threading.Event()

    def statuses(self) -> list[TableStatus]:
        return [s.status for s in self.services]

    @property
    def ready(self) -> bool:
        """Every table has been polled once (successfully or not)."""
        return all(s.polls > 0 for s in self.services)

    def service(self, name: str) -> TableService | None:
        return next((s for s in self.services if s.name == name), None)

    def start(self, serve_http: bool = True) -> None:
        for index, service in enumerate(self.services):
            self.scheduler.add_job(
                service.poll,
                "interval",
                seconds=self.config.poll_interval,
                id=f"poll-{index}",
                next_run_time=datetime.now(UTC),
            )
            self.scheduler.add_job(
                service.clean, "interval", seconds=self.config.clean_interval, id=f"clean-{index}"
            )
        self.scheduler.start()
        if serve_http:
            self.http = serve(self, self.config.host, self.config.port)
        log.info("serving %d tables", len(self.services))

    def stop(self) -> None:
        """Drain: let running jobs finish, then stop polling and serving."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.scheduler.running:  # not when asked to stop before it started
            self.scheduler.shutdown(wait=True)
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        log.info("stopped")

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)
