"""The daemon: per table, follow the timeline, judge writers, expire stale locks, roll back, clean.

Each table is served by its own :class:`TableService`, polled by scheduler jobs of its own, so a table
that fails (corrupt files, no permission, storage down) is reported in logs and metrics
(``cowrite_table_up 0``) while the others carry on. Writers never wait for the daemon.

A table's state is the fold (:class:`~cowrite.daemon.state.TableState`) of the events its follower
reports (:mod:`cowrite.daemon.follow`); a poll looks only where something can have changed, and its
decisions (roll back, expire a lock, append to the END_COMMIT_TIME log) are taken from the state. What the
daemon keeps on storage is the END_COMMIT_TIME log and the cleaner's plans: killed at any point, it loses
nothing; a restart loads the log's newest snapshot and the segments after it, looks at the table once in
full, and finishes interrupted rollbacks and cleans from their plans.

What a poll looks at (on an object store each is a request; on local disk the timeline and lock listings
are kept current by the kernel's change events, so an idle poll compares two objects):

- the timeline: always, the names after its start point (:mod:`cowrite.daemon.follow`); a second time
  when the first look showed new completions, so that the watermark is that of the first look;
- the lock directory, once: when a write is pending, the lock was held, or the timeline changed — a
  holder then may be waiting or dead —, otherwise once per heartbeat interval (a dead holder nobody waits
  for is expired that much later; a contender would expire it at once);
- the heartbeats: when a write is pending or the lock is held (nobody else has a lease to judge);
- the archive's new files: when the watermark moves or a commit vanished;
- the END_COMMIT_TIME log: one new file when what it says changed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer

from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from cowrite.cleaner import archive, clean, rollback_failed, service_lock
from cowrite.cleaner.rollback import collect_heartbeats, planned_files
from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.events import Change, Event, InstantChanged, OverlayAppended
from cowrite.daemon.follow import TimelineFollower
from cowrite.daemon.http import serve
from cowrite.daemon.metrics import DaemonMetrics, TableStatus
from cowrite.daemon.overlay import OverlayLog, OverlayLogDamaged
from cowrite.daemon.overruns import PollOverruns
from cowrite.daemon.state import TableState
from cowrite.errors import CorruptTimelineError, CowriteError, LockTimeoutError
from cowrite.format import config as keys
from cowrite.format.instant import Action
from cowrite.format.overlay import CommitEntry
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.liveness import PendingInstant
from cowrite.protocol.locks import TableLock
from cowrite.protocol.locks.factory import FILESYSTEM, provider_name
from cowrite.protocol.locks.holders import expire_lock, judge_holder
from cowrite.protocol.locks.lock_files import acquired_path, collect_garbage
from cowrite.protocol.table_schema import record_unseen_schema
from cowrite.storage.backend import FileInfo

log = logging.getLogger(__name__)
_REBUILDING = "rebuilding the END_COMMIT_TIME overlay of %s from its timeline: %s"


class TableService:
    """Everything the daemon does for one table."""

    def __init__(
        self,
        entry: TableEntry,
        config: DaemonConfig,
        metrics: DaemonMetrics,
        starting: threading.Lock | None = None,
    ) -> None:
        self.entry = entry
        self.config = config
        self.metrics = metrics
        self.name = entry.name or entry.uri.rstrip("/").rsplit("/", 1)[-1]
        self.status = TableStatus(self.name, entry.uri, up=False, error="not polled yet")
        self.table: Table | None = None
        self.follower: TimelineFollower | None = None
        self.lock: TableLock | None = None
        self.policy = HeartbeatPolicy()
        self.state = TableState()
        self.log: OverlayLog | None = None
        self.polls = 0
        self._reported: Counter[tuple[str, str]] = Counter()  # state.counts already exported
        self._garbage: dict[str, tuple[int, int]] = {}  # failed instant -> (files, bytes) it left
        self._locks_looked_at = float("-inf")  # time.monotonic() of the last look at the lock directory
        self._reaper = f"cowrite-daemon@{socket.gethostname()}"
        self._mutex = threading.Lock()  # one job at a time per table
        self._starting = starting if starting is not None else threading.Lock()  # see _first_poll_turn

    # -- lifecycle -------------------------------------------------------------------------------
    def _open(self) -> Table:
        if self.table is None:
            loaded = Table.load(self.entry.uri)
            table = Table(loaded.storage, loaded.config.with_values(self.entry.settings))
            if self.entry.name is None:
                self.name = table.name
            state, follower = TableState(), TimelineFollower(table)
            overlay = OverlayLog(table.storage, self.config.overlay_snapshot_every)
            try:
                logged = overlay.load()
            except OverlayLogDamaged as exc:  # the daemon's own files: rebuilt on the first poll
                log.warning(_REBUILDING, table.uri, exc)
                logged = None
            if logged is not None:
                state.apply(logged)
            for event in follower.look(state, full=True):
                state.apply(event)
            self.lock = service_lock(table, self._reaper)
            self.policy = HeartbeatPolicy.from_config(table.config)
            self.state, self.follower, self.log, self.table = state, follower, overlay, table
            self._reported = Counter()
            self._locks_looked_at = float("-inf")
            if self._uses_lock_files():
                self._look_at_locks()
            state.following = True  # from here on, what appears is news
        return self.table

    def abort_reason(self, instant: str) -> str | None:
        """Why the writer of ``instant`` gave up, as a poll of this daemon saw it before the rollback
        deleted the heartbeat that said so. Kept in memory only: a restarted daemon knows the reasons of
        instants still pending, not of those rolled back before."""
        return self.state.aborted.get(instant)

    @property
    def timeline(self) -> Timeline | None:
        """The whole timeline as the last poll left it, unpacked for the caller; None before the table was
        opened."""
        return self.state.timeline if self.table is not None else None

    @property
    def recent_timeline(self) -> Timeline | None:
        """The newest instants (at least :data:`~cowrite.daemon.state.RECENT`) and every pending one;
        None before the table was opened."""
        return self.state.recent_timeline if self.table is not None else None

    @property
    def overlay(self) -> OverlayAppended | None:
        """What the newest file of the END_COMMIT_TIME log says (watermark, fence, archived through)."""
        return self.state.logged

    # -- jobs ------------------------------------------------------------------------------------
    def poll(self) -> None:
        """Follow the table, judge pending writers, expire stale locks, roll back failed writes, append
        to the END_COMMIT_TIME log."""
        with self._mutex, self._first_poll_turn():
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
                if self.table is not None and self.polls == 0:
                    self.table = None  # opened, not served yet: open afresh
            finally:
                self.polls += 1

    def _first_poll_turn(self) -> contextlib.AbstractContextManager[object]:
        """What a poll holds while it runs: the daemon's lock for first polls of local tables, nothing else.

        A first poll folds the whole timeline and may build the END_COMMIT_TIME log. On local disk that is
        CPU work under one interpreter lock: the first polls of many tables run together take as long in
        all, but their transient memory (names, instants, commit metadata) peaks at once and stays with
        the process. On an object store a first poll mostly waits for requests: those overlap."""
        uri = self.entry.uri
        if self.table is not None or ("://" in uri and not uri.startswith("file://")):
            return contextlib.nullcontext()
        return _turn_without_collector(self._starting)

    def clean(self) -> None:
        with self._mutex:
            try:
                table = self._open()
                assert self.lock is not None and self.follower is not None
                retained = self.config.commits_retained
                if retained is None:
                    retained = table.config.get(keys.CLEANER_COMMITS_RETAINED)
                with self._timed("clean"):
                    done = clean(table, self.lock, retained)
                if done is not None:
                    self.metrics.deleted_files.labels(self.name, "clean").inc(len(done.deleted))
                with self._timed("archive"):  # after cleaning: replaced files must be gone first
                    archive(table, self.lock)
                # What polls do not look at: heartbeats left by writers that died after publishing, and
                # (on object stores) what the timeline holds below the follower's start point.
                collect_heartbeats(table, self.policy)
                self.follower.full_look_due = self.follower.archive_due = True
                with self._timed("schema"):  # a change of schema readers by instant times miss, recorded
                    record_unseen_schema(table, self.lock, int(time.time() * 1000))
            except Exception as exc:
                log.error("cleaning %s failed: %s", self.name, exc, exc_info=exc)

    def _poll(self) -> None:
        table = self._open()
        follower, state = self.follower, self.state
        assert follower is not None and self.lock is not None
        now = time.time()
        first = self._apply(follower.look(state))
        # A listing may show a commit without one that completed before it; a second look finds that one,
        # so the log may go up to the newest completion of the first.
        watermark = state.latest_completion
        if any(e.change is Change.COMPLETED for e in first):
            self._apply(follower.look(state))
        if self._uses_lock_files() and self._locks_due(table, changed=bool(first)):
            self._look_at_locks()
        if state.busy:
            writers = {p.instant.requested_time for p in state.pending_writers(self.policy, now)}
            self._apply(follower.look_heartbeats(state, writers))
        self._expire_stale_lock(table, now)
        pending = self._roll_back(table, state.pending_writers(self.policy, now), now)
        self._append_to_overlay(table, watermark)
        self._export_counts()
        garbage = self._count_garbage(table, pending)
        self.status = TableStatus(
            self.name,
            self.entry.uri,
            up=True,
            polled_at=now,
            instants_by_state={s.name.lower(): n for s, n in sorted(state.by_state.items()) if n},
            pending=tuple(pending),
            garbage_files=garbage[0],
            garbage_bytes=garbage[1],
            watermark=state.logged.watermark if state.logged else None,
            fence=state.fence,
        )

    # -- pieces ----------------------------------------------------------------------------------
    def _apply(self, events: Iterable[Event]) -> list[InstantChanged]:
        """Fold ``events`` into the state; the instant changes among them."""
        changes = []
        for event in events:
            self.state.apply(event)
            if isinstance(event, InstantChanged):
                changes.append(event)
        return changes

    def _uses_lock_files(self) -> bool:
        return self.table is not None and provider_name(self.table.config) == FILESYSTEM

    def _locks_due(self, table: Table, changed: bool) -> bool:
        """Whether this poll looks at the lock directory (see the module's docstring)."""
        if not table.storage.round_trips or changed or self.state.busy:
            return True
        return time.monotonic() - self._locks_looked_at >= self.policy.interval

    def _look_at_locks(self) -> None:
        """One listing of the lock directory: new holders and releases, then old lock files collected."""
        assert self.follower is not None and self.table is not None
        self._locks_looked_at = time.monotonic()
        look = self.follower.look_locks(self.state)
        self._apply(look.events)
        collect_garbage(self.table.storage, keep=self.config.locks_kept, files=look.files)

    def _expire_stale_lock(self, table: Table, now: float) -> None:
        """Release the filesystem lock of a holder whose heartbeat (or, holding no instant, whose lock file)
        is older than the tolerance; the release shows on the next look at the lock directory."""
        lock = self.state.lock
        if not self._uses_lock_files() or lock is None or not lock.held or lock.holder is None:
            return
        acquired_at = lock.acquired_at
        if acquired_at is None:  # local disk: the listing has names only, and a stat is no request
            try:
                acquired_at = table.storage.stat(acquired_path(lock.lock_id)).modified
            except FileNotFoundError:  # collected: released meanwhile
                return
        age = self.state.heartbeat_age(lock.holder.instant, now)
        reason, _ = judge_holder(acquired_at, lock.lock_id, lock.holder, age, self.policy, now)
        if reason is not None:
            expire_lock(table.storage, lock.lock_id, lock.holder, reason, self._reaper, now)

    def _roll_back(self, table: Table, pending: list[PendingInstant], now: float) -> list[PendingInstant]:
        """Roll back failed writes, finish rollbacks, remove claims left behind: the pending writers left."""
        assert self.follower is not None and self.lock is not None
        unfinished = any(i.action is Action.ROLLBACK for i in self.state.pending_instants)
        if not unfinished and not any(p.failed for p in pending) and not self.state.claims_left_behind:
            return pending
        self._export_counts()  # aborts first: a scrape never sees a rollback without its cause
        try:
            with self._timed("rollback"):
                done = rollback_failed(table, self.lock, self.policy, now)
        except LockTimeoutError as exc:
            # a live holder keeps the lock: failed writes (and garbage) stay reported, a later poll rolls back
            log.warning("rollback on %s waits for the table lock: %s", self.name, exc)
            return pending
        for item in done:
            self.metrics.rollbacks.labels(self.name).inc()
            self.metrics.deleted_files.labels(self.name, "rollback").inc(len(item.deleted))
        if not done:
            return pending
        self._apply(self.follower.look(self.state))  # our own changes
        return self.state.pending_writers(self.policy, now)

    def _append_to_overlay(self, table: Table, watermark: str | None) -> None:
        """Append what the log lacks up to ``watermark``; on a table without a whole log, write it anew."""
        follower, state, overlay = self.follower, self.state, self.log
        assert follower is not None and overlay is not None
        logged = state.logged.watermark if state.logged else None
        if follower.archive_due or (watermark or "") > (logged or ""):
            # Archival writes its file before it deletes the instants: whatever was archived before the
            # looks at the timeline is in this listing, and the log says so before its watermark passes it.
            self._apply(follower.look_archive(state))
        if not overlay.whole and state.logged is not None:  # an append whose outcome is unknown
            self._reload_overlay(table)
        batch = state.overlay_batch(watermark)
        if batch is None:
            return
        if overlay.whole:
            try:
                overlay.append(batch)
            except OverlayLogDamaged as exc:
                log.warning(_REBUILDING, table.uri, exc)
            else:
                state.apply(batch)
                return
        entries = self._all_entries(table, batch.watermark)
        overlay.rebuild(batch, entries)
        state.apply(replace(batch, entries=tuple(entries)))

    def _reload_overlay(self, table: Table) -> None:
        """Read the log again after an append that failed: what it holds now is what the state folds."""
        assert self.log is not None
        try:
            logged = self.log.load()
        except OverlayLogDamaged as exc:
            log.warning(_REBUILDING, table.uri, exc)
            return
        if logged is not None:
            self.state.apply(logged)

    def _all_entries(self, table: Table, watermark: str | None) -> list[CommitEntry]:
        """An entry for every data commit on the timeline completed at or before ``watermark``, in
        completion order: those the state holds, the others read (concurrently on object stores)."""
        commits = [
            i
            for i in self.state.timeline.data_commits().in_completion_order()
            if watermark is not None and (i.completion_time or "") <= watermark
        ]
        unlogged = self.state.unlogged
        missing = [i for i in commits if i.requested_time not in unlogged]
        read = dict(zip((i.requested_time for i in missing), table.commit_metadata_of(missing), strict=True))
        return [
            unlogged.get(i.requested_time) or CommitEntry.from_metadata(i, read[i.requested_time])
            for i in commits
        ]

    def _export_counts(self) -> None:
        """Counters of the state (events counted once each) into Prometheus."""
        counts = self.state.counts
        for (kind, label), n in counts.items():
            delta = n - self._reported[kind, label]
            if delta <= 0:
                continue
            if kind == "commits":
                self.metrics.commits.labels(self.name, label).inc(delta)
            elif kind == "aborted":
                self.metrics.aborted_writes.labels(self.name, label).inc(delta)
            elif kind == "conflicts":
                self.metrics.conflicts.labels(self.name).inc(delta)
            elif kind == "lock_expiries":
                self.metrics.lock_expiries.labels(self.name).inc(delta)
        self._reported = Counter(counts)
        for waited in self.state.lock_waits:
            self.metrics.lock_wait.labels(self.name).observe(waited)
        self.state.lock_waits.clear()

    @contextlib.contextmanager
    def _timed(self, service: str) -> Iterator[None]:
        """Count a cleaner run and its duration, by outcome."""
        started, outcome = time.monotonic(), "error"
        try:
            yield
            outcome = "ok"
        finally:
            self.metrics.cleaner_duration.labels(self.name, service).observe(time.monotonic() - started)
            self.metrics.cleaner_runs.labels(self.name, service, outcome).inc()

    def _count_garbage(self, table: Table, pending: Sequence[PendingInstant]) -> tuple[int, int]:
        files = size = 0
        current = {p.instant.requested_time for p in pending if p.failed}
        self._garbage = {k: v for k, v in self._garbage.items() if k in current}
        for item in pending:
            if not item.failed:
                continue
            key = item.instant.requested_time
            if key not in self._garbage:
                found = [f for p in planned_files(table, item.instant) if (f := _stat_if_present(table, p))]
                self._garbage[key] = (len(found), sum(f.size for f in found))
            files += self._garbage[key][0]
            size += self._garbage[key][1]
        return files, size


@contextlib.contextmanager
def _turn_without_collector(turn: threading.Lock) -> Iterator[None]:
    """Hold ``turn`` with the cyclic garbage collector paused: a first poll makes a table's history of
    objects that live on, which the collector would otherwise walk again and again while they are made (a
    sixth of a first poll's time). Turns never overlap, so neither do pauses; what little cyclic garbage
    the poll leaves is collected once it is over."""
    with turn:
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if enabled:
                gc.enable()


def _stat_if_present(table: Table, path: str) -> FileInfo | None:
    """A file's size and time, or None if it is not there (never written, or deleted since: a rollback)."""
    try:
        return table.storage.stat(path)
    except FileNotFoundError:
        return None


def _poll_job(index: int) -> str:
    return f"poll-{index}"


class Daemon:
    """Serves several tables: scheduler jobs per table, and the HTTP endpoint."""

    def __init__(self, config: DaemonConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = DaemonMetrics(self.registry, self.statuses)
        starting = threading.Lock()  # the first polls of local tables take turns
        self.services = [TableService(entry, config, self.metrics, starting) for entry in config.tables]
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )
        overruns = PollOverruns(self.services, _poll_job, self.metrics.polls_skipped, config.poll_interval)
        self.scheduler.add_listener(overruns, EVENT_JOB_MAX_INSTANCES)
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
                id=_poll_job(index),
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
