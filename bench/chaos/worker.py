"""One chaos writer: a process that writes its rounds with ``LocalWriter`` while faults are injected into it.

``python -m bench.chaos.worker SPEC.json`` (run from the repository root). The spec names the table, the
rounds (operation and rows), the write settings, the clock skew and the faults, which act in this
process only:

- at a protocol step (``plan.STEPS``, or ``plan.UNSAFE_STEP``; named in :mod:`cowrite.steps`, which calls
  this process's observer) of one round the writer kills itself with SIGKILL, or stops itself with SIGSTOP
  (the harness sends SIGCONT once the writer's lease is long gone);
- storage calls of the main thread (``create_if_absent``, listings, ``delete``) fail before acting, fail
  after acting (a lost acknowledgement: the caller cannot know it happened), or are slow. The heartbeat
  thread is spared: a writer whose renewals fail loses its lease, which the stops already cover.

Everything that happens is appended to the events file as one JSON object per line (single ``write`` calls
on an ``O_APPEND`` file, so a kill never leaves half a line, and lines of several processes never mix):
``claimed`` (the instant, the completed instants it saw and when the create of its claim began),
``planned`` (and when its plan began to be written), ``beat`` (a renewal and the
modification time judges see), ``published`` (also appended to the shared commit log, written while the
table lock is held, so the log's order is the commit order), ``abort`` (and its cause), ``gave-up`` (the
heartbeat marked aborted: rollback may start at once), ``round`` (the outcome the writer reports),
``fault``, ``resumed``, ``storage-fault``, ``exit``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa

from cowrite import steps
from cowrite.errors import CowriteError, StorageError
from cowrite.format import config as keys
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import heartbeat_path
from cowrite.protocol.transaction import WriteOptions
from cowrite.shutdown import exit_now
from cowrite.startup import refuse_pandas
from cowrite.steps import Step
from cowrite.storage.backend import LocalStorage, MemoryStorage, S3Storage, Storage
from cowrite.storage.together import THREADS

from .plan import extra_value


class Events:
    def __init__(self, path: Path, worker: int, commit_log: Path) -> None:
        self.path, self.worker, self.commit_log = path, worker, commit_log
        self.round = -1

    def emit(self, name: str, to: Path | None = None, **fields: Any) -> None:
        record = {
            "event": name,
            "worker": self.worker,
            "pid": os.getpid(),
            "round": self.round,
            "wall": time.time(),
            **fields,
        }
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        descriptor = os.open(to or self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)


class Faults:
    """The spec's faults, injected into this process's cowrite functions."""

    def __init__(self, spec: dict[str, Any], events: Events) -> None:
        self.events = events
        fault = spec.get("step_fault")
        self.step_fault = (fault["round"], fault["step"], fault["kind"]) if fault else None
        self.rate = float(spec.get("fault_rate", 0.0))
        self.kinds = tuple(spec.get("fault_kinds", ()))
        self.rng = random.Random(f"{spec['seed']}:{spec['index']}:storage")
        self.instant: str | None = None  # the instant of the current round, once claimed

    def at(self, step: str, instant: str | None = None) -> None:
        instant = instant or self.instant
        if self.step_fault is None or self.step_fault[:2] != (self.events.round, step):
            return
        kind = self.step_fault[2]
        self.step_fault = None  # once
        self.events.emit("fault", kind=kind, step=step, instant=instant)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            os.kill(os.getpid(), signal.SIGSTOP)
            self.events.emit("resumed", step=step, instant=instant)

    def storage(self, operation: str, path: str) -> str | None:
        """The fault to inject into this call, if any: in the main thread, and in the threads that make
        its requests at once (:mod:`cowrite.storage.together`); the heartbeat's stay honest."""
        thread = threading.current_thread()
        if not self.rate or not (thread is threading.main_thread() or thread.name.startswith(THREADS)):
            return None
        candidates = [k for k in self.kinds if k.startswith(operation + "-")]
        if not candidates or self.rng.random() >= self.rate:
            return None
        kind = self.rng.choice(candidates)
        self.events.emit("storage-fault", kind=kind, path=path, instant=self.instant)
        return kind


def install(faults: Faults, events: Events) -> None:
    """Observe this process's protocol steps (:mod:`cowrite.steps`): record them, fault at them."""
    reported = {Step.CLAIMED, Step.PLANNED, Step.PUBLISHED, Step.ABORTING, Step.GAVE_UP}

    def observer(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.CLAIMED:
            faults.instant = instant
        if step is Step.RENEWED:  # what judges compare with is the file's modification time
            try:
                storage = details["storage"]  # as the checker reads times: the start of the storage's span
                modified = storage.stat(heartbeat_path(instant)).modified - storage.clock_resolution
            except (OSError, CowriteError):
                return
            events.emit("beat", instant=instant, modified=modified)
            return
        if step in (Step.PUBLISHED, Step.GROUPED):
            # the commit log, in commit order, is written under the lock: by the holder that published
            lock_id = getattr(details["lock"], "lock_id", None)
            fields = {"instant": instant, "completion": details["completion"], "lock_id": lock_id}
            if not details.get("grouped"):
                events.emit("published", to=events.commit_log, **fields)
            if step is Step.PUBLISHED:
                events.emit("published", **fields)
        elif step is Step.ABORTING:
            events.emit("abort", instant=instant, cause=details["cause"])
        elif step in reported:
            events.emit(step.value, instant=instant, **details)
        if step is not Step.GAVE_UP:  # from gave-up on the instant may be rolled back: no fault there
            faults.at(step.value)

    steps.observe_forever(observer)
    _wrap_storage(faults)


def _slow(rng: random.Random) -> None:
    time.sleep(rng.uniform(0.05, 0.3))


_inside = threading.local()  # a wrapped method calling another (names -> list): inject once per call


def _wrap(cls: type[Storage], name: str, operation: str, faults: Faults) -> None:
    """Wrap ``cls.name`` if ``cls`` itself defines it (backends override what they do faster)."""
    original = vars(cls).get(name)
    if original is None:
        return

    def wrapped(self: Storage, path: str = "", *args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "active", False):
            return original(self, path, *args, **kwargs)
        kind = faults.storage(operation, path)
        if kind is not None and kind.endswith("-fail"):
            raise StorageError(f"injected: {operation} {path} failed")
        if kind is not None and kind.endswith("-slow"):
            _slow(faults.rng)
        _inside.active = True
        try:
            result = original(self, path, *args, **kwargs)
        finally:
            _inside.active = False
        if kind is not None and kind.endswith("-lost-ack"):  # it happened; the caller cannot know
            raise StorageError(f"injected: {operation} {path}: connection reset after the storage acted")
        return result

    setattr(cls, name, wrapped)


def _wrap_storage(faults: Faults) -> None:
    for cls in (Storage, LocalStorage, MemoryStorage, S3Storage):
        for name, operation in (("create_if_absent", "create"), ("list", "list"), ("names", "list"),
                                ("delete", "delete")):
            _wrap(cls, name, operation, faults)


def _rows(rows: list[dict[str, Any]], column: str | None) -> pa.Table:
    columns = {
        "id": pa.array([r["id"] for r in rows], pa.string()),
        "part": pa.array([r["part"] for r in rows], pa.string()),
        "ts": pa.array([r["ts"] for r in rows], pa.int64()),
        "value": pa.array([r["value"] for r in rows], pa.string()),
    }
    if column is not None:  # the table may not have it yet: the write adds it
        columns[column] = pa.array([extra_value(column, r["value"]) for r in rows], pa.string())
    return pa.table(columns)


def run(spec: dict[str, Any]) -> int:
    events = Events(Path(spec["events"]), spec["index"], Path(spec["commit_log"]))
    faults = Faults(spec, events)
    install(faults, events)
    table = Table.load(spec["uri"], **spec.get("storage_options", {}))
    skew = float(spec.get("skew", 0.0))
    config = table.config.with_values(spec["settings"]).with_values(
        {
            keys.RETRIES_ON_CONFLICT.key: str(spec.get("retries", 0)),
            keys.EARLY_CONFLICT_DETECTION.key: str(bool(spec.get("early_conflicts"))).lower(),
            keys.EARLY_CONFLICT_PERIOD_MS.key: "50",
        }
    )
    writer = LocalWriter(table, WriteOptions(config=config, clock=lambda: time.time() + skew))
    Path(spec["loaded"]).touch()
    start = Path(spec["start"])
    deadline = time.monotonic() + 120
    while not start.exists():
        if time.monotonic() > deadline:
            return 9
        time.sleep(0.005)
    for number, round_spec in enumerate(spec["rounds"]):
        events.round = number
        faults.instant = None
        try:
            done = writer.write(_rows(round_spec["rows"], round_spec["column"]), round_spec["op"])
            events.emit("round", outcome="ok", instant=done.requested_time, completion=done.completion_time)
        except CowriteError as exc:
            events.emit("round", outcome=type(exc).__name__, instant=faults.instant, message=str(exc)[:500])
        except Exception as exc:  # a crash: the checker reports it
            events.emit(
                "round",
                outcome="crash",
                instant=faults.instant,
                message=f"{type(exc).__name__}: {exc}"[:500],
                trace=traceback.format_exc()[-3000:],
            )
        time.sleep(float(spec.get("pause_between_rounds", 0.0)))
    events.round = -1
    events.emit("exit")
    return 0


def main() -> int:
    refuse_pandas()  # as the cowrite command does: a writer without Spark starts sooner
    logging.basicConfig(level=logging.WARNING, format="%(process)d %(name)s %(levelname)s %(message)s")
    return run(json.loads(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    exit_now(main())
