"""Where a write call's time goes on an object store, from the protocol's steps (:mod:`cowrite.steps`) that
each writer process of one run saw, with the wall clock (one machine: one clock for all processes).

A call that published its commit in its own turn of the lock, part by part, one after another:

- ``begin``: from the call to its instant's claim standing (``requested``: claimed, the timeline listed);
- ``write``: to its files written (``written``: the commit begins);
- ``to the lock``: to the lock held (``locked``): one try beside the last file, or waiting for it;
- ``publish``: to its completed file (``published``): the checks and that file's create;
- ``rest``: to the call's return: the commits of waiters it published after its own (group commit).

A call whose commit another writer's turn published (:mod:`cowrite.protocol.group`) has ``begin`` and
``write`` as well, then:

- ``to be published``: from its files written to its completed file created by that holder (``grouped``,
  seen in the holder's process): asking for the lock, handing the commit over in a place of the lock's
  queue, and waiting for a holder that reads it;
- ``to learn``: to its writer learning so (``published``), from a listing of the lock's files (or from the
  timeline, once it took the lock itself);
- ``rest``: to the call's return.

Calls that failed, or whose steps are missing, are left out.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from cowrite.steps import Observer, Step

# (time.time(), step, instant, whether another writer's turn published it) of one process
Seen = tuple[float, str, str | None, bool]

OWN = ("begin", "write", "to the lock", "publish", "rest")
HANDED = ("begin", "write", "to be published", "to learn", "rest")
_WATCHED = {Step.REQUESTED, Step.WRITTEN, Step.LOCKED, Step.PUBLISHED, Step.GROUPED}


def watcher(seen: list[Seen]) -> Observer:
    """An observer for :func:`cowrite.steps.observe` that notes, in ``seen``, the steps this module uses."""

    def note(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step in _WATCHED:
            seen.append((time.time(), step.value, instant, bool(details.get("grouped"))))

    return note


@dataclass(frozen=True)
class Phases:
    """The parts of each call of one run, in milliseconds: published in its own turn, or handed over."""

    own: dict[str, list[float]]
    handed: dict[str, list[float]]

    def describe(self) -> list[str]:
        """A line for each kind of call: how many, the median of each part and of the whole call."""
        return [
            f"{len(parts[names[0]])} {label}: "
            + ", ".join(f"{name} {statistics.median(parts[name]):.0f}" for name in names)
            + f" (of {statistics.median(map(sum, zip(*parts.values(), strict=True))):.0f})"
            for label, names, parts in (
                ("published in their own turn", OWN, self.own),
                ("handed over", HANDED, self.handed),
            )
            if parts[names[0]]
        ]


def phases(writers: list[tuple[list[tuple[float, float]], list[Seen]]]) -> Phases:
    """The parts of the write calls of one run's ``writers``: each its calls (their spans) and the steps its
    process saw. A holder's ``grouped`` step, seen in its process, tells when a waiter's commit was
    created."""
    grouped = {instant: at for _, seen in writers for at, step, instant, _ in seen if step == Step.GROUPED}
    own: dict[str, list[float]] = {name: [] for name in OWN}
    handed: dict[str, list[float]] = {name: [] for name in HANDED}
    for calls, seen in writers:
        for began, ended in calls:
            inside = [s for s in seen if began <= s[0] <= ended]
            requested = [(at, instant) for at, step, instant, _ in inside if step == Step.REQUESTED]
            if not requested:
                continue
            at, instant = requested[-1]
            steps = {step: (when, by_another) for when, step, i, by_another in inside if i == instant}
            if Step.WRITTEN not in steps or Step.PUBLISHED not in steps:
                continue
            written, (published, by_another) = steps[Step.WRITTEN][0], steps[Step.PUBLISHED]
            if by_another and instant in grouped:
                parts, turn = handed, grouped[instant]
            elif not by_another and Step.LOCKED in steps:
                parts, turn = own, steps[Step.LOCKED][0]
            else:
                continue
            points = (began, at, written, turn, published, ended)
            for name, (start, end) in zip(parts, pairwise(points), strict=True):
                parts[name].append((end - start) * 1000)
    return Phases(own, handed)
