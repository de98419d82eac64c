"""Fault-injection harness: random multi-writer scenarios under faults, then every invariant checked.

``python -m bench.chaos --seed N --scenarios K [--long]`` runs K scenarios drawn from seed N (see
``plan.py``), each on a fresh table: writer processes with partly overlapping plans and skewed clocks,
killed with SIGKILL or stopped with SIGSTOP at protocol steps and at random moments, with failing and
slow storage calls; a daemon (in this process, in a process of its own, killed and restarted, or none)
and a cleaner; incremental consumers pulling all along. Once everything settled, ``checker.py`` verifies
the nine invariants of DESIGN.md. :func:`run` is what ``tests/test_chaos.py`` calls in quick mode.

``python -m bench.chaos --soak --faults 10000`` runs many seeds of the soak profile in parallel processes,
loading the machine on purpose, and prints one table of what was injected and what held (``soak.py``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cowrite.format.timeline import TIMELINE_DIR
from cowrite.protocol.heartbeat import HEARTBEAT_DIR
from cowrite.protocol.locks.lock_files import LOCK_DIR
from cowrite.storage.backend import Storage

from .checker import Checker, Stats, Violation
from .plan import LONG, PROFILES, QUICK, SOAK, Profile, Scenario, scenario
from .runner import ROOT, Outcome, Run, environment


@dataclass
class ScenarioResult:
    scenario: Scenario
    violations: list[Violation]
    stats: Stats
    seconds: float
    workdir: Path
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.scenario.index,
            "store": self.scenario.store,
            "describe": self.scenario.describe(),
            "violations": [str(v) for v in self.violations],
            "stats": asdict(self.stats),
            "seconds": round(self.seconds, 1),
            "workdir": str(self.workdir),
        }


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
            f"starvations: {s.starvations}  storage faults: {s.storage_faults}  commits: {s.commits} "
            f"(while no daemon ran: {s.commits_without_daemon}; of the schema alone: {s.schema_commits}; "
            f"published by another writer's turn: {s.grouped})  "
            f"conflicts: {s.conflicts}  "
            f"lease losses: {s.lease_lost} (stopped {s.lease_lost_stopped}, starved {s.lease_lost_starved}, "
            f"running {s.lease_lost_running})  rollbacks: {s.rollbacks}  "
            f"consumer pulls: {s.consumer_pulls} "
            f"(retried: {s.consumer_retries}, resynced: {s.consumer_resyncs})  "
            f"violations: {len(self.violations)}  seed: {self.seed}"
        )

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "mode": self.mode, "results": [r.to_json() for r in self.results]}


@dataclass(frozen=True)
class S3Endpoint:
    """The tests' S3 server as the scenario's processes reach it: directly, or through a delaying proxy."""

    bucket: str
    endpoint_url: str
    _options: dict[str, Any]
    _env: dict[str, str]

    def storage_options(self) -> dict[str, Any]:
        client = {**self._options["client_kwargs"], "endpoint_url": self.endpoint_url}
        return {**self._options, "client_kwargs": client}

    def env(self) -> dict[str, str]:
        return {**self._env, "AWS_ENDPOINT_URL": self.endpoint_url}


@contextmanager
def _s3_endpoints(latencies: set[float]) -> Iterator[tuple[Any, dict[float, S3Endpoint], list[Any]]]:
    """The tests' moto server (serialised, like real S3's conditional PUT), the endpoints by latency, and
    for each non-zero latency the object-store benchmark's delaying proxy in front of the server, in a process
    of its own."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.servers import S3Server

    from bench.proxy import ProxyProcess

    with ExitStack() as stack:
        server = stack.enter_context(S3Server(bucket="cowrite-chaos"))
        endpoints, proxies = {}, []
        for latency in latencies:
            url = server.endpoint_url
            if latency:
                proxies.append(stack.enter_context(ProxyProcess(server.endpoint_url, latency)))
                url = proxies[-1].endpoint_url
            endpoints[latency] = S3Endpoint(server.bucket, url, server.storage_options(), server.env())
        yield server, endpoints, proxies


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
    """Run ``scenarios`` scenarios of ``seed`` (or only the numbers in ``only``) and check each.

    A scenario the harness itself fails to run or check (an exception of its own) is reported as a
    ``harness`` violation with its traceback, and its directory is kept: the run goes on.
    """
    report = Report(seed, next((name for name, p in PROFILES.items() if p == profile), "custom"))
    root = workdir or Path(tempfile.mkdtemp(prefix=f"cowrite-chaos-{seed}-"))
    plans = [scenario(seed, i, profile, backends) for i in (only if only is not None else range(scenarios))]
    latencies = {p.latency for p in plans if p.backend == "s3"}
    latencies |= {0.0} if latencies else set()  # the checker reads without delay
    with _s3_endpoints(latencies) if latencies else _nothing() as (server, endpoints, proxies):
        for plan in plans:
            progress(plan.describe())
            started = time.monotonic()
            directory = root / f"scenario-{plan.index}"
            endpoint = None
            if plan.backend == "s3":
                # A bucket of its own: moto lists a prefix by walking the whole bucket, one request at a
                # time, so the tables of earlier scenarios would slow every listing of this one (S3 does not).
                bucket = f"chaos-{seed}-{plan.index}-{time.time_ns()}"
                server.create_bucket(bucket)
                endpoint = replace(endpoints[plan.latency], bucket=bucket)
            try:
                with environment(endpoint.env() if endpoint else {}):
                    direct = replace(endpoints[0.0], bucket=endpoint.bucket) if endpoint else None
                    outcome = Run(plan, directory, endpoint, direct).execute()
                    violations, stats = Checker(outcome).check()
                notes = outcome.notes
                if violations and endpoint is not None:
                    _keep_timeline(outcome, directory / "timeline")
            except Exception as exc:
                violations = [Violation("harness", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")]
                stats, notes = Stats(scenarios=1), []
            notes += _slow_requests(proxies)
            result = ScenarioResult(plan, violations, stats, time.monotonic() - started, directory, notes)
            report.results.append(result)
            verdict = "ok" if not violations else f"{len(violations)} VIOLATIONS (kept in {directory})"
            progress(
                f"  -> {verdict} in {result.seconds:.1f} s: {stats.commits} commits, {stats.kills} kills, "
                f"{stats.stops} stops, {stats.starvations} starvations, {stats.storage_faults} storage "
                f"faults, {stats.conflicts} conflicts, {stats.rollbacks} rollbacks"
            )
            for violation in violations:
                progress(f"     {violation}")
            for note in notes if violations else ():
                if note.startswith("slow request"):
                    progress(f"     {note}")
            if not violations and not keep:
                shutil.rmtree(directory, ignore_errors=True)
    if not keep and not report.violations and workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return report


def _keep_timeline(outcome: Outcome, target: Path) -> None:
    """Copy an S3 table's ``.hoodie`` (the server's tables die with it) to ``target``, with ``listing.txt``
    giving each file's modification time: the evidence a failing S3 scenario is judged on."""
    storage = Storage.for_uri(outcome.uri, **outcome.storage_options)
    lines = []
    for directory in (TIMELINE_DIR, HEARTBEAT_DIR, LOCK_DIR):
        for info in storage.list(directory):
            lines.append(f"{info.modified:.3f} {info.size:6d} {info.path}")
            try:
                data = storage.read(info.path)
            except FileNotFoundError:
                continue
            (target / info.path).parent.mkdir(parents=True, exist_ok=True)
            (target / info.path).write_bytes(data)
    target.mkdir(parents=True, exist_ok=True)
    (target / "listing.txt").write_text("\n".join(sorted(lines)) + "\n")


def _slow_requests(proxies: list[Any]) -> list[str]:
    """Requests the proxies held a second longer than their delay since the last call (then forgotten)."""
    slow = []
    for proxy in proxies:
        for request in proxy.reset():
            if request.ended - request.began > proxy.delay + 1.0:
                slow.append(
                    f"slow request: {request.kind} {request.path} took {request.ended - request.began:.1f} s "
                    f"at {request.began:.2f}"
                )
    return slow


@contextmanager
def _nothing() -> Iterator[tuple[Any, dict[float, S3Endpoint], list[Any]]]:
    yield None, {}, []


__all__ = ["LONG", "QUICK", "SOAK", "Report", "run"]
