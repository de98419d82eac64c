"""The checker: every invariant of DESIGN.md, verified on what a scenario left behind.

Evidence comes from three sides that do not depend on each other: the table itself (timeline files with
their modification times, archived instants, commit metadata, lock files, base files), what the writers
logged about themselves (instants claimed with the completed instants they saw, heartbeats renewed,
plans, aborts, publishes in commit order, round outcomes), and what the harness did to them (kills,
stops, continues). Snapshots are read with cowrite's reader and with hudi-rs and compared with the model
(``model.py``). Each failed check is a :class:`Violation` naming the invariant.
"""

from __future__ import annotations

import base64
import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import pyarrow as pa

from cowrite.cleaner import rollback_failed, service_lock
from cowrite.cleaner.archive import ARCHIVE_DIR
from cowrite.engine.schema import arrow_schema
from cowrite.errors import CowriteError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import BaseFile, list_base_files
from cowrite.format.instant import Action, Instant, InvalidInstantError, State
from cowrite.format.markers import MARKER_DIR
from cowrite.format.service_metadata import RollbackPlan
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local import read
from cowrite.protocol.heartbeat import HEARTBEAT_DIR
from cowrite.protocol.locks.holders import current_lock
from cowrite.protocol.locks.lock_files import LOCK_DIR, read_holder, read_release
from cowrite.protocol.table_schema import ALTER_SCHEMA, latest_schema
from cowrite.storage.backend import FileInfo, Storage

from .model import Model, Record
from .plan import Row
from .runner import Outcome

FAILED_OUTCOMES_THAT_COMMITTED_NOTHING = None  # every CowriteError but CommitStateUnknownError
EPSILON = 0.05  # seconds: event timestamps are taken a moment after the storage call they report


@dataclass(frozen=True)
class Violation:
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.message}"


@dataclass
class Stats:
    scenarios: int = 0
    kills: int = 0
    stops: int = 0
    starvations: int = 0
    storage_faults: int = 0
    commits: int = 0
    conflicts: int = 0
    rollbacks: int = 0
    daemon_kills: int = 0
    consumer_pulls: int = 0
    consumer_retries: int = 0
    consumer_resyncs: int = 0
    lease_lost: int = 0
    # lease losses by cause: the writer was stopped (at a step, or briefly), starved, or neither (running)
    lease_lost_stopped: int = 0
    lease_lost_starved: int = 0
    lease_lost_running: int = 0
    commits_without_daemon: int = 0
    schema_commits: int = 0  # empty commits that recorded the schema after a writer's commit
    grouped: int = 0  # commits a holder published after its own, for writers queued behind it
    writer_seconds: float = 0.0  # time each writer process ran after the release, summed
    # per instant of a writer neither stopped nor starved: its longest wait between two renewals of the
    # heartbeat (from the claim), as a fraction of the lease's tolerance
    renewal_gaps: list[float] = field(default_factory=list)
    commit_seconds: list[float] = field(default_factory=list)  # per published instant: claimed -> published

    @property
    def faults(self) -> int:
        return self.kills + self.stops + self.starvations + self.storage_faults

    def add(self, other: Stats) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class TimelineFile:
    instant: Instant
    content: bytes | None  # None: not read (large or not needed)
    modified: float | None  # None for archived files
    archived_before: float | None = None  # the archive file's modification time
    # The latest moment it may have appeared: on local disk a file with content is written aside and
    # linked into place, which sets the inode's change time, while its modification time is when it was
    # written; a claimant paused in between makes its claim visible after a rival's later one.
    in_place: float | None = None


@dataclass
class Evidence:
    """What the table shows, active and archived."""

    files: list[TimelineFile]
    completed: dict[str, TimelineFile] = field(default_factory=dict)
    # by time and action: two claimants of one time leave two (one of them a claim left behind)
    requested_files: dict[tuple[str, Action], TimelineFile] = field(default_factory=dict)
    metadata: dict[str, CommitMetadata] = field(default_factory=dict)


class Checker:
    def __init__(self, outcome: Outcome) -> None:
        self.o = outcome
        self.scenario = outcome.scenario
        self.violations: list[Violation] = []
        self.stats = Stats(scenarios=1)
        self.storage = Storage.for_uri(outcome.uri, **outcome.storage_options)
        self.table = Table.open(self.storage)
        self.tolerance = outcome.policy.tolerance
        self.margin = outcome.policy.margin
        self.interval = outcome.policy.interval
        # how far a storage time may lag the moment it stands for: S3 keeps whole seconds
        self.slack = 1.0 if self.scenario.backend == "s3" else EPSILON
        self.claims: dict[str, dict[str, Any]] = {}
        self.schema_commits: set[str] = set()
        self.rounds: dict[tuple[int, int], dict[str, Any]] = {}
        self.beats: dict[str, list[float]] = defaultdict(list)  # as judges see them: storage times
        self.beat_walls: dict[str, list[float]] = defaultdict(list)  # as the writer saw them
        self._released = next((h["wall"] for h in outcome.harness if h["kind"] == "release"), 0.0)
        # instant -> moments its writer was alive as judges see it: when it began to write a file of it
        self.life: dict[str, list[float]] = defaultdict(list)
        self.given_up: dict[str, float] = {}  # instant -> when its writer started to abort
        self.planned: dict[str, list[float]] = defaultdict(list)  # instant -> when .inflight was written
        # time -> when a writer left a claim of it behind: its withdrawal failed, or its create acted but
        # the answer was lost (a claim the writer never knew it made)
        self.left_behind: dict[str, list[float]] = defaultdict(list)
        self.versions: dict[tuple[str, str], Record] = {}  # (key, instant) -> the row that instant wrote

    def fail(self, invariant: str, message: str) -> None:
        self.violations.append(Violation(invariant, message))

    # -- evidence --------------------------------------------------------------------------------
    def _collect_events(self) -> None:
        lost: list[dict[str, Any]] = []
        for worker, events in self.o.events.items():
            for event in events:
                kind = event["event"]
                instant = event.get("instant")
                if kind == "claimed":
                    if instant in self.claims:
                        self.fail(
                            "3",
                            f"instant {instant} claimed twice: by w{self.claims[instant]['worker']} "
                            f"and w{worker}",
                        )
                    self.claims[instant] = event
                    self.life[instant].append(event.get("made", event["wall"]))
                elif kind == "beat":
                    self.beats[instant].append(event["modified"])
                    self.beat_walls[instant].append(event["wall"])
                elif kind == "planned":
                    self.life[instant].append(event.get("made", event["wall"]))
                    self.planned[instant].append(event["wall"])
                elif kind == "gave-up":
                    self.given_up.setdefault(instant, event["wall"])
                elif kind == "abort" and instant:
                    if event.get("cause") == "WriteConflictError":
                        self.stats.conflicts += 1
                    if event.get("cause") == "LeaseLostError":
                        self.stats.lease_lost += 1
                        lost.append(event)
                elif kind == "published":
                    claim = self.claims.get(instant)
                    if claim is not None:
                        self.stats.commit_seconds.append(round(event["wall"] - claim["wall"], 3))
                elif kind == "round":
                    self.rounds[(worker, event["round"])] = event
                    if event["outcome"] == "crash":
                        self.fail(
                            "robustness",
                            f"writer w{worker} round {event['round']} crashed with an "
                            f"exception that is no CowriteError: {event['message']}\n"
                            f"{event.get('trace', '')}",
                        )
                elif kind == "fault":
                    if event["kind"] == "kill":
                        self.stats.kills += 1
                    else:
                        self.stats.stops += 1
                elif kind == "storage-fault":
                    self.stats.storage_faults += 1
                    if (claimed := _left_behind_by(event["kind"], event["path"])) is not None:
                        self.left_behind[claimed].append(event["wall"])
        for fault in self.o.harness:
            if fault["kind"] == "kill":
                self.stats.kills += 1
            elif fault["kind"] == "short-stop":
                self.stats.stops += 1
            elif fault["kind"] == "starve":
                self.stats.starvations += 1
            elif fault["kind"] == "daemon-kill":
                self.stats.kills += 1
                self.stats.daemon_kills += 1
        for event in lost:
            self._lease_lost(event)

    def _paused(self, worker: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        """(stopped, starved): the periods, in wall time, in which ``worker`` could not run freely."""
        stopped: list[tuple[float, float]] = []
        events = self.o.events.get(worker, [])
        for event in events:
            if event["event"] == "fault" and event["kind"] == "stop":
                resumed = next(
                    (e["wall"] for e in events if e["event"] == "resumed" and e["wall"] >= event["wall"]),
                    float("inf"),
                )
                stopped.append((event["wall"], resumed))
        starved: list[tuple[float, float]] = []
        for fault in self.o.harness:
            if fault.get("writer") != worker:
                continue
            if fault["kind"] == "short-stop":
                stopped.append((fault["wall"] - fault["duration"] - EPSILON, fault["wall"]))
            elif fault["kind"] == "starve":
                starved.append((fault["wall"], fault["until"] + EPSILON))
        return stopped, starved

    def _lease_lost(self, abort: dict[str, Any]) -> None:
        """Count a lease loss by its cause; a writer that was neither stopped nor starved while it held
        that lease lost it running: with the lease settings of a store behind real round trips (what a
        user would choose there), that is a spurious abort, and a violation."""
        worker, instant, when = abort["worker"], abort["instant"], abort["wall"]
        claimed = self.claims.get(instant, {}).get("wall", when - 3600)
        stopped, starved = self._paused(worker)
        if any(start <= when and end >= claimed for start, end in stopped):
            self.stats.lease_lost_stopped += 1
        elif any(start <= when and end >= claimed for start, end in starved):
            self.stats.lease_lost_starved += 1
        else:
            self.stats.lease_lost_running += 1
            if self.scenario.latency:
                outcome = self.rounds.get((worker, abort["round"]), {})
                self.fail(
                    "lease",
                    f"w{worker} lost the lease of {instant} while it ran (neither stopped nor starved) "
                    f"{when - claimed:.1f} s after claiming it {outcome.get('message', '')}".rstrip(),
                )

    def _lease_use(self) -> None:
        """Renewal gaps of every instant whose writer ran freely, as a fraction of the tolerance."""
        for worker, events in self.o.events.items():
            stopped, starved = self._paused(worker)
            exits = [e["wall"] for e in events]
            if exits:
                self.stats.writer_seconds += max(exits) - self._released
            for instant, claim in self.claims.items():
                if claim["worker"] != worker or not self.beats.get(instant):
                    continue
                moments = [claim["wall"], *self.beat_walls[instant]]
                if any(s <= moments[-1] and e >= moments[0] for s, e in stopped + starved):
                    continue
                gap = max(b - a for a, b in zip(moments, moments[1:], strict=False))
                self.stats.renewal_gaps.append(round(gap / self.tolerance, 3))

    def _collect_timeline(self) -> Evidence:
        files: list[TimelineFile] = []
        for info in self.storage.list(TIMELINE_DIR):
            try:
                instant = Instant.parse(info.name)
            except InvalidInstantError:
                continue
            written = self._written(info.modified)
            files.append(TimelineFile(instant, None, written, in_place=self._in_place(info.path, written)))
        for info in self.storage.list(ARCHIVE_DIR):
            archived = self._written(info.modified)
            for record in json.loads(self.storage.read(info.path)):
                instant = Instant.parse(record["file"])
                files.append(TimelineFile(instant, base64.b64decode(record["content"]), None, archived))
        evidence = Evidence(files)
        for item in files:
            time_ = item.instant.requested_time
            if item.instant.is_completed:
                if time_ in evidence.completed:
                    self.fail(
                        "3/6",
                        f"instant {time_} has two completed files: "
                        f"{evidence.completed[time_].instant.file_name} and {item.instant.file_name}",
                    )
                    continue
                evidence.completed[time_] = item
            elif item.instant.state is State.REQUESTED:
                evidence.requested_files[time_, item.instant.action] = item
        actions: dict[str, set[str]] = defaultdict(set)
        for item in files:
            actions[item.instant.requested_time].add(item.instant.action.value)
        for time_, names in actions.items():
            if len(names) > 1:
                self.fail("3", f"instant time {time_} is used by several actions: {sorted(names)}")
        for time_, item in evidence.completed.items():
            if item.instant.action.writes_data:
                evidence.metadata[time_] = self._metadata(item)
        return evidence

    def _written(self, modified: float) -> float:
        """The earliest moment a file of ``modified`` may have been written. cowrite reads a coarse
        modification time (S3's whole seconds) as the end of its span, so that judges err young; the
        checks here reason from the start of it, with a second's slack on S3."""
        return modified - self.storage.clock_resolution

    def _in_place(self, path: str, written: float) -> float:
        if self.scenario.backend != "local":
            return written
        try:
            return max(written, os.stat(self.storage.full_path(path)).st_ctime)
        except FileNotFoundError:
            return written

    def _content(self, item: TimelineFile) -> bytes:
        if item.content is None:
            item.content = self.storage.read(f"{TIMELINE_DIR}/{item.instant.file_name}")
        return item.content

    def _metadata(self, item: TimelineFile) -> CommitMetadata:
        return CommitMetadata.from_bytes(self._content(item), item.instant.file_name)

    def _requested_content(self, evidence: Evidence, time_: str, action: Action) -> bytes | None:
        item = evidence.requested_files.get((time_, action))
        return self._content(item) if item is not None else None

    # -- checks ----------------------------------------------------------------------------------
    def check(self) -> tuple[list[Violation], Stats]:
        for problem in self.o.problems:
            self.fail("robustness", problem)
        self._collect_events()
        self._lease_use()
        self.check_liveness()
        evidence = self._collect_timeline()
        data = sorted(
            (evidence.completed[t] for t in evidence.metadata), key=lambda f: f.instant.completion_time or ""
        )
        # The empty commits that record the schema after a writer's commit (protocol.table_schema): rows of
        # no round. Each follows a commit of its writer's round, in the same turn of the lock.
        self.schema_commits = {t for t, m in evidence.metadata.items() if m.operation == ALTER_SCHEMA}
        for time_ in sorted(self.schema_commits):
            if evidence.metadata[time_].write_stats:
                self.fail("1", f"the schema's commit {time_} names files")
        self.stats.schema_commits = len(self.schema_commits)
        self.stats.commits = sum(
            1 for f in data if f.instant.requested_time not in {self.o.seed_instant, *self.schema_commits}
        )
        model = self.check_visibility(data)
        self.check_contract(evidence)
        self.check_overlap(evidence, data)
        self.check_times(evidence)
        self.check_leases(evidence)
        self.check_retention(data, evidence)
        self.check_rollbacks(evidence)
        self.check_locks()
        self.check_consumers(model, evidence)
        self.check_garbage(evidence)
        return self.violations, self.stats

    def check_liveness(self) -> None:
        """A calm scenario (disjoint work, nothing injected): every round of every writer committed."""
        if not self.scenario.calm:
            return
        for plan in self.scenario.writers:
            for number in range(len(plan.rounds)):
                outcome = self.rounds.get((plan.index, number), {})
                if outcome.get("outcome") != "ok":
                    self.fail(
                        "liveness",
                        f"w{plan.index} round {number} of a calm scenario did not commit: "
                        f"{outcome.get('outcome', 'no outcome')} {outcome.get('message', '')}".rstrip(),
                    )

    def check_visibility(self, data: list[TimelineFile]) -> Model:
        """1: the snapshot (cowrite and hudi-rs) is the completed instants' batches, in commit order."""
        plans = {w.index: w for w in self.scenario.writers}
        model = Model.seeded(self.scenario.seed_rows, self.o.seed_instant)
        for row in self.scenario.seed_rows:
            self.versions[(row.id, self.o.seed_instant)] = model.rows[row.id]
        for item in data:
            time_ = item.instant.requested_time
            if time_ == self.o.seed_instant or time_ in self.schema_commits:
                continue
            claim = self.claims.get(time_)
            if claim is None:
                self.fail("1", f"completed instant {item.instant.file_name} was claimed by no writer")
                continue
            round_ = plans[claim["worker"]].rounds[claim["round"]]
            written = model.apply(round_.op, round_.rows, time_, round_.column)
            for key in written:
                self.versions[(key, time_)] = model.rows[key]
        expected = sorted(model.rows.values())
        snapshot = read.snapshot(self.table, with_meta=True)
        mine = _records(snapshot)
        if mine != expected:
            self.fail("1", f"cowrite's snapshot differs from the model: {_diff(expected, mine)}")
        hudi_rs = _hudi_snapshot(self.o.uri, self.o.hudi_options)
        theirs = _records(hudi_rs)
        if theirs != expected:
            self.fail("1", f"hudi-rs's snapshot differs from the model: {_diff(expected, theirs)}")
        self.check_columns(model, snapshot, hudi_rs)
        return model

    def check_columns(self, model: Model, mine: pa.Table, theirs: pa.Table) -> None:
        """1, the columns rounds added: the table's schema keeps each, and both readers return its values.
        hudi-rs takes the schema from the commit of the latest instant time; where a writer died or failed
        before the empty commit that records a change there, the daemon's final cleaning records it."""
        schema = latest_schema(self.table, self.table.timeline())
        kept = set(arrow_schema(schema).names) if schema else set()
        for column in sorted(model.columns - kept):
            self.fail("1", f"the table's schema lost column {column}, which a completed round added")
        values = model.column_values()
        for reader, table in (("cowrite", mine), ("hudi-rs", theirs)):
            for column, expected in sorted(values.items()):
                if not expected:
                    continue  # no rows left
                if column not in table.column_names:
                    self.fail("1", f"{reader}'s snapshot has no column {column}")
                    continue
                ids, got = table.column("id").to_pylist(), table.column(column).to_pylist()
                found = dict(zip(ids, got, strict=True))
                wrong = sorted((k, v, found.get(k)) for k, v in expected.items() if found.get(k) != v)
                if wrong:
                    self.fail("1", f"{reader} reads {column} unlike the model (key, want, got): {wrong[:4]}")

    def check_contract(self, evidence: Evidence) -> None:
        """What a writer reports is true: "ok" committed; any CowriteError but "unknown": nothing did."""
        by_round: dict[tuple[int, int], list[str]] = defaultdict(list)
        for time_, claim in self.claims.items():
            by_round[(claim["worker"], claim["round"])].append(time_)
        for key, event in self.rounds.items():
            outcome, claimed = event["outcome"], by_round.get(key, [])
            completed = [t for t in claimed if t in evidence.completed and t not in self.schema_commits]
            if outcome == "ok":
                if completed != [event["instant"]]:
                    self.fail(
                        "contract",
                        f"w{key[0]} round {key[1]} reported commit {event['instant']}, the "
                        f"table shows completed {completed} of its instants {claimed}",
                    )
            elif outcome not in ("CommitStateUnknownError", "crash") and completed:
                self.fail(
                    "contract",
                    f"w{key[0]} round {key[1]} reported {outcome} ('nothing committed'), yet "
                    f"its instant {completed} completed: {event.get('message', '')}",
                )

    def check_overlap(self, evidence: Evidence, data: list[TimelineFile]) -> None:
        """2: no two completed instants with overlapping lifetimes touched the same file group."""
        commits = [f for f in data if f.instant.requested_time != self.o.seed_instant]

        def saw(viewer: TimelineFile, other: TimelineFile) -> bool:
            """Whether ``viewer``'s writer began after ``other`` completed: it found it completed, or it
            found it no more because it had been archived (archival and begin both hold the lock)."""
            claim = self.claims.get(viewer.instant.requested_time, {})
            if other.instant.requested_time in claim.get("seen", ()):
                return True
            return other.archived_before is not None and other.archived_before < claim.get("wall", 0.0)

        for i, first in enumerate(commits):
            for second in commits[i + 1 :]:
                a, b = first.instant.requested_time, second.instant.requested_time
                if saw(first, second) or saw(second, first):
                    continue  # one began after the other completed
                both = evidence.metadata[a].touched_file_groups & evidence.metadata[b].touched_file_groups
                if both:
                    self.fail(
                        "2", f"concurrent instants {a} and {b} both completed and both touched {sorted(both)}"
                    )

    def check_times(self, evidence: Evidence) -> None:
        """3: instant times unique, an instant claimed after another completed carrying the later time;
        completion times unique and increasing in commit order, across archival."""
        completions = Counter(f.instant.completion_time for f in evidence.completed.values())
        for time_, count in completions.items():
            if count > 1:
                self.fail("3", f"completion time {time_} is used {count} times")
        for item in evidence.completed.values():
            if (item.instant.completion_time or "") <= item.instant.requested_time:
                self.fail("3", f"{item.instant.file_name} completed before it was requested")
        slack = 1.0 if self.scenario.backend == "s3" else 0.0
        active = [f for f in evidence.completed.values() if f.modified is not None]
        for earlier, later in _out_of_order(active, lambda f: f.instant.completion_time or "", slack):
            self.fail(
                "3",
                f"{later.instant.file_name} was published after {earlier.instant.file_name} "
                "with a smaller completion time",
            )
        for archived in (f for f in evidence.completed.values() if f.archived_before is not None):
            for item in active:
                if (item.modified or 0) - (archived.archived_before or 0) > slack and (
                    item.instant.completion_time or ""
                ) <= (archived.instant.completion_time or ""):
                    self.fail(
                        "3",
                        f"{item.instant.file_name} was published after {archived.instant.file_name} "
                        "was archived, with a smaller completion time",
                    )
        # A claim may lie below a pending instant claimed meanwhile (its claimant had not seen that one),
        # never below one that completed before it was made.
        claims = [f for f in evidence.requested_files.values() if f.modified is not None]
        for earlier, later in _out_of_order(active, lambda f: f.instant.requested_time, slack, made=claims):
            if earlier.instant.requested_time == later.instant.requested_time:
                continue  # two actions' claims of one time: a time used by several actions, said above
            self.fail(
                "3",
                f"instant {later.instant.requested_time} was claimed after "
                f"{earlier.instant.file_name} completed, with a smaller time",
            )
        log = self.o.commit_log
        for entry in log:
            item = evidence.completed.get(entry["instant"])
            if item is None or item.instant.completion_time != entry["completion"]:
                self.fail(
                    "3",
                    f"the commit log has {entry['instant']}_{entry['completion']}, the timeline has "
                    f"{item.instant.file_name if item else 'nothing'}",
                )
        for earlier, later in zip(log, log[1:], strict=False):
            if later["lock_id"] is not None and later["lock_id"] == earlier["lock_id"]:
                self.stats.grouped += 1
            if later["completion"] <= earlier["completion"]:
                self.fail(
                    "3",
                    f"commit {later['instant']} followed {earlier['instant']} with a completion time "
                    f"that is not larger ({later['completion']} <= {earlier['completion']})",
                )
            # (one turn logs every commit it published, its own and those of waiters: group commit)
            if None not in (earlier["lock_id"], later["lock_id"]) and later["lock_id"] < earlier["lock_id"]:
                self.fail(
                    "3",
                    f"commit {later['instant']} under lock{later['lock_id']} followed "
                    f"{earlier['instant']} under lock{earlier['lock_id']}",
                )

    def check_leases(self, evidence: Evidence) -> None:
        """4: a writer whose lease expired, or whose lock was expired by another, never published."""
        expiries = self._expired_locks()
        # when each instant was first published, by its writer or by the holder of a turn it queued behind
        published: dict[str, float] = {}
        for entry in sorted(self.o.commit_log, key=itemgetter("wall")):
            published.setdefault(entry["instant"], entry["wall"])
        for worker, events in self.o.events.items():
            for event in events:
                # Stopped while claiming, a writer held no instant: the lease of the claim it made after it
                # continued runs from that claim's create.
                if event["event"] == "fault" and event["kind"] == "stop" and event["step"] not in (
                    "published",
                    "claiming",
                ):
                    instant = event.get("instant")
                    if instant is None or instant not in evidence.completed:
                        continue
                    resumed = next(
                        (e["wall"] for e in events if e["event"] == "resumed" and e["wall"] >= event["wall"]),
                        float("inf"),
                    )
                    if published.get(instant, float("inf")) < event["wall"]:
                        # a holder ahead in the queue published it before the stop (soak 76, seed 888418,
                        # scenario 2): its writer, stopped holding a turn of its own, found it completed
                        continue
                    if resumed - event["wall"] < self.margin:
                        # Continued within the lease's safety margin, however long it was meant to stop
                        # (once in a soak its own SIGSTOP was over within a millisecond and its heartbeat
                        # renewed as before): a stop that short changes nothing, as the harness's short
                        # stops show; a lock expired meanwhile is judged from the commit log, below.
                        continue
                    if event["step"] == "claimed":
                        # no heartbeat yet: reported only if a lock of its process was expired meanwhile
                        if not any(
                            pid == event["pid"] and event["wall"] <= when <= resumed for pid, when in expiries
                        ):
                            continue
                    self.fail(
                        "4",
                        f"w{worker} was stopped past its lease at {event['step']} of {instant}, "
                        "and that instant completed after it continued",
                    )
        released = {info.name: self._written(info.modified) for info in self.storage.list(LOCK_DIR)}
        for entry in self.o.commit_log:
            lock_id = entry.get("lock_id")
            item = evidence.completed.get(entry["instant"])
            if lock_id is None or item is None or item.modified is None:
                continue
            try:
                release = read_release(self.storage, lock_id)
            except (FileNotFoundError, CowriteError):
                continue
            # the expiry takes effect when its file exists, not when the expirer decided on it
            when = released.get(f"lock{lock_id}.released")
            if release.get("reason") == "expired" and when is not None and item.modified > when + self.slack:
                self.fail(
                    "4",
                    f"{item.instant.file_name} was published under lock{lock_id} "
                    f"{item.modified - when:.3f} s after that lock was expired by {release.get('owner')}",
                )

    def _expired_locks(self) -> list[tuple[int, float]]:
        """(pid of the holder, when) of every lock some other party expired."""
        found = []
        for info in self.storage.list(LOCK_DIR):
            if not info.name.endswith(".released"):
                continue
            lock_id = int(info.name[4:].split(".")[0])
            try:
                release = read_release(self.storage, lock_id)
                holder = read_holder(self.storage, lock_id)
            except (FileNotFoundError, CowriteError):
                continue
            parts = holder.owner.split(":")
            if release.get("reason") == "expired" and len(parts) >= 2 and parts[-2].isdigit():
                found.append((int(parts[-2]), float(release.get("time") or 0.0)))  # type: ignore[arg-type]
        return found

    def check_retention(self, data: list[TimelineFile], evidence: Evidence) -> None:
        """5: every base file a retained commit references exists. The empty commits that record the
        schema count among the retained, as the cleaner counts every completed commit."""
        retained = data[-self.scenario.commits_retained :]
        existing = {b.path for b in list_base_files(self.table)}
        for item in retained:
            for stat in evidence.metadata[item.instant.requested_time].write_stats:
                if stat.path not in existing:
                    self.fail(
                        "5", f"{stat.path}, written by retained commit {item.instant.file_name}, is gone"
                    )

    def check_rollbacks(self, evidence: Evidence) -> None:
        """6: rollbacks touched only instants whose writer was gone (heartbeat expired or aborted), each
        instant once (unless it came back: its writer resumed and wrote ``.inflight`` again after the
        rollback, or a writer claimed its time again once the rollback had deleted the claim, and left
        that claim behind), only its own files; a second run changes nothing. Instants are told apart by
        time and action: two claimants of one time that both failed to withdraw leave two claims, each
        rolled back once."""
        targets: defaultdict[tuple[str, str], list[str]] = defaultdict(list)
        first_done: dict[str, float] = {}
        # target -> when its first rollback was planned: it deletes the target's files after that
        first_planned: dict[str, float] = {}
        untimed: set[str] = set()  # targets with a rollback archived, which keeps no file times: the first
        for time_, item in evidence.completed.items():
            if item.instant.action is not Action.ROLLBACK:
                continue
            self.stats.rollbacks += 1
            content = self._requested_content(evidence, time_, Action.ROLLBACK)
            if content is None:
                self.fail("6", f"rollback {time_} has no plan")
                continue
            plan = RollbackPlan.from_bytes(content, time_)
            targets[(plan.target, plan.target_action)].append(time_)
            if item.modified is None:
                untimed.add(plan.target)
            else:
                first_done[plan.target] = min(item.modified, first_done.get(plan.target, item.modified))
            requested = evidence.requested_files.get((time_, Action.ROLLBACK))
            planned_at = requested.modified if requested is not None else item.modified
            if planned_at is not None:
                first_planned[plan.target] = min(planned_at, first_planned.get(plan.target, planned_at))
            # (a claim left behind may share its time with another action's instant, which may complete;
            # or, made again from a stale floor, with an instant completed and archived before it: a create
            # acts only where no file is. Its rollback then names no file, and removes only that claim.)
            done = evidence.completed.get(plan.target)
            again = done is not None and done.archived_before is not None and not plan.files
            if done is not None and done.instant.action.value == plan.target_action:
                if not (again and any(t > done.archived_before for t in self.left_behind[plan.target])):
                    self.fail("6", f"rollback {time_} targets {plan.target}, which completed")
            for path in plan.files:
                base = BaseFile.parse(FileInfo(path, 0, 0.0))
                if base is None or base.instant_time != plan.target:
                    self.fail(
                        "6", f"rollback {time_} of {plan.target} deleted {path}, not a file of its target"
                    )
            if requested is None or requested.modified is None or plan.target not in self.claims:
                continue
            judged_at = requested.modified
            # the plan was recorded up to self.slack after the file's modification time
            given_up = self.given_up.get(plan.target)
            if given_up is not None and given_up <= judged_at + self.slack:
                continue  # the writer aborted first: failed at once
            # the judge looks at the heartbeat; only an instant that never had one is judged by its files
            beats = [t for t in self.beats[plan.target] if t <= judged_at + EPSILON]
            alive = sorted(beats or [t for t in self.life[plan.target] if t <= judged_at + EPSILON])
            if not alive:
                continue
            # Stale at some moment before the plan was recorded: between two renewals (a slow one lands
            # late) or after the last. Modification times are when a renewal became visible to judges.
            longest = max(
                later - earlier for earlier, later in zip(alive, [*alive[1:], judged_at], strict=True)
            )
            if longest < self.tolerance - self.slack:
                self.fail(
                    "6",
                    f"rollback {time_} judged {plan.target} failed, yet its heartbeat was never older than "
                    f"{longest:.3f} s before (tolerance {self.tolerance} s)",
                )
        for (target, _), rollbacks in targets.items():
            # The instant came back after its first rollback: its writer wrote .inflight again, or a writer
            # claimed its time again (a claim from a stale floor) and left that claim behind. A claim is
            # created only once the old one is deleted, which the rollback does before it completes.
            done = first_done.get(target, float("inf"))
            claimable = min(done, first_planned.get(target, done) + self.slack)
            if target in untimed and target in self.claims:
                # its first rollback was archived, which keeps no file times (those of a later one are not
                # the first's): a claim left behind after its writer claimed the time is a second claim (a
                # create acts only where no file is)
                claimable = min(claimable, self.claims[target]["wall"])
            came_back = any(t > done for t in self.planned[target]) or any(
                t > claimable for t in self.left_behind[target]
            )
            if len(rollbacks) > 1 and not came_back:
                by = ", ".join(sorted(rollbacks))
                self.fail("6", f"instant {target} was rolled back {len(rollbacks)} times: by {by}")
        before = _inventory(self.storage)
        again = rollback_failed(self.table, service_lock(self.table, "chaos-checker"), self.o.policy)
        if again:
            self.fail("6", f"a second rollback found more to do: {[r.target for r in again]}")
        after = _inventory(self.storage)
        changed = {
            k
            for k in before.keys() | after.keys()
            if before.get(k) != after.get(k) and not k.startswith(LOCK_DIR)
        }
        if changed:
            self.fail("6", f"a second rollback changed files: {sorted(changed)[:10]}")

    def check_locks(self) -> None:
        """7: the lock is free once everything settled."""
        try:
            lock = current_lock(self.storage)
        except CowriteError as exc:
            self.fail("7", f"the current lock is unreadable: {exc}")
            return
        if lock is not None and lock.holder is not None:
            self.fail(
                "7",
                f"lock{lock.lock_id} is still held by {lock.holder.owner} (instant {lock.holder.instant})",
            )

    def check_consumers(self, model: Model, evidence: Evidence) -> None:
        """8: every consumer's pulls deliver the snapshot, each row version at most once, nothing else."""
        expected = {r[0]: r for r in model.rows.values()}
        for consumer in self.o.consumers:
            name = f"consumer {consumer.name}"
            self.stats.consumer_pulls += len(consumer.pulls)
            self.stats.consumer_retries += consumer.retries
            for crash in consumer.crashes:
                self.fail("8", f"{name} failed: {crash}")
            delivered: Counter[tuple[str, str]] = Counter()
            state: dict[str, Any] = {}
            self.stats.consumer_resyncs += consumer.resyncs
            for pull in consumer.pulls:
                if pull.resync:  # started over from a snapshot: what came before does not count
                    delivered.clear()
                    state.clear()
                elif pull.before is not None and (pull.after is None or pull.after < pull.before):
                    self.fail("8", f"{name}'s checkpoint went back from {pull.before} to {pull.after}")
                keys_here = Counter(row[0] for row in pull.rows)
                for key, count in keys_here.items():
                    if count > 1:
                        self.fail("8", f"{name} got key {key} {count} times in one pull")
                for row in pull.rows:
                    if not pull.resync:
                        delivered[(row[0], row[4])] += 1
                    if self.versions.get((row[0], row[4])) != tuple(row):
                        self.fail("8", f"{name} got {row}, which no completed instant wrote")
                    state[row[0]] = tuple(row)
            for (key, instant), count in delivered.items():
                if count > 1:
                    self.fail("8", f"{name} got {key} of {instant} {count} times")
            missing = [r for k, r in expected.items() if state.get(k) != r]
            if missing:
                self.fail(
                    "8",
                    f"{name} ({len(consumer.pulls)} pulls) does not add up to the snapshot: "
                    f"{len(missing)} rows differ, e.g. expected {missing[:3]}, got "
                    f"{[state.get(r[0]) for r in missing[:3]]}",
                )
            extra = set(state) - set(expected) - model.removed
            if extra:
                self.fail("8", f"{name} got keys that are in no snapshot: {sorted(extra)[:10]}")

    def check_garbage(self, evidence: Evidence) -> None:
        """9: after the run, nothing of a failed write remains, and no instant is pending."""
        timeline = self.table.timeline()
        for instant in timeline.pending():
            self.fail("9", f"{instant.file_name} is still pending after the final rollback")
        for base in list_base_files(self.table):
            item = evidence.completed.get(base.instant_time)
            if item is None or not item.instant.action.writes_data:
                self.fail("9", f"{base.path} belongs to no completed instant: garbage left behind")
        for info in self.storage.list(HEARTBEAT_DIR):
            self.fail("9", f"heartbeat {info.path} left behind")
        for info in self.storage.walk_files(MARKER_DIR):
            self.fail("9", f"marker {info.path} left behind")
        down = [f for f in self.o.harness if f["kind"] in ("daemon-kill", "daemon-start")]
        if self.scenario.daemon == "none" or down:
            self.stats.commits_without_daemon += self._commits_while_down(evidence, down)

    def _commits_while_down(self, evidence: Evidence, marks: list[dict[str, Any]]) -> int:
        if self.scenario.daemon == "none":
            return self.stats.commits
        intervals, start = [], None
        for mark in marks:
            if mark["kind"] == "daemon-kill":
                start = mark["wall"]
            elif start is not None:
                intervals.append((start, mark["wall"]))
                start = None
        if start is not None:
            intervals.append((start, float("inf")))
        return sum(1 for entry in self.o.commit_log if any(a <= entry["wall"] <= b for a, b in intervals))


def _records(table: pa.Table) -> list[Record]:
    if table.num_rows == 0:
        return []
    columns = [table.column(c).to_pylist() for c in ("id", "part", "ts", "value", "_hoodie_commit_time")]
    return sorted(zip(*columns, strict=True))


def _hudi_snapshot(uri: str, options: dict[str, str]) -> pa.Table:
    from hudi import HudiTableBuilder

    builder = HudiTableBuilder.from_base_uri(uri)
    if options:
        builder = builder.with_storage_options(options)
    batches = builder.build().read()
    return pa.Table.from_batches(batches) if batches else pa.table({})


def _diff(expected: Iterable[Record], found: Iterable[Record]) -> str:
    want, got = set(expected), set(found)
    missing, extra = sorted(want - got), sorted(got - want)
    return f"{len(missing)} missing, e.g. {missing[:4]}; {len(extra)} unexpected, e.g. {extra[:4]}"


def _inventory(storage: Storage) -> dict[str, int]:
    return {info.path: info.size for info in storage.walk_files()}


def rows_of(rows: Iterable[Row]) -> list[tuple[str, str, int, str]]:
    return [(r.id, r.part, r.ts, r.value) for r in rows]


def _out_of_order(
    files: list[TimelineFile],
    key: Callable[[TimelineFile], str],
    slack: float,
    made: list[TimelineFile] | None = None,
) -> list[tuple[TimelineFile, TimelineFile]]:
    """Pairs (earlier, later), ``earlier`` of ``files`` and ``later`` of ``made`` (or of ``files``), in
    which ``later`` was written more than ``slack`` after ``earlier`` was surely in place, yet its ``key``
    is not the greater: one pair for each such later file."""
    found = []
    for later in files if made is None else made:
        before = [
            f for f in files if (later.modified or 0) - (f.in_place or 0) > slack and key(later) <= key(f)
        ]
        if before:
            found.append((max(before, key=key), later))
    return found


def _left_behind_by(fault: str, path: str) -> str | None:
    """The time of the claim a storage ``fault`` on ``path`` may leave behind, else None: a delete of its
    ``.requested`` file that failed, a create of it that acted but lost its answer, or any failed delete
    of its ``.inflight`` (a withdrawal deletes the plan first, and stops there)."""
    directory, _, name = path.rpartition("/")
    if directory != TIMELINE_DIR:
        return None
    try:
        instant = Instant.parse(name)
    except InvalidInstantError:
        return None
    if instant.state is State.REQUESTED and fault in ("delete-fail", "create-lost-ack"):
        return instant.requested_time
    if instant.state is State.INFLIGHT and fault in ("delete-fail", "delete-lost-ack"):
        return instant.requested_time
    return None
