"""The protocol's steps, named once: where a write stands, for whoever must stop it there.

The commit protocol (README, "How a write commits") is a sequence of steps; its safety rests on what
holds when a writer pauses, dies or fails between any two of them. The fault-injection harness
(``bench/chaos``), the multi-process tests and the demo stop writers at these steps, so the steps are
named here, where the code that reaches them says so, rather than by wrapping private methods in each
harness: a renamed method then silently stopped injecting anything, while a step that moves keeps its
name, and a test waiting for a step nobody reaches fails.

Production code calls :func:`reached` at each step. With no observer — always, outside harnesses — that
is one global read. An observer (:func:`observe`) runs in the thread that reached the step, inside the
protocol: it may sleep (a pause), raise (a failure at that step) or kill the process. At the steps
reached under the table lock (locked, checked, published; claiming and claimed of table services) it must
not take the lock itself. Observers are per process.
"""

from __future__ import annotations

import enum
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Step(enum.StrEnum):
    """Steps in the order one write reaches them; rollbacks, cleans and clusterings claim too."""

    CLAIMING = "claiming"  # about to create ``<t>.<action>.requested`` (table services hold the lock)
    CLAIMED = "claimed"  # the ``.requested`` file exists (details: ``action``, ``seen``)
    # the claim stands and the heartbeat runs; the ``.inflight`` plan comes next (on an object store the local
    # engine wrote it already, beside the listing after its claim: Transaction.begin)
    REQUESTED = "requested"
    PLANNED = "planned"  # the ``.inflight`` plan exists
    FILE_GROUP_WRITTEN = "mid-write"  # one file group's new base file exists (local engine)
    # every file written: the commit begins and takes the lock next, unless it holds it already (on an
    # object store the local engine tries for it beside its last file, Transaction.beside_the_lock)
    WRITTEN = "written"
    LOCKED = "locked"  # the table lock is held for the commit, before the conflict checks
    CHECKED = "checked"  # every check passed; the completed file comes next (the unsafe window)
    # the completed file exists, and readers that go by instant times miss the schema change it made: an
    # empty commit records the schema next (lock held)
    RECORDING_SCHEMA = "recording-schema"
    # the completed file exists, the lock still held (``completion``, ``lock``); with ``grouped``, the
    # holder of another turn published it (group commit), and this writer holds no lock
    PUBLISHED = "published"
    # a waiter's completed file exists, published by the lock's holder after its own (group commit): reached
    # by the holder, with the waiter's instant, lock held (``completion``, ``lock``)
    GROUPED = "grouped"
    ABORTING = "aborting"  # the write gives up (details: ``cause``); its rollback may follow
    RENEWED = "renewed"  # the heartbeat file was rewritten (details: ``storage``)
    GAVE_UP = "gave-up"  # the heartbeat marks the instant aborted (details: ``reason``)


Observer = Callable[[Step, "str | None", dict[str, Any]], None]

_observer: Observer | None = None


def observed() -> bool:
    """Whether an observer watches: details that cost something to gather are gathered only then."""
    return _observer is not None


def reached(step: Step, instant: str | None = None, **details: Any) -> None:
    """Tell this process's observer, if any, that ``instant`` reached ``step``."""
    if _observer is not None:
        _observer(step, instant, details)


@contextmanager
def observe(observer: Observer) -> Iterator[None]:
    """Call ``observer`` at every step this process reaches while the block runs."""
    global _observer
    previous, _observer = _observer, observer
    try:
        yield
    finally:
        _observer = previous


def observe_forever(observer: Observer) -> None:
    """:func:`observe` for the rest of the process: a harness's writer process, which exits after."""
    global _observer
    _observer = observer


PAUSE_TIMED_OUT = 9  # the exit code of a process whose pause was never released


class Pause:
    """An observer that stops this process once, the first time a write reaches ``step`` (never: None).

    It writes ``ready`` (JSON: ``pid``, ``step``, ``instant``), if given, so whoever waits for the
    pause knows where the writer stands, then waits until the file ``release`` exists (without one, until
    the process is killed). If neither happens within ``timeout`` seconds, whoever meant to release or
    kill it is gone: the process exits with :data:`PAUSE_TIMED_OUT` rather than write on unwatched.
    """

    def __init__(
        self,
        step: Step | None,
        release: Path | None = None,
        ready: Path | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.step, self.release, self.ready, self.timeout = step, release, ready, timeout
        self.done = False

    def __call__(self, step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is not self.step or self.done:
            return
        self.done = True
        if self.ready is not None:
            temp = self.ready.with_name(f".{self.ready.name}.{os.getpid()}")
            temp.write_text(json.dumps({"pid": os.getpid(), "step": step.value, "instant": instant}))
            os.replace(temp, self.ready)  # whoever polls for it never reads half of it
        deadline = time.monotonic() + self.timeout
        while self.release is None or not self.release.exists():
            if time.monotonic() > deadline:
                print(f"paused at {step} for {self.timeout:.0f} s: never released", file=sys.stderr)
                sys.stderr.flush()
                os._exit(PAUSE_TIMED_OUT)
            time.sleep(0.005)
