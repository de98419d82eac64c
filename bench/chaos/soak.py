"""The soak: seeds of one profile (``soak`` unless ``--profile`` names another) run in parallel processes
until enough faults were injected.

``python -m bench.chaos --soak --faults 10000 [--minutes M] [--parallel N] [--profile P]``. Each seed is a
child process ``python -m bench.chaos --profile P --seed S --scenarios K --json F --workdir D``;
``--parallel`` of them run at once (default: the number of cores), so that writers, daemons and harnesses
contend for the CPU as on a shared machine. A progress line is printed as each seed ends; no new seed starts
once ``--faults`` faults were injected or ``--minutes`` have passed. Then one table, by store (local disk, S3,
S3 behind 20 and 50 ms round trips), and every failing scenario: its violations, its kept directory and the
command that replays it. A child that crashes or prints no report is itself a failure, shown with its last
output.

SIGINT (Ctrl-C) or SIGTERM ends a soak early: no new seed starts, the running ones finish, and the table
covers every finished seed. A second signal kills the running seeds (their scenarios count for nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .checker import Stats
from .runner import ROOT


@dataclass
class Child:
    seed: int
    popen: subprocess.Popen[bytes]
    report: Path
    log: Path
    started: float


def _quantiles(values: list[float], *qs: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return ", ".join(f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}" for q in qs)


def table(by_store: dict[str, Stats], violations: dict[str, int], seconds: float) -> str:
    """The soak's figures: one column per store, and the total."""
    total = Stats(scenarios=0)
    for stats in by_store.values():
        total.add(stats)
    columns = {**dict(sorted(by_store.items())), "total": total}
    counts = {**violations, "total": sum(violations.values())}
    rows: list[tuple[str, Callable[[Stats, str], object]]] = [
        ("scenarios", lambda s, _: s.scenarios),
        ("faults", lambda s, _: s.faults),
        ("  kills (daemon)", lambda s, _: f"{s.kills} ({s.daemon_kills})"),
        ("  stops", lambda s, _: s.stops),
        ("  starvations", lambda s, _: s.starvations),
        ("  storage faults", lambda s, _: s.storage_faults),
        ("commits", lambda s, _: s.commits),
        ("schema commits", lambda s, _: s.schema_commits),
        ("  grouped", lambda s, _: s.grouped),
        ("conflicts", lambda s, _: s.conflicts),
        ("rollbacks", lambda s, _: s.rollbacks),
        ("lease losses", lambda s, _: s.lease_lost),
        ("  writer stopped", lambda s, _: s.lease_lost_stopped),
        ("  writer starved", lambda s, _: s.lease_lost_starved),
        ("  writer running", lambda s, _: s.lease_lost_running),
        ("consumer pulls", lambda s, _: s.consumer_pulls),
        (
            "commits / writer-second",
            lambda s, _: f"{s.commits / s.writer_seconds:.2f}" if s.writer_seconds else "-",
        ),
        ("commit s p50, p99", lambda s, _: _quantiles(s.commit_seconds, 0.5, 0.99)),
        ("renewal gap / lease p50, p99, max", lambda s, _: _quantiles(s.renewal_gaps, 0.5, 0.99, 1.0)),
        ("violations", lambda _, name: counts.get(name, 0)),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [" " * width + "".join(f"{name:>18}" for name in columns)]
    for label, cell in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{cell(s, n)!s:>18}" for n, s in columns.items()))
    lines.append(f"took {seconds / 60:.1f} min")
    return "\n".join(lines)


def soak(
    faults: int,
    minutes: float | None,
    parallel: int,
    first_seed: int,
    scenarios: int,
    workdir: Path,
    profile: str,
) -> int:
    """Run seeds ``first_seed``, ``first_seed + 1``, ... until ``faults`` were injected or time is up;
    print the table; return 1 if anything was violated (or a child failed), 0 otherwise."""
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"cowrite chaos soak of the {profile} profile: {faults} faults"
        f"{f' or {minutes:g} min' if minutes else ''}, "
        f"{parallel} seeds at a time, {scenarios} scenarios each, {os.cpu_count()} cpus; kept in {workdir}",
        flush=True,
    )
    started = time.monotonic()
    deadline = started + minutes * 60 if minutes else float("inf")
    by_store: dict[str, Stats] = {}
    violations: dict[str, int] = {}
    failures: list[str] = []
    injected, next_seed = 0, first_seed
    running: list[Child] = []
    signals = 0

    def stop(signum: int, _: object) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            name = signal.Signals(signum).name
            print(f"{name}: no new seeds; waiting for {len(running)} (again: kill them)", flush=True)
        for child in running if signals > 1 else []:
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.killpg(child.popen.pid, signal.SIGKILL)  # the seed's harness, writers, daemon

    def more() -> bool:
        return not signals and injected < faults and time.monotonic() < deadline

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    while running or more():
        while len(running) < parallel and more():
            running.append(_start(next_seed, scenarios, workdir, profile))
            next_seed += 1
        time.sleep(0.5)
        for child in [c for c in running if c.popen.poll() is not None]:
            running.remove(child)
            if child.popen.returncode == -signal.SIGKILL and signals > 1:
                print(f"seed {child.seed}: killed", flush=True)
                continue
            seed_faults = _collect(child, scenarios, profile, by_store, violations, failures)
            injected += seed_faults
            print(
                f"seed {child.seed}: {seed_faults} faults, exit {child.popen.returncode}, "
                f"{time.monotonic() - child.started:.0f} s; {injected} faults so far, "
                f"{sum(violations.values())} violations, {len(failures)} failing scenarios",
                flush=True,
            )
    print(table(by_store, violations, time.monotonic() - started))
    print(f"seeds {first_seed}..{next_seed - 1}")
    for failure in failures:
        print(failure)
    return 1 if failures else 0


def _start(seed: int, scenarios: int, workdir: Path, profile: str) -> Child:
    directory = workdir / f"seed-{seed}"
    directory.mkdir(parents=True, exist_ok=True)
    report, log = directory / "report.json", directory / "output.log"
    command = [
        sys.executable,
        "-m",
        "bench.chaos",
        "--profile",
        profile,
        "--seed",
        str(seed),
        "--scenarios",
        str(scenarios),
        "--workdir",
        str(directory),
        "--json",
        str(report),
    ]
    with open(log, "wb") as output:
        # A session of its own: Ctrl-C reaches the soak alone, which lets the seed finish (or kills it all).
        popen = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
        )
    return Child(seed, popen, report, log, time.monotonic())


def _collect(
    child: Child,
    scenarios: int,
    profile: str,
    by_store: dict[str, Stats],
    violations: dict[str, int],
    failures: list[str],
) -> int:
    """Add a finished seed's figures; note its failing scenarios. Returns its number of faults."""
    replay = f"python -m bench.chaos --profile {profile} --seed {child.seed} --scenarios {scenarios}"
    try:
        report = json.loads(child.report.read_text())
    except (OSError, ValueError):
        tail = child.log.read_text(errors="replace")[-3000:] if child.log.exists() else ""
        failures.append(
            f"seed {child.seed}: the harness exited {child.popen.returncode} without a report "
            f"({replay}):\n{tail}"
        )
        return 0
    injected = 0
    for result in report["results"]:
        stats = Stats(**result["stats"])
        by_store.setdefault(result["store"], Stats(scenarios=0)).add(stats)
        injected += stats.faults
        if result["violations"]:
            violations[result["store"]] = violations.get(result["store"], 0) + len(result["violations"])
            failures.append(
                f"seed {child.seed} scenario {result['index']} ({result['describe']}), kept in "
                f"{result['workdir']}; replay: {replay} --only {result['index']} --keep\n"
                + "\n".join(f"  {v}" for v in result["violations"])
            )
    return injected


__all__ = ["soak", "table"]
