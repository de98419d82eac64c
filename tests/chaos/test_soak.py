"""The soak mode of the fault-injection harness: parallel seeds, one table, and what its checker tells apart.

The soak itself (``python -m bench.chaos --soak --faults 10000``) runs on demand; here a two-seed soak
runs end to end, and the checker's new judgements are tested on planted evidence: lease losses by cause,
the liveness of calm scenarios, and a harness that fails on its own, reported instead of crashing. The
harness's own parts are tested on real processes: starvation bursts, and the retried seed write.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.tables import new_table

from cowrite.errors import LeaseLostError
from cowrite.format.instant import Action, Instant, State
from cowrite.format.service_metadata import RollbackPlan
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.storage.backend import Storage

sys.path.insert(0, str(ROOT))  # bench/ lives beside the package

from bench import chaos  # noqa: E402
from bench.chaos.checker import Checker, Evidence, TimelineFile  # noqa: E402
from bench.chaos.plan import SOAK, scenario  # noqa: E402
from bench.chaos.runner import SEED_TRIES, Outcome, Process, Run  # noqa: E402

pytestmark = pytest.mark.slow

LOCAL_SEED = 6  # the first scenario of seeds 6 and 7 of the soak profile is on local disk, not calm
INSTANTS = ("20261125000001000", "20261125000002000", "20261125000003000", "20261125000004000")


def _event(name: str, wall: float, instant: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"event": name, "worker": 0, "pid": 1, "round": 0, "wall": wall, "instant": instant, **fields}


@pytest.fixture
def uri(tmp_path: Path) -> str:
    """A table for the checker to open; these tests judge only the events."""
    return new_table(tmp_path / "t").uri


def _checker(
    uri: str, events: list[dict[str, Any]], harness: list[dict[str, Any]], latency: float
) -> Checker:
    plan = replace(scenario(LOCAL_SEED, 0, SOAK), backend="s3", latency=latency)
    outcome = Outcome(
        scenario=plan,
        uri=uri,
        storage_options={},
        hudi_options={},
        seed_instant="",
        events={0: events},
        commit_log=[],
        harness=[{"kind": "release", "wall": 0.0}, *harness],
        exits={},
        outputs={},
        consumers=[],
        policy=HeartbeatPolicy(2.0, 3),
    )
    return Checker(outcome)


@pytest.mark.parametrize("latency", [0.0, 0.02])
def test_lease_losses_are_told_apart_by_cause(latency: float, uri: str) -> None:
    """Stopped (at a step or briefly), starved, or neither: the last is a running writer's spurious abort,
    a violation where the store has real round trips and the lease the settings a user would choose."""
    stopped, starved, short, running = INSTANTS
    events = [
        _event("claimed", 10.0, stopped),
        _event("fault", 11.0, stopped, kind="stop", step="planned"),
        _event("resumed", 25.0, stopped, step="planned"),
        _event("abort", 25.5, stopped, cause="LeaseLostError"),
        _event("claimed", 30.0, starved),
        _event("abort", 38.0, starved, cause="LeaseLostError"),
        _event("claimed", 40.0, short),
        _event("abort", 41.0, short, cause="LeaseLostError"),
        _event("claimed", 50.0, running),
        _event("beat", 52.0, running, modified=52.0),
        _event("abort", 57.0, running, cause="LeaseLostError"),
        _event("round", 57.1, running, outcome="LeaseLostError", message="heartbeat was not renewed"),
    ]
    harness = [
        {"kind": "starve", "writer": 0, "wall": 31.0, "until": 37.0},
        {"kind": "short-stop", "writer": 0, "wall": 40.5, "duration": 0.03},
        {"kind": "starve", "writer": 1, "wall": 49.0, "until": 58.0},  # another writer's
    ]
    checker = _checker(uri, events, harness, latency)
    checker._collect_events()

    stats = checker.stats
    assert (
        stats.lease_lost,
        stats.lease_lost_stopped,
        stats.lease_lost_starved,
        stats.lease_lost_running,
    ) == (
        4,
        2,
        1,
        1,
    )
    assert stats.starvations == 2 and stats.stops == 2
    lease = [v for v in checker.violations if v.invariant == "lease"]
    if latency:
        [violation] = lease
        assert running in violation.message and "heartbeat was not renewed" in violation.message
    else:
        assert lease == []  # short leases of the quick profile on a loaded machine: a figure, not a fault


def test_renewal_gaps_are_taken_from_running_writers_only(uri: str) -> None:
    free, starved = INSTANTS[:2]
    events = [
        _event("claimed", 10.0, free),
        *(_event("beat", 10.0 + 2.0 * n, free, modified=0.0) for n in (1, 2)),
        _event("beat", 17.0, free, modified=0.0),  # 3 s after the last: half of the 6 s tolerance
        _event("claimed", 20.0, starved),
        _event("beat", 25.0, starved, modified=0.0),
        _event("exit", 30.0),
    ]
    harness = [{"kind": "starve", "writer": 0, "wall": 21.0, "until": 24.0}]
    checker = _checker(uri, events, harness, 0.02)
    checker._collect_events()
    checker._lease_use()
    assert checker.stats.renewal_gaps == [0.5]
    assert checker.stats.writer_seconds == 30.0


def test_a_calm_round_that_did_not_commit_is_a_liveness_violation(uri: str) -> None:
    checker = _checker(uri, [], [], 0.0)
    calm = replace(checker.scenario, calm=True, writers=checker.scenario.writers[:1])
    checker.scenario = calm
    rounds = len(calm.writers[0].rounds)
    checker.o.events = {
        0: [_event("round", 1.0 + n, outcome="ok", round=n) for n in range(rounds - 1)]
        + [_event("round", 9.0, outcome="WriteConflictError", round=rounds - 1, message="lost to w1")]
    }
    checker._collect_events()
    checker.check_liveness()
    [violation] = checker.violations
    assert violation.invariant == "liveness" and f"round {rounds - 1}" in violation.message
    assert "WriteConflictError lost to w1" in violation.message


def test_calm_scenarios_judge_liveness_with_a_lease_a_user_would_choose() -> None:
    """Fault scenarios on local disk use a 0.4 s lease so that recovery happens within them; a calm one,
    where a lost lease is a liveness violation, gets what a user would run on a loaded machine."""
    calm = [s for s in (scenario(seed, i, SOAK) for seed in range(20) for i in range(10)) if s.calm]
    assert {s.backend for s in calm} == {"local", "s3"}
    assert all(s.tolerance >= 3.0 for s in calm)


@pytest.mark.parametrize("gave_up", [100.3, 101.3])
def test_a_rollback_of_a_writer_that_gave_up_is_judged_with_whole_second_times_on_s3(
    uri: str, gave_up: float
) -> None:
    """S3 keeps whole seconds: a rollback plan recorded at 100.4 s shows 100 s. A writer that gave up at
    100.3 s was failed when judged (soak seed 464748 called it a violation); one at 101.3 s was not yet."""
    target, rollback = INSTANTS[:2]
    events = [
        _event("claimed", 99.9, target, action="commit"),
        _event("beat", 100.0, target, modified=100.0),
        _event("gave-up", gave_up, target, reason="conflict"),
    ]
    checker = _checker(uri, events, [], 0.0)
    checker._collect_events()
    plan = RollbackPlan(target, "commit", ()).to_bytes()
    evidence = Evidence(
        files=[],
        completed={
            rollback: TimelineFile(Instant(rollback, Action.ROLLBACK, State.COMPLETED, rollback), b"", 101)
        },
        requested_files={
            (rollback, Action.ROLLBACK): TimelineFile(
                Instant(rollback, Action.ROLLBACK, State.REQUESTED), plan, 100.0
            )
        },
    )
    checker.check_rollbacks(evidence)
    judged = [v.message for v in checker.violations if v.invariant == "6" and "judged" in v.message]
    assert len(judged) == (gave_up > 101.0), judged


def test_a_harness_failure_is_reported_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Run) -> Outcome:
        raise KeyError("the harness's own bug")

    monkeypatch.setattr(Run, "execute", broken)
    report = chaos.run(LOCAL_SEED, 2, SOAK, workdir=tmp_path, backends=("local",))
    assert [v.invariant for v in report.violations] == ["harness", "harness"]
    assert "KeyError" in report.violations[0].message and "Traceback" in report.violations[0].message


def test_a_soak_runs_seeds_in_parallel_and_prints_one_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.chaos",
            "--soak",
            "--faults",
            "1",
            "--parallel",
            "2",
            "--scenarios",
            "1",
            "--seed",
            str(LOCAL_SEED),
            "--workdir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith(("seed 6:", "seed 7:")) for line in lines) == 2, done.stdout
    header = next(line for line in lines if line.split() == ["local", "total"])
    assert header
    for label in ("faults", "starvations", "commits / writer-second", "writer running", "violations"):
        assert any(line.strip().startswith(label) for line in lines), (label, done.stdout)
    violations = next(line for line in lines if line.startswith("violations"))
    assert violations.split()[1:] == ["0", "0"]
    assert f"seeds {LOCAL_SEED}..{LOCAL_SEED + 1}" in done.stdout
    assert (tmp_path / f"seed-{LOCAL_SEED}" / "report.json").exists()
    first = (tmp_path / f"seed-{LOCAL_SEED}" / "output.log").read_text().splitlines()[0]
    assert first.startswith(f"cowrite chaos: seed {LOCAL_SEED}, 1 scenarios (soak)"), first


def test_a_soak_runs_the_seeds_of_the_profile_it_is_given(tmp_path: Path) -> None:
    """``--profile`` picks the profile of the seeds (``crowd`` soaks group commit), as without ``--soak``."""
    command = ["--soak", "--profile", "quick", "--faults", "1", "--parallel", "1", "--scenarios", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.chaos", *command, "--seed", "1", "--workdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("cowrite chaos soak of the quick profile: 1 faults,"), done.stdout
    first = (tmp_path / "seed-1" / "output.log").read_text().splitlines()[0]
    assert first.startswith("cowrite chaos: seed 1, 1 scenarios (quick)"), first


# A process that notes the time every 5 ms: a gap in its notes is a time it did not run.
TICKER = "import sys, time\nwhile True:\n    print(time.time(), flush=True)\n    time.sleep(0.005)\n"


def _ticking(run: Run, tmp_path: Path) -> tuple[Process, Path]:
    ticks = tmp_path / "ticks"
    with open(ticks, "w") as out:
        popen = subprocess.Popen([sys.executable, "-c", TICKER], stdout=out)
    run.writers[0] = Process("w0", popen, tmp_path / "w0.stderr")
    return run.writers[0], ticks


def _state(process: Process) -> str:
    return Path(f"/proc/{process.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _until_starved(run: Run) -> None:
    """Wait for the bursts to end (their thread empties ``run.starving`` when it returns)."""
    _eventually(lambda: not run.starving, "the starvation bursts did not end")


def _gaps(ticks: Path) -> list[float]:
    times = [float(line) for line in ticks.read_text().split()]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """A local scenario's run with a 400 ms heartbeat interval: bursts of 100 ms stopped, 25 ms running."""
    return Run(replace(scenario(LOCAL_SEED, 0, SOAK), interval_ms=400), tmp_path / "scenario")


def test_starvation_stops_a_process_in_bursts_and_leaves_it_running(run: Run, tmp_path: Path) -> None:
    process, ticks = _ticking(run, tmp_path)
    try:
        time.sleep(0.2)
        run._starve(0, 1.0)
        assert run.starving == {0}
        _until_starved(run)
        ended = time.time()
        assert _state(process) != "T"
        _eventually(lambda: float(ticks.read_text().split()[-1]) > ended, "it did not run on")
        # Each burst stops the process for a quarter of the interval (100 ms): nothing near that otherwise.
        gaps = _gaps(ticks)
        assert sum(gap >= 0.09 for gap in gaps) >= 4, sorted(gaps)[-10:]
        [record] = [h for h in run.harness if h["kind"] == "starve"]
        assert record["writer"] == 0 and record["until"] - record["wall"] == pytest.approx(1.0)
    finally:
        process.popen.kill()
        process.popen.wait()


def _announce_step_stop(run: Run) -> None:
    """What a writer's event log says as it stops itself at a protocol step."""
    with open(run.workdir / "w0.events", "a") as log:
        event = {"event": "fault", "kind": "stop", "step": "before_publish"}
        log.write(json.dumps(event, sort_keys=True) + "\n")


def test_starvation_never_continues_a_writer_stopped_at_a_protocol_step(run: Run, tmp_path: Path) -> None:
    process, _ = _ticking(run, tmp_path)
    try:
        # Stopped before the bursts would begin: it is not starved at all.
        _announce_step_stop(run)
        process.popen.send_signal(signal.SIGSTOP)  # as the writer sends itself
        _eventually(lambda: _state(process) == "T", "SIGSTOP was not delivered")
        run._starve(0, 1.0)
        assert run.starving == set() and _state(process) == "T"
        assert not [h for h in run.harness if h["kind"] == "starve"]

        # Stopped while the bursts run: they end and leave it stopped for the run loop to continue.
        (run.workdir / "w0.events").write_text("")
        process.popen.send_signal(signal.SIGCONT)
        run._starve(0, 30.0)
        time.sleep(0.3)
        _announce_step_stop(run)
        _until_starved(run)
        assert _state(process) == "T"
    finally:
        process.popen.kill()
        process.popen.wait()


def test_the_harness_retries_its_seed_write_and_gives_up_after_its_tries(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    insert = LocalWriter.insert
    failures = iter([True, False])

    def lose_the_first_lease(self: LocalWriter, *args: Any, **kwargs: Any) -> Any:
        if next(failures, False):
            raise LeaseLostError("heartbeat was not renewed for 4.0 s")
        return insert(self, *args, **kwargs)

    monkeypatch.setattr(LocalWriter, "insert", lose_the_first_lease)
    seeded = run._create()
    assert [i.requested_time for i in Table.open(Storage.for_uri(run.uri)).timeline().completed()] == [seeded]
    assert run.notes == ["the seed write failed (try 1): LeaseLostError: heartbeat was not renewed for 4.0 s"]

    again = Run(run.scenario, run.workdir.parent / "again")
    failures = iter([True] * SEED_TRIES)
    with pytest.raises(LeaseLostError):
        again._create()
    assert len(again.notes) == SEED_TRIES


def test_a_soak_ended_by_sigterm_finishes_its_running_seed_and_prints_the_table(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench.chaos", "--soak", "--faults", "1000000", "--parallel", "1"]
    command += ["--scenarios", "1", "--seed", str(LOCAL_SEED), "--workdir", str(tmp_path)]
    soak = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _eventually(lambda: (tmp_path / f"seed-{LOCAL_SEED}" / "output.log").exists(), "no seed started")
        soak.send_signal(signal.SIGTERM)
        output, _ = soak.communicate(timeout=600)
    finally:
        soak.kill()
    assert soak.returncode == 0, output
    assert "SIGTERM: no new seeds; waiting for" in output
    assert [line.split(":")[0] for line in output.splitlines() if line.startswith("seed ")] == [
        f"seed {LOCAL_SEED}"
    ]
    assert f"seeds {LOCAL_SEED}..{LOCAL_SEED}" in output
    violations = next(line for line in output.splitlines() if line.startswith("violations"))
    assert violations.split()[1:] == ["0", "0"]
