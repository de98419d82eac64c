"""Runs one scenario: a fresh table, writer processes, faults, a daemon, a cleaner, consumers; then settles.

The run ends only once everything is settled: every writer exited (or was killed), every stopped writer
was continued, the lease tolerance has passed, and a fresh daemon service (the production code path: lock
reaper, lazy rollback, cleaner, archival, overlay) has polled the table. What it leaves is what the
checker judges.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pyarrow as pa
from prometheus_client import CollectorRegistry

from cowrite.cleaner import archive, clean, rollback_failed, service_lock
from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.metrics import DaemonMetrics
from cowrite.daemon.service import Daemon, TableService
from cowrite.errors import CowriteError
from cowrite.format import config as keys
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.transaction import WriteOptions

from .consumers import Consumer
from .daemon_proc import config_from
from .plan import DAEMON, Row, Scenario

ROOT = Path(__file__).resolve().parents[2]
WRITER_DEADLINE = 120.0  # a writer still running this long after the release is reported as hung
SEED_TRIES = 3  # the harness's own first write, retried like a user would (its lease may be lost under load)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    stderr: Path

    def running(self) -> bool:
        return self.popen.poll() is None

    def state(self) -> str:
        """The kernel's state letter (R, S, T for stopped, ...), "" once gone."""
        try:
            text = Path(f"/proc/{self.popen.pid}/stat").read_text()
        except OSError:
            return ""
        return text.rsplit(")", 1)[1].split()[0]

    def output(self) -> str:
        return self.stderr.read_text(errors="replace")[-3000:] if self.stderr.exists() else ""


@dataclass
class Outcome:
    """Everything a scenario left for the checker."""

    scenario: Scenario
    uri: str
    storage_options: dict[str, Any]  # for the checker: the store without the delaying proxy
    hudi_options: dict[str, str]
    seed_instant: str
    events: dict[int, list[dict[str, Any]]]  # writer -> its events, in order
    commit_log: list[dict[str, Any]]
    harness: list[dict[str, Any]]  # faults the harness injected: kill, stop, cont, short-stop, daemon-*
    exits: dict[int, int | None]
    outputs: dict[int, str]
    consumers: list[Consumer]
    problems: list[str] = field(default_factory=list)  # crashes and hangs seen by the harness
    notes: list[str] = field(default_factory=list)  # errors that are expected under faults, for the log
    final_rollbacks: int = 0
    policy: HeartbeatPolicy = field(default_factory=HeartbeatPolicy)


def settings(scenario: Scenario) -> dict[str, str]:
    """Write settings every party uses (also stored in the table's properties)."""
    return {
        keys.HEARTBEAT_INTERVAL_MS.key: str(scenario.interval_ms),
        keys.HEARTBEAT_TOLERABLE_MISSES.key: str(scenario.misses),
        keys.LEASE_SAFETY_MARGIN_MS.key: str(scenario.interval_ms // 2),
        keys.LOCK_WAIT_MS.key: "20000",
        keys.LOCK_RETRY_WAIT_MS.key: "5",
        keys.LOCK_MAX_RETRY_WAIT_MS.key: "50",
        keys.CLEANER_COMMITS_RETAINED.key: str(scenario.commits_retained),
        keys.KEEP_MIN_COMMITS.key: str(scenario.archive[0] if scenario.archive else 10_000),
        keys.KEEP_MAX_COMMITS.key: str(scenario.archive[1] if scenario.archive else 10_001),
        **scenario.settings,
    }


def rows_table(rows: list[Row] | tuple[Row, ...]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([r.id for r in rows], pa.string()),
            "part": pa.array([r.part for r in rows], pa.string()),
            "ts": pa.array([r.ts for r in rows], pa.int64()),
            "value": pa.array([r.value for r in rows], pa.string()),
        }
    )


def environment(values: dict[str, str]) -> AbstractContextManager[Any]:
    """``values`` in this process's environment meanwhile: the in-process daemon opens tables by URI,
    like a deployed one, and finds the S3 endpoint there."""
    return patch.dict(os.environ, values)


class _ErrorLog(logging.Handler):
    """Collects error records of cowrite's daemon and cleaner running in this process."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _errors_logged() -> Iterator[_ErrorLog]:
    handler = _ErrorLog()
    logger = logging.getLogger("cowrite")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class Run:
    """One scenario being run; :meth:`execute` returns its :class:`Outcome`."""

    def __init__(self, scenario: Scenario, workdir: Path, s3: Any = None, direct: Any = None) -> None:
        """``s3``: the S3 endpoint the scenario's parties use; ``direct``: the same server without the
        delaying proxy, for the checker (checking is not under test), ``s3`` itself by default."""
        self.scenario = scenario
        self.workdir = workdir
        self.rng = random.Random(f"cowrite-chaos:{scenario.seed}:{scenario.index}:harness")
        workdir.mkdir(parents=True, exist_ok=True)
        if scenario.backend == "s3":
            assert s3 is not None, "an S3 scenario needs the moto server"
            self.uri = (
                f"s3://{s3.bucket}/chaos-{scenario.seed}-{scenario.index}-{os.getpid()}-{time.time_ns()}"
            )
            self.storage_options: dict[str, Any] = s3.storage_options()
            self.env: dict[str, str] = s3.env()
            direct = direct or s3
            self.checked_options: dict[str, Any] = direct.storage_options()
            self.hudi_options = {
                "aws_endpoint_url": direct.endpoint_url,
                "aws_access_key_id": self.env["AWS_ACCESS_KEY_ID"],
                "aws_secret_access_key": self.env["AWS_SECRET_ACCESS_KEY"],
                "aws_region": self.env["AWS_DEFAULT_REGION"],
                "aws_allow_http": "true",
            }
        else:
            self.uri = str(workdir / "table")
            self.storage_options, self.checked_options, self.env, self.hudi_options = {}, {}, {}, {}
        self.settings = settings(scenario)
        self.policy = HeartbeatPolicy(scenario.interval_ms / 1000, scenario.misses)
        self.harness: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.writers: dict[int, Process] = {}
        self.daemon_process: Process | None = None
        self.daemon_thread: Daemon | None = None
        self.daemon_starts = 0
        self.starving: set[int] = set()  # writers (or DAEMON) being starved right now
        self._cleaner_stop = threading.Event()
        self._cleaner: threading.Thread | None = None
        self.consumers = [
            Consumer(self.uri, self.storage_options, mode, f"{mode}-{i}", period=self.rng.uniform(0.03, 0.15))
            for i, mode in enumerate(scenario.consumers)
        ]

    # -- set-up ----------------------------------------------------------------------------------
    def _create(self) -> str:
        """Create the table and commit its seed rows; raises the last :class:`CowriteError` if every one
        of :data:`SEED_TRIES` writes failed."""
        table = Table.create(
            self.uri,
            name=f"chaos{self.scenario.index}",
            record_key_fields=["id"],
            partition_fields=["part"],
            ordering_fields=["ts"],
            properties=self.settings,
            storage_options=self.storage_options,
        )
        writer = LocalWriter(table, WriteOptions(config=table.config))
        for attempt in range(1, SEED_TRIES + 1):
            try:
                return writer.insert(rows_table(self.scenario.seed_rows)).requested_time
            except CowriteError as exc:
                self.notes.append(f"the seed write failed (try {attempt}): {type(exc).__name__}: {exc}")
                if attempt == SEED_TRIES:
                    raise
        raise AssertionError("unreachable")

    def _spawn(self, name: str, module: str, argument: Path) -> Process:
        """``module`` runs as ``python -m``, or as a script when given as a path (``*.py``): a script
        does not import this package first, so it starts fast enough to catch a SIGTERM while starting."""
        stderr = self.workdir / f"{name}.stderr"
        run = [str(ROOT / module)] if module.endswith(".py") else ["-m", module]
        with open(stderr, "ab") as stream:
            popen = subprocess.Popen(
                [sys.executable, *run, str(argument)],
                cwd=ROOT,
                env={**os.environ, **self.env, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stream,
            )
        return Process(name, popen, stderr)

    def _start_writers(self) -> None:
        for plan in self.scenario.writers:
            spec = {
                "seed": self.scenario.seed * 1000 + self.scenario.index,
                "index": plan.index,
                "uri": self.uri,
                "storage_options": self.storage_options,
                "settings": self.settings,
                "skew": plan.skew,
                "retries": plan.retries,
                "early_conflicts": plan.early_conflicts,
                "pause_between_rounds": plan.pause_between_rounds,
                "step_fault": plan.step_fault
                and {
                    "round": plan.step_fault.round,
                    "step": plan.step_fault.step,
                    "kind": plan.step_fault.kind,
                },
                "fault_rate": plan.fault_rate,
                "fault_kinds": list(plan.fault_kinds),
                "rounds": [
                    {"op": r.op, "rows": [vars(row) for row in r.rows], "column": r.column}
                    for r in plan.rounds
                ],
                "events": str(self.workdir / f"w{plan.index}.events"),
                "commit_log": str(self.workdir / "commits.log"),
                "loaded": str(self.workdir / f"w{plan.index}.loaded"),
                "start": str(self.workdir / "start"),
            }
            path = self.workdir / f"w{plan.index}.json"
            path.write_text(json.dumps(spec))
            self.writers[plan.index] = self._spawn(f"w{plan.index}", "bench.chaos.worker", path)

    def _daemon_spec(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "name": "chaos",
            "settings": self.settings,
            "poll": 0.1 if self.scenario.backend == "local" else 0.25,
            "clean": 0.4,
            "commits_retained": self.scenario.commits_retained,
            "locks_kept": 100_000,
        }

    def _start_daemon(self) -> None:
        mode = self.scenario.daemon
        if mode == "thread":
            self.daemon_thread = Daemon(config_from(self._daemon_spec()), registry=CollectorRegistry())
            self.daemon_thread.start(serve_http=False)
        elif mode in ("process", "process-killed"):
            path = self.workdir / f"daemon-{self.daemon_starts}.json"
            path.write_text(json.dumps(self._daemon_spec()))
            name = f"daemon-{self.daemon_starts}"
            self.daemon_process = self._spawn(name, "bench/chaos/daemon_proc.py", path)
            self.daemon_starts += 1
            self.harness.append({"kind": "daemon-start", "wall": time.time()})

    def _cleaner_loop(self) -> None:
        table = Table.load(self.uri, **self.storage_options)
        lock = service_lock(table, "chaos-cleaner")
        while not self._cleaner_stop.wait(self.rng.uniform(0.05, 0.25)):
            try:
                rollback_failed(table, lock, self.policy)
                clean(table, lock, self.scenario.commits_retained)
                archive(table, lock)
            except CowriteError as exc:
                self.notes.append(f"cleaner: {type(exc).__name__}: {exc}")
            except Exception as exc:
                self.problems.append(
                    f"the cleaner crashed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
                )

    # -- the run ---------------------------------------------------------------------------------
    def execute(self) -> Outcome:
        seed_instant = self._create()
        try:
            with _errors_logged() as errors:
                self._run()
                self._settle()
            for record in errors.records:
                message = record.getMessage()
                crashed = record.exc_info is not None and not isinstance(record.exc_info[1], CowriteError)
                (self.problems if crashed else self.notes).append(
                    f"daemon/cleaner logged: {message}"
                    + (f" ({record.exc_info[1]!r})" if crashed and record.exc_info else "")
                )
        finally:
            self._kill_everything()
        return Outcome(
            scenario=self.scenario,
            uri=self.uri,
            storage_options=self.checked_options,
            hudi_options=self.hudi_options,
            seed_instant=seed_instant,
            events={w: _read_lines(self.workdir / f"w{w}.events") for w in self.writers},
            commit_log=_read_lines(self.workdir / "commits.log"),
            harness=self.harness,
            exits={w: p.popen.returncode for w, p in self.writers.items()},
            outputs={w: p.output() for w, p in self.writers.items()},
            consumers=self.consumers,
            problems=self.problems,
            notes=self.notes,
            policy=self.policy,
        )

    def _run(self) -> None:
        self._start_daemon()
        self._start_writers()
        loaded_by = time.monotonic() + 60
        while time.monotonic() < loaded_by and not all(
            (self.workdir / f"w{w}.loaded").exists() or not p.running() for w, p in self.writers.items()
        ):
            time.sleep(0.01)
        for consumer in self.consumers:
            consumer.start()
        if self.scenario.cleaner_thread:
            self._cleaner = threading.Thread(target=self._cleaner_loop, name="chaos-cleaner", daemon=True)
            self._cleaner.start()
        (self.workdir / "start").touch()
        released = time.monotonic()
        self.harness.append({"kind": "release", "wall": time.time()})
        timed = sorted(self.scenario.timed, key=lambda t: t.at)
        daemon_kills = list(self.scenario.daemon_kills)
        daemon_restart_at: float | None = None
        stopped: dict[int, float] = {}  # writer -> when to continue it (monotonic)
        while True:
            now = time.monotonic()
            elapsed = now - released
            for index, process in self.writers.items():
                if process.state() == "T" and index not in stopped and index not in self.starving:
                    stopped[index] = now + self.scenario.stop_for
                    self.harness.append({"kind": "stop", "writer": index, "wall": time.time()})
            for index, until in list(stopped.items()):
                if now >= until:
                    self._signal(index, signal.SIGCONT)
                    self.harness.append({"kind": "cont", "writer": index, "wall": time.time()})
                    del stopped[index]
            while timed and timed[0].at <= elapsed:
                fault = timed.pop(0)
                if fault.kind == "starve":
                    self._starve(fault.writer, fault.duration)
                    continue
                process = self.writers[fault.writer]
                if not process.running() or fault.writer in stopped or fault.writer in self.starving:
                    continue
                if fault.kind == "kill":
                    self.harness.append({"kind": "kill", "writer": fault.writer, "wall": time.time()})
                    self._signal(fault.writer, signal.SIGKILL)
                else:
                    self._signal(fault.writer, signal.SIGSTOP)
                    time.sleep(fault.duration)
                    self._signal(fault.writer, signal.SIGCONT)
                    self.harness.append(
                        {
                            "kind": "short-stop",
                            "writer": fault.writer,
                            "wall": time.time(),
                            "duration": fault.duration,
                        }
                    )
            if daemon_kills and daemon_kills[0] <= elapsed and self.daemon_process is not None:
                daemon_kills.pop(0)
                self.daemon_process.popen.send_signal(signal.SIGKILL)
                self.daemon_process.popen.wait(30)
                self.harness.append({"kind": "daemon-kill", "wall": time.time()})
                self.daemon_process = None
                if daemon_kills:
                    daemon_restart_at = elapsed + self.rng.uniform(0.2, 1.0)
            if daemon_restart_at is not None and elapsed >= daemon_restart_at:
                daemon_restart_at = None
                self._start_daemon()
            if self.daemon_process is not None and not self.daemon_process.running():
                self.problems.append(
                    f"the daemon process died by itself ({self.daemon_process.popen.returncode}):"
                    f"\n{self.daemon_process.output()}"
                )
                self.daemon_process = None
            if not any(p.running() for p in self.writers.values()):
                break
            if elapsed > WRITER_DEADLINE:
                for index, process in self.writers.items():
                    if process.running():
                        self.problems.append(
                            f"writer w{index} hung (state {process.state()}):\n{process.output()}"
                        )
                        self._signal(index, signal.SIGKILL)
                        self.harness.append(
                            {"kind": "kill", "writer": index, "wall": time.time(), "hung": True}
                        )
                break
            time.sleep(0.01)

    def _starve(self, target: int, duration: float) -> None:
        """SIGSTOP/SIGCONT bursts to a writer or the daemon process for ``duration`` seconds, in a thread.

        Each stop lasts a quarter of a heartbeat interval (half the lease's safety margin: a single stop
        must not outlast the margin between a writer's last lease check and its publish, the window no
        lease closes), and the process then runs for a quarter of that: a fifth of a CPU, for whole
        heartbeat intervals. A writer stopped at a protocol step by itself (its event log says so before it
        stops, and again once it resumed) is never continued here: it is not starved, or the bursts end,
        and the run loop continues it once its stop outlasted the lease, as any step stop.
        """
        process = self.daemon_process if target == DAEMON else self.writers[target]
        events = self.workdir / f"w{target}.events"
        if process is None or not process.running() or target in self.starving or _stopped_itself(events):
            return
        pause = self.scenario.interval_ms / 1000 / 4
        self.starving.add(target)
        started = time.time()
        until = started + duration
        self.harness.append({"kind": "starve", "writer": target, "wall": started, "until": until})

        def bursts() -> None:
            try:
                while time.time() < until and process.running():
                    process.popen.send_signal(signal.SIGSTOP)
                    time.sleep(pause)
                    if _stopped_itself(events):
                        break
                    process.popen.send_signal(signal.SIGCONT)
                    time.sleep(pause / 4)
            except ProcessLookupError:
                pass
            finally:
                self.starving.discard(target)

        threading.Thread(target=bursts, name=f"starve-{target}", daemon=True).start()

    def _signal(self, index: int, sig: signal.Signals) -> None:
        try:
            os.kill(self.writers[index].popen.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            self.writers[index].popen.wait(30)

    def _settle(self) -> None:
        """Stop the cleaner and the daemon, let every lease expire, then let a fresh daemon service finish."""
        while self.starving:  # a starved daemon is continued before it is asked to stop
            time.sleep(0.01)
        self._cleaner_stop.set()
        if self._cleaner is not None:
            self._cleaner.join(timeout=60)
        for consumer in self.consumers:
            consumer.stop()
        time.sleep(self.scenario.tolerance + 0.3)
        if self.daemon_thread is not None:
            self.daemon_thread.stop()
            self.daemon_thread = None
        if self.daemon_process is not None:
            self.daemon_process.popen.send_signal(signal.SIGTERM)
            code = self.daemon_process.popen.wait(60)
            if code != 0:
                self.problems.append(f"the daemon exited {code} on SIGTERM:\n{self.daemon_process.output()}")
            self.daemon_process = None
        if self.scenario.backend == "s3":
            time.sleep(1.0)  # whole-second modification times
        spec = self._daemon_spec()
        config = DaemonConfig(
            tables=(TableEntry(self.uri, "chaos", self.settings),),
            port=0,
            commits_retained=spec["commits_retained"],
            locks_kept=spec["locks_kept"],
        )
        with environment(self.env):
            service = TableService(config.tables[0], config, DaemonMetrics(CollectorRegistry(), lambda: []))
            service.poll()
            service.clean()
            service.poll()
        if not service.status.up:
            self.problems.append(f"the final daemon poll failed: {service.status.error}")
        for consumer in self.consumers:
            consumer.drain()

    def _kill_everything(self) -> None:
        self._cleaner_stop.set()
        for consumer in self.consumers:
            consumer.stop()
        for process in [*self.writers.values(), *([self.daemon_process] if self.daemon_process else [])]:
            if process.running():
                try:
                    os.kill(process.popen.pid, signal.SIGCONT)
                    os.kill(process.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.popen.wait(30)
        if self.daemon_thread is not None:
            self.daemon_thread.stop()


def _stopped_itself(events: Path) -> bool:
    """Whether a writer announced in its event log a stop at a protocol step it has not resumed from."""
    try:
        log = events.read_text()
    except FileNotFoundError:
        return False
    return log.count('"kind": "stop"') > log.count('"event": "resumed"')


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
