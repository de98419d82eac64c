"""Scenarios drawn from a seed: writers and their rounds, faults, clocks, daemon, cleaner, consumers.

Everything a scenario does on purpose is decided here, from ``random.Random(f"{seed}:{index}")``, so a
seed and a scenario number replay the same plan (the timing of processes still varies from run to run).

Keys are chosen so that the expected snapshot is exact whatever the interleaving (see ``model.py``):

- ``u<p>-<j>``: seeded keys that upserts update (their file group is found by the index, so two writers
  updating one are serialised by the conflict check);
- ``d<p>-<j>``: seeded keys that only deletes touch (never re-inserted);
- ``n<w>-<r>-<j>``: fresh keys, unique to one writer round (inserts and upserts of new records);
- partition ``ow``: only ``insert_overwrite`` writes there (seeded, so two overwrites always conflict).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

# Protocol points at which a writer can be killed or stopped, in protocol order (see worker.py).
STEPS = (
    "claiming",  # begin: holding the table lock, no instant yet
    "claimed",  # begin: .requested created, heartbeat not started, lock held
    "requested",  # heartbeat running, nothing planned
    "planned",  # .inflight written, no base file yet
    "mid-write",  # one base file written
    "written",  # every base file written, commit not started
    "locked",  # holding the lock for the commit, timeline not reloaded yet
    "published",  # the completed instant exists, lock still held
    "aborting",  # giving up (conflict, lease lost, error): before deleting its files
)
# After the writer's last lease and lock check, before it creates the completed instant: a process paused
# here past its lease publishes anyway. No lease closes this window (only fencing by the storage could);
# ``--unsafe-window`` stops writers here to show what the checker then reports.
UNSAFE_STEP = "checked"
STORAGE_FAULTS = (
    "create-fail",  # create_if_absent raises, nothing created
    "create-lost-ack",  # create_if_absent creates, then raises (the outcome is unknown to the caller)
    "create-slow",
    "list-fail",
    "list-slow",
    "delete-fail",
    "delete-lost-ack",
    "delete-slow",
)
CONSUMER_MODES = ("completion-time", "overlay", "fence")
DAEMON_MODES = ("none", "thread", "process", "process-killed")

OVERWRITE_PARTITION = "ow"
SEED_TS = 1


@dataclass(frozen=True)
class Row:
    id: str
    part: str
    ts: int
    value: str


@dataclass(frozen=True)
class Round:
    op: str  # insert, upsert, delete, insert_overwrite
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class StepFault:
    round: int
    step: str
    kind: str  # kill | stop


@dataclass(frozen=True)
class WriterPlan:
    index: int
    rounds: tuple[Round, ...]
    skew: float  # seconds added to the writer's clock for instant times
    step_fault: StepFault | None
    fault_rate: float  # probability that one storage call of the writer's main thread misbehaves
    fault_kinds: tuple[str, ...]
    retries: int  # hoodie.write.num.retries.on.conflict.failures
    early_conflicts: bool
    pause_between_rounds: float


@dataclass(frozen=True)
class TimedFault:
    at: float  # seconds after the writers were released
    writer: int
    kind: str  # kill | stop (a SIGSTOP shorter than the lease margin: must change nothing)
    duration: float = 0.0


@dataclass(frozen=True)
class Scenario:
    seed: int
    index: int
    backend: str  # local | s3
    partitions: tuple[str, ...]
    seed_rows: tuple[Row, ...]
    writers: tuple[WriterPlan, ...]
    timed: tuple[TimedFault, ...]
    daemon: str
    daemon_kills: tuple[float, ...]  # seconds after release; the daemon is restarted after each but the last
    cleaner_thread: bool
    consumers: tuple[str, ...]
    commits_retained: int
    archive: tuple[int, int] | None  # (keep min, keep max) commits, or None to keep archival out of reach
    interval_ms: int
    misses: int
    stop_for: float  # how long a writer stopped at a protocol point stays stopped (past its lease)
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def tolerance(self) -> float:
        return self.interval_ms / 1000 * self.misses

    def describe(self) -> str:
        faults = [
            f"w{w.index}:{w.step_fault.kind}@{w.step_fault.step}/r{w.step_fault.round}"
            for w in self.writers
            if w.step_fault
        ]
        faults += [f"w{t.writer}:{t.kind}@{t.at:.1f}s" for t in self.timed]
        storage = [f"w{w.index}:{w.fault_rate:.2f}" for w in self.writers if w.fault_rate]
        return (
            f"scenario {self.index} ({self.backend}): {len(self.writers)} writers x "
            f"{'/'.join(str(len(w.rounds)) for w in self.writers)} rounds, daemon={self.daemon}"
            f"{'+kills' if self.daemon_kills else ''}, cleaner={'yes' if self.cleaner_thread else 'no'}, "
            f"consumers={','.join(self.consumers) or '-'}, retained={self.commits_retained}, "
            f"archive={self.archive}, faults=[{' '.join(faults)}], storage-faults=[{' '.join(storage)}], "
            f"skews=[{' '.join(f'{w.skew:+.1f}' for w in self.writers)}]"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Profile:
    """Sizes of scenarios: the quick mode runs inside the test suite, the long mode on demand."""

    writers: tuple[int, int]
    rounds: tuple[int, int]
    partitions: tuple[int, int]
    max_skew: float
    s3_share: float  # fraction of scenarios on S3 (moto)
    timed_faults: tuple[int, int]
    cycle: bool = False  # daemon modes in turn and every consumer mode in every scenario (few scenarios)
    unsafe: bool = False  # stop writers at UNSAFE_STEP, where leases cannot protect (expect violations)


QUICK = Profile(
    writers=(3, 3),
    rounds=(2, 3),
    partitions=(2, 3),
    max_skew=3.0,
    s3_share=0.0,
    timed_faults=(0, 1),
    cycle=True,
)
LONG = Profile(
    writers=(3, 5), rounds=(3, 6), partitions=(2, 4), max_skew=10.0, s3_share=0.2, timed_faults=(0, 3)
)


def scenario(
    seed: int, index: int, profile: Profile, backends: tuple[str, ...] = ("local", "s3")
) -> Scenario:
    """The scenario ``index`` of run ``seed``: the same plan every time."""
    rng = random.Random(f"cowrite-chaos:{seed}:{index}")
    backend = "s3" if "s3" in backends and rng.random() < profile.s3_share else "local"
    if "local" not in backends:
        backend = "s3"
    partitions = tuple(f"p{i}" for i in range(rng.randint(*profile.partitions)))
    overwrite = rng.random() < 0.5
    seed_rows = [Row(f"u{p[1:]}-{j}", p, SEED_TS, "seed") for p in partitions for j in range(6)]
    seed_rows += [Row(f"d{p[1:]}-{j}", p, SEED_TS, "seed") for p in partitions for j in range(4)]
    if overwrite:
        seed_rows += [Row(f"ow-s{j}", OVERWRITE_PARTITION, SEED_TS, "seed") for j in range(3)]

    count = rng.randint(*profile.writers)
    writers = tuple(_writer(rng, w, partitions, overwrite, profile) for w in range(count))
    timed = tuple(
        TimedFault(
            at=round(rng.uniform(0.3, 3.0), 2),
            writer=rng.randrange(count),
            kind=(kind := rng.choice(("kill", "stop"))),
            duration=round(rng.uniform(0.01, 0.04), 3) if kind == "stop" else 0.0,
        )
        for _ in range(rng.randint(*profile.timed_faults))
    )
    daemon = rng.choice(DAEMON_MODES)
    if profile.cycle:
        daemon = DAEMON_MODES[index % len(DAEMON_MODES)]
    daemon_kills: tuple[float, ...] = ()
    if daemon == "process-killed":
        daemon_kills = tuple(sorted(round(rng.uniform(0.5, 4.0), 2) for _ in range(rng.randint(1, 2))))
    s3 = backend == "s3"
    interval_ms, misses = (1000, 3) if s3 else (200, 2)  # S3 keeps modification times in whole seconds
    tolerance = interval_ms / 1000 * misses
    consumers = tuple(rng.choice(CONSUMER_MODES) for _ in range(rng.randint(1, 3)))
    if profile.cycle:
        consumers = CONSUMER_MODES
    return Scenario(
        seed=seed,
        index=index,
        backend=backend,
        partitions=partitions,
        seed_rows=tuple(seed_rows),
        writers=writers,
        timed=timed,
        daemon=daemon,
        daemon_kills=daemon_kills,
        cleaner_thread=rng.random() < 0.5,
        consumers=consumers,
        commits_retained=rng.randint(2, 4),
        archive=((2, 3) if index % 2 else None)
        if profile.cycle
        else ((3, 5) if rng.random() < 0.35 else None),
        interval_ms=interval_ms,
        misses=misses,
        stop_for=round(2 * tolerance + rng.uniform(0.2, 0.6), 2),
    )


def _writer(
    rng: random.Random, index: int, partitions: tuple[str, ...], overwrite: bool, profile: Profile
) -> WriterPlan:
    rounds = tuple(_round(rng, index, r, partitions, overwrite) for r in range(rng.randint(*profile.rounds)))
    fault = None
    if rng.random() < 0.6:
        fault = StepFault(rng.randrange(len(rounds)), rng.choice(STEPS), rng.choice(("kill", "kill", "stop")))
    if profile.unsafe and rng.random() < 0.5:
        fault = StepFault(rng.randrange(len(rounds)), UNSAFE_STEP, "stop")
    faulty = rng.random() < 0.5
    return WriterPlan(
        index=index,
        rounds=rounds,
        skew=round(rng.uniform(-profile.max_skew, profile.max_skew), 3),
        step_fault=fault,
        fault_rate=round(rng.uniform(0.02, 0.08), 3) if faulty else 0.0,
        fault_kinds=tuple(sorted(rng.sample(STORAGE_FAULTS, rng.randint(2, len(STORAGE_FAULTS))))),
        retries=rng.choice((0, 0, 1)),
        early_conflicts=rng.random() < 0.25,
        pause_between_rounds=round(rng.uniform(0.0, 0.2), 3),
    )


def _round(rng: random.Random, w: int, r: int, partitions: tuple[str, ...], overwrite: bool) -> Round:
    ops = ["upsert"] * 5 + ["insert"] * 2 + ["delete"] * 2 + (["insert_overwrite"] * 2 if overwrite else [])
    op = rng.choice(ops)
    value = f"w{w}.r{r}"
    fresh = (f"n{w}-{r}-{j}" for j in range(100))
    rows: list[Row] = []
    if op == "insert_overwrite":
        rows = [
            Row(next(fresh), OVERWRITE_PARTITION, rng.randint(0, 3), value) for _ in range(rng.randint(1, 3))
        ]
    elif op == "delete":
        p = rng.choice(partitions)
        ids = rng.sample(range(4), rng.randint(1, 2))
        rows = [Row(f"d{p[1:]}-{j}", p, 0, value) for j in ids]
    else:
        for p in rng.sample(partitions, rng.randint(1, min(2, len(partitions)))):
            if op == "upsert":
                rows += [
                    Row(f"u{p[1:]}-{j}", p, rng.randint(0, 3), value)
                    for j in rng.sample(range(6), rng.randint(1, 3))
                ]
            rows += [
                Row(next(fresh), p, rng.randint(0, 3), value)
                for _ in range(rng.randint(0 if op == "upsert" else 1, 2))
            ]
    return Round(op, tuple(rows))
