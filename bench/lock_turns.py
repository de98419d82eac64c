"""Where a turn of the filesystem lock goes on an object store, from the proxy's log of one run.

A turn runs from one holder's create of ``lock<N>.acquired`` to the next holder's create of
``lock<N+1>.acquired``. Its parts, one after another:

- ``create``: the holder's create of its lock file, from its arrival at the proxy to its answer;
- ``to publish``: the holder's work between that answer and the create of its completed file;
- ``publish``: that create's round trip;
- ``to release``: from its answer to the arrival of the release (with group commit, the holder publishes the
  commits of the waiters queued behind it meanwhile, one after another);
- ``release``: the release's round trip: the note of what the turn published, or ``lock<N>.released``;
- ``handoff``: from the release's answer to the arrival of the next holder's create, the time the next
  waiter takes to learn of the release.

Each lock file is taken at its first PUT to arrive: for ``.acquired`` that is the create that took the
lock, unless a losing create arrived within the proxy's delay before it (rare with the waiters' queue).
Only turns whose holder published, released and was followed are counted: the others lack a part. While
writers queue for the lock, one turn follows another with no gap between them, so the commits a turn
publishes over its length are the table's commits per second.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from urllib.parse import unquote

from bench.proxy import Request
from cowrite.protocol.locks.lock_files import LOCK_DIR, parse_lock_file

_COMPLETED = re.compile(r"/\.hoodie/timeline/[0-9]+_[0-9]+\.[a-z]+$")  # created only under the lock
PARTS = ("create", "to publish", "publish", "to release", "release", "handoff")


@dataclass(frozen=True)
class Turns:
    """The parts of each complete turn of one run, in milliseconds, the whole turns, and the commits each
    published (its holder's and those of waiters queued behind it)."""

    parts: dict[str, list[float]]
    turns: list[float]
    commits: list[int]

    def describe(self) -> str:
        """One line: the median of each part and of the whole turn, with its quartiles, and the commits a
        turn published over its mean length."""
        if not self.turns:
            return "no complete turn"
        medians = ", ".join(f"{name} {statistics.median(ms):.0f}" for name, ms in self.parts.items())
        low, middle, high = _quartiles(self.turns)
        commits, length = statistics.mean(self.commits), statistics.mean(self.turns)
        rate = commits / length * 1000
        return (
            f"{len(self.turns)} turns, median ms: {medians}; turn {middle:.0f} ({low:.0f}-{high:.0f}); "
            f"{commits:.1f} commits a turn of {length:.0f} ms (means): {rate:.1f} commits/s"
        )


def lock_turns(requests: list[Request]) -> Turns:
    """The anatomy of the lock's turns in ``requests``, a run's whole log."""
    first: dict[tuple[int, bool], Request] = {}  # (id, whether a release) -> its first PUT
    completed = []
    for request in sorted(requests, key=lambda r: r.began):
        if request.kind != "PUT":
            continue
        folder, _, name = unquote(request.path).rpartition("/")  # (a note's "+" comes quoted)
        if folder.endswith(LOCK_DIR) and (parsed := parse_lock_file(name)) is not None:
            first.setdefault(parsed, request)
        elif _COMPLETED.search(request.path):
            completed.append(request)
    parts: dict[str, list[float]] = {name: [] for name in PARTS}
    turns, commits = [], []
    for (lock_id, is_release), create in sorted(first.items()):
        release, following = first.get((lock_id, True)), first.get((lock_id + 1, False))
        if is_release or release is None or following is None:
            continue
        published = [r for r in completed if create.ended <= r.began and r.ended <= release.began]
        if not published:
            continue
        publish = published[0]
        spans = (
            (create.began, create.ended),
            (create.ended, publish.began),
            (publish.began, publish.ended),
            (publish.ended, release.began),
            (release.began, release.ended),
            (release.ended, following.began),
        )
        for name, (start, end) in zip(PARTS, spans, strict=True):
            parts[name].append((end - start) * 1000)
        turns.append((following.began - create.began) * 1000)
        commits.append(len(published))
    return Turns(parts, turns, commits)


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, middle, high = statistics.quantiles(values, n=4)
    return low, middle, high
