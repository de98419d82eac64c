"""Fault-injection harness: random multi-writer scenarios under faults, then every invariant checked.

``python -m bench.chaos --seed N --scenarios K [--long]`` runs K scenarios drawn from seed N (see
``plan.py``), each on a fresh table: writer processes with partly overlapping plans and skewed clocks,
killed with SIGKILL or stopped with SIGSTOP at protocol steps and at random moments, with failing and
slow storage calls; a daemon (in this process, in a process of its own, killed and restarted, or none)
and a cleaner; incremental consumers pulling all along. Once everything settled, ``checker.py`` verifies
the nine invariants of DESIGN.md. :func:`run` is what ``tests/test_chaos.py`` calls in quick mode.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checker import Checker, Stats, Violation
from .plan import LONG, QUICK, Profile, Scenario, scenario
from .runner import Run


@dataclass
class ScenarioResult:
    scenario: Scenario
    violations: list[Violation]
    stats: Stats
    seconds: float
    workdir: Path
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    seed: int
    mode: str
    results: list[ScenarioResult] = field(default_factory=list)

    @property
    def stats(self) -> Stats:
        total = Stats(scenarios=0)
        for result in self.results:
            total.add(result.stats)
        return total

    @property
    def violations(self) -> list[Violation]:
        return [v for r in self.results for v in r.violations]

    def summary(self) -> str:
        s = self.stats
        return (
            f"scenarios: {s.scenarios}  kills: {s.kills} (daemon: {s.daemon_kills})  stops: {s.stops}  "
            f"storage faults: {s.storage_faults}  commits: {s.commits} "
            f"(while no daemon ran: {s.commits_without_daemon})  conflicts: {s.conflicts}  "
            f"lease losses: {s.lease_lost}  rollbacks: {s.rollbacks}  "
            f"consumer pulls: {s.consumer_pulls} "
            f"(retried: {s.consumer_retries}, resynced: {s.consumer_resyncs})  "
            f"violations: {len(self.violations)}  seed: {self.seed}"
        )


@contextmanager
def _s3_server() -> Iterator[Any]:
    import os
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from support.servers import (
        S3Server,
    )  # the tests' moto server (serialised, like real S3's conditional PUT)

    with S3Server(bucket="cowrite-chaos") as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())  # the in-process daemon opens tables by URI, like a deployed one
        try:
            yield server
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def run(
    seed: int,
    scenarios: int,
    profile: Profile = QUICK,
    only: list[int] | None = None,
    workdir: Path | None = None,
    keep: bool = False,
    backends: tuple[str, ...] = ("local", "s3"),
    progress: Callable[[str], None] = lambda _: None,
) -> Report:
    """Run ``scenarios`` scenarios of ``seed`` (or only the numbers in ``only``) and check each."""
    report = Report(seed, "long" if profile.rounds == LONG.rounds else "quick")
    root = workdir or Path(tempfile.mkdtemp(prefix=f"cowrite-chaos-{seed}-"))
    plans = [scenario(seed, i, profile, backends) for i in (only if only is not None else range(scenarios))]
    needs_s3 = any(p.backend == "s3" for p in plans)
    server_context = _s3_server() if needs_s3 else _nothing()
    with server_context as s3:
        for plan in plans:
            progress(plan.describe())
            started = time.monotonic()
            directory = root / f"scenario-{plan.index}"
            outcome = Run(plan, directory, s3).execute()
            violations, stats = Checker(outcome).check()
            result = ScenarioResult(
                plan, violations, stats, time.monotonic() - started, directory, outcome.notes
            )
            report.results.append(result)
            verdict = "ok" if not violations else f"{len(violations)} VIOLATIONS (kept in {directory})"
            progress(
                f"  -> {verdict} in {result.seconds:.1f} s: {stats.commits} commits, {stats.kills} kills, "
                f"{stats.stops} stops, {stats.storage_faults} storage faults, {stats.conflicts} conflicts, "
                f"{stats.rollbacks} rollbacks"
            )
            for violation in violations:
                progress(f"     {violation}")
            if not violations and not keep:
                shutil.rmtree(directory, ignore_errors=True)
    if not keep and not report.violations and workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return report


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


__all__ = ["LONG", "QUICK", "Report", "run"]
