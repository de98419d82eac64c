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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# Protocol points at which a writer can be killed or stopped, in protocol order (see worker.py).
STEPS = (
    "claiming",  # begin: holding the table lock, no instant yet
    "claimed",  # begin: .requested created, heartbeat not started, lock held
    "requested",  # heartbeat running, nothing planned (on S3 the local engine planned beside its listing)
    "planned",  # .inflight written, no base file yet
    "mid-write",  # one base file written
    "written",  # every base file written, commit not started
    "locked",  # holding the lock for the commit, timeline not reloaded yet
    "published",  # the completed instant exists, lock still held
    "grouped",  # (S3) the holder published a waiter's commit after its own, lock held
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
# The daemon process, as the target of a timed fault (writers are numbered from 0).
DAEMON = -1
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
    column: str | None = None  # a string column the round's rows carry besides the four: it may be new


COLUMNS = ("c1", "c2")  # the columns rounds add; strings all, so any two writers' additions merge
COLUMN_SHARE = 0.25  # of the rounds that write rows


def extra_value(column: str, value: str) -> str:
    """What a round writes in ``column`` for a row whose ``value`` is ``value``."""
    return f"{column}:{value}"


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
    writer: int  # or DAEMON (starvation only)
    # kill | stop (one SIGSTOP shorter than the lease margin: must change nothing) | starve (SIGSTOP/SIGCONT
    # bursts for ``duration`` seconds, each stop shorter than the margin: a process that gets a fraction of
    # a CPU for whole heartbeat intervals, whose lease may expire while it is still running)
    kind: str
    duration: float = 0.0


@dataclass(frozen=True)
class Scenario:
    seed: int
    index: int
    backend: str  # local | s3
    latency: float  # seconds each S3 request is held by a delaying proxy (0: none)
    calm: bool  # disjoint work, no faults: every round of every writer must commit (liveness)
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

    @property
    def store(self) -> str:
        """The backend as the soak's table names it: ``local``, ``s3`` or ``s3+20ms``."""
        return self.backend + (f"+{self.latency * 1000:.0f}ms" if self.latency else "")

    def describe(self) -> str:
        faults = [
            f"w{w.index}:{w.step_fault.kind}@{w.step_fault.step}/r{w.step_fault.round}"
            for w in self.writers
            if w.step_fault
        ]
        faults += [
            f"{'daemon' if t.writer == DAEMON else f'w{t.writer}'}:{t.kind}@{t.at:.1f}s" for t in self.timed
        ]
        storage = [f"w{w.index}:{w.fault_rate:.2f}" for w in self.writers if w.fault_rate]
        return (
            f"scenario {self.index} ({self.store}{', calm' if self.calm else ''}): "
            f"{len(self.writers)} writers x "
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
    s3_latencies: tuple[float, ...] = (0.0,)  # an S3 scenario's round trip is one of these
    starve: bool = False  # timed faults may starve a writer or the daemon
    calm_share: float = 0.0  # fraction of calm scenarios (see Scenario.calm)
    faulty_share: float = 0.5  # fraction of writers whose storage calls misbehave
    fault_rates: tuple[float, float] = (0.02, 0.08)  # how often, for one of those writers
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
# The soak: as long, and half of the scenarios on S3, two thirds of those behind 20 or 50 ms round trips.
# More storage faults, the cheapest to run, so that thousands of faults fit in an hour or two.
SOAK = replace(
    LONG,
    s3_share=0.5,
    timed_faults=(1, 4),
    s3_latencies=(0.0, 0.02, 0.05),
    starve=True,
    calm_share=0.1,
    faulty_share=0.8,
    fault_rates=(0.05, 0.15),
)
# A crowd: as the soak, all on S3 behind round trips, with more writers, so that many wait for the lock at
# once and holders publish the commits of the writers queued behind them (group commit).
CROWD = replace(
    SOAK,
    writers=(6, 8),
    rounds=(4, 6),
    partitions=(12, 16),
    s3_share=1.0,
    s3_latencies=(0.02, 0.05),
    calm_share=0.0,
    faulty_share=0.3,
    fault_rates=(0.02, 0.05),
)
PROFILES = {"quick": QUICK, "long": LONG, "soak": SOAK, "crowd": CROWD}


def lease(backend: str, latency: float, calm: bool = False) -> tuple[int, int]:
    """(heartbeat interval in ms, tolerable misses) for a store.

    S3 keeps modification times in whole seconds, and a renewal is a round trip or more: a lease there is
    seconds long, and longer where a request takes tens of milliseconds (see the README's reliability
    section for the settings not to go below), as a user would choose. On local disk the fault scenarios
    use 0.4 s, far shorter than anyone would, so that killed and stopped writers are rolled back within the
    scenario; a calm scenario has nothing to recover from, and its liveness is judged with a lease a user
    would choose on a loaded machine: with 0.4 s, a soak that another heavy job shared saw a writer's
    renewal fall 0.4 s behind and its calm round abort (safely, but not live).
    """
    if backend == "local":
        return (1000, 3) if calm else (200, 2)
    return (2000, 3) if latency else (1000, 3)


def scenario(
    seed: int, index: int, profile: Profile, backends: tuple[str, ...] = ("local", "s3")
) -> Scenario:
    """The scenario ``index`` of run ``seed``: the same plan every time."""
    rng = random.Random(f"cowrite-chaos:{seed}:{index}")
    backend = "s3" if "s3" in backends and rng.random() < profile.s3_share else "local"
    if "local" not in backends:
        backend = "s3"
    # (no draw where a profile has no choice, so that the quick and long profiles replay their old seeds)
    latency = rng.choice(profile.s3_latencies) if backend == "s3" and len(profile.s3_latencies) > 1 else 0.0
    if profile.calm_share and rng.random() < profile.calm_share:
        return _calm(rng, seed, index, backend, latency, profile)
    partitions = tuple(f"p{i}" for i in range(rng.randint(*profile.partitions)))
    overwrite = rng.random() < 0.5
    seed_rows = [Row(f"u{p[1:]}-{j}", p, SEED_TS, "seed") for p in partitions for j in range(6)]
    seed_rows += [Row(f"d{p[1:]}-{j}", p, SEED_TS, "seed") for p in partitions for j in range(4)]
    if overwrite:
        seed_rows += [Row(f"ow-s{j}", OVERWRITE_PARTITION, SEED_TS, "seed") for j in range(3)]

    count = rng.randint(*profile.writers)
    writers = tuple(_writer(rng, w, partitions, overwrite, profile) for w in range(count))
    writers = _with_columns(random.Random(f"cowrite-chaos:{seed}:{index}:columns"), writers)
    interval_ms, misses = lease(backend, latency)
    tolerance = interval_ms / 1000 * misses
    timed = tuple(_timed(rng, count, profile, tolerance) for _ in range(rng.randint(*profile.timed_faults)))
    daemon = rng.choice(DAEMON_MODES)
    if profile.cycle:
        daemon = DAEMON_MODES[index % len(DAEMON_MODES)]
    daemon_kills: tuple[float, ...] = ()
    if daemon == "process-killed":
        daemon_kills = tuple(sorted(round(rng.uniform(0.5, 4.0), 2) for _ in range(rng.randint(1, 2))))
    consumers = tuple(rng.choice(CONSUMER_MODES) for _ in range(rng.randint(1, 3)))
    if profile.cycle:
        consumers = CONSUMER_MODES
    return Scenario(
        seed=seed,
        index=index,
        backend=backend,
        latency=latency,
        calm=False,
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


def _timed(rng: random.Random, writers: int, profile: Profile, tolerance: float) -> TimedFault:
    at = round(rng.uniform(0.3, 3.0), 2)
    target = rng.randrange(writers)
    kind = rng.choice(("kill", "stop", "starve") if profile.starve else ("kill", "stop"))
    if kind == "starve" and rng.random() < 0.25:
        target = DAEMON  # skipped where the daemon is no process of its own
    duration = 0.0
    if kind == "stop":
        duration = round(rng.uniform(0.01, 0.04), 3)
    elif kind == "starve":
        duration = round(rng.uniform(1.0, 2.0) * tolerance, 2)  # whole heartbeat intervals, and more
    return TimedFault(at=at, writer=target, kind=kind, duration=duration)


def _calm(
    rng: random.Random, seed: int, index: int, backend: str, latency: float, profile: Profile
) -> Scenario:
    """Each writer upserts into a partition of its own, nothing is injected: every round must commit."""
    count = rng.randint(*profile.writers)
    partitions = tuple(f"p{w}" for w in range(count))
    seed_rows = tuple(Row(f"u{w}-{j}", f"p{w}", SEED_TS, "seed") for w in range(count) for j in range(6))
    writers = tuple(
        WriterPlan(
            index=w,
            rounds=tuple(
                Round(
                    "upsert",
                    (
                        Row(f"u{w}-{r % 6}", f"p{w}", SEED_TS + 1 + r, f"w{w}.r{r}"),
                        Row(f"n{w}-{r}-0", f"p{w}", 0, f"w{w}.r{r}"),
                    ),
                )
                for r in range(rng.randint(*profile.rounds))
            ),
            skew=0.0,
            step_fault=None,
            fault_rate=0.0,
            fault_kinds=(),
            retries=0,
            early_conflicts=False,
            pause_between_rounds=0.0,
        )
        for w in range(count)
    )
    interval_ms, misses = lease(backend, latency, calm=True)
    return Scenario(
        seed=seed,
        index=index,
        backend=backend,
        latency=latency,
        calm=True,
        partitions=partitions,
        seed_rows=seed_rows,
        writers=writers,
        timed=(),
        daemon=rng.choice(("none", "thread", "process")),
        daemon_kills=(),
        cleaner_thread=rng.random() < 0.5,
        consumers=(rng.choice(CONSUMER_MODES),),
        commits_retained=4,
        archive=None,
        interval_ms=interval_ms,
        misses=misses,
        stop_for=0.0,
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
    faulty = rng.random() < profile.faulty_share
    return WriterPlan(
        index=index,
        rounds=rounds,
        skew=round(rng.uniform(-profile.max_skew, profile.max_skew), 3),
        step_fault=fault,
        fault_rate=round(rng.uniform(*profile.fault_rates), 3) if faulty else 0.0,
        fault_kinds=tuple(sorted(rng.sample(STORAGE_FAULTS, rng.randint(2, len(STORAGE_FAULTS))))),
        retries=rng.choice((0, 0, 1)),
        early_conflicts=rng.random() < 0.25,
        pause_between_rounds=round(rng.uniform(0.0, 0.2), 3),
    )


def _with_columns(rng: random.Random, writers: tuple[WriterPlan, ...]) -> tuple[WriterPlan, ...]:
    """Some rounds write a column besides the four, so that writers change the table's schema while
    others write. Drawn from a generator of their own, so that the rest of a seed's plan stays as it was."""
    return tuple(
        replace(
            plan,
            rounds=tuple(
                replace(r, column=rng.choice(COLUMNS))
                if r.op != "delete" and rng.random() < COLUMN_SHARE
                else r
                for r in plan.rounds
            ),
        )
        for plan in writers
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
