"""Table locks: one body per behaviour, run against every provider it applies to.

Providers: the filesystem lock on local disk, memory and S3 (moto), ZooKeeper (a real server) and the
in-process lock. Exclusion is proven with real processes where the provider spans processes; memory://
and the in-process lock exist only inside one process, so there the contenders are threads.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from support import ROOT, lock_worker, wait_until
from support.servers import S3Server, ZooKeeperServer

from cowrite.errors import ConfigError, CorruptTimelineError, LeaseLostError, LockTimeoutError, StorageError
from cowrite.format import config as keys
from cowrite.format.config import Config
from cowrite.protocol.heartbeat import HeartbeatPolicy, heartbeat_path
from cowrite.protocol.locks import (
    InProcessLock,
    LockHolder,
    TableLock,
    filesystem,
    lock_files,
    lock_for,
    releases,
)
from cowrite.protocol.locks.factory import zookeeper_hosts
from cowrite.protocol.locks.filesystem import FileSystemLock
from cowrite.protocol.locks.holders import current_lock, expire_stale_lock
from cowrite.protocol.locks.lock_files import (
    LOCK_DIR,
    acquired_path,
    collect_garbage,
    collectable,
    note_path,
    queued_path,
    read_release,
    released_path,
    scan,
)
from cowrite.protocol.locks.zookeeper import ZooKeeperLock
from cowrite.protocol.retry import RetryPolicy
from cowrite.storage.backend import Storage
from cowrite.storage.inotify import NewFiles
from cowrite.storage.together import finish_background

WORKER = Path(lock_worker.__file__)

# Long enough that no contender in an exclusion test expires a live holder.
PATIENT = HeartbeatPolicy(interval=30.0, tolerable_misses=2)
INSTANT = "20250101000000000"

CONTENDERS = 4
SECTIONS = 15

PROVIDERS = [
    pytest.param("filesystem", "local", id="filesystem-local"),
    pytest.param("filesystem", "memory", id="filesystem-memory"),
    pytest.param("filesystem", "s3", id="filesystem-s3"),
    pytest.param("zookeeper", "local", id="zookeeper"),
    pytest.param("in-process", "local", id="in-process"),
]
every_provider = pytest.mark.parametrize(("provider", "storage_uri"), PROVIDERS, indirect=["storage_uri"])


def fast_retry(deadline: float = 30.0) -> RetryPolicy:
    return RetryPolicy(delay=0.002, max_delay=0.02, deadline=deadline)


@pytest.fixture
def lock_config(provider: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """``hoodie.write.lock.*`` settings selecting ``provider``, with short pauses between tries."""
    settings = {
        keys.LOCK_PROVIDER.key: provider,
        keys.LOCK_WAIT_MS.key: "30000",
        keys.LOCK_RETRY_WAIT_MS.key: "2",
        keys.LOCK_MAX_RETRY_WAIT_MS.key: "20",
    }
    if provider == "zookeeper":
        server: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        settings.update(
            {
                # A host without a port, completed from the port key.
                keys.ZK_URL.key: "127.0.0.1",
                keys.ZK_PORT.key: str(server.port),
                keys.ZK_BASE_PATH.key: "/cowrite-test/locks",
                keys.ZK_LOCK_KEY.key: f"table-{uuid.uuid4().hex}",
                keys.ZK_CONNECTION_TIMEOUT_MS.key: "10000",
                keys.ZK_SESSION_TIMEOUT_MS.key: "10000",
            }
        )
    return settings


@pytest.fixture
def make_lock(storage: Storage, lock_config: dict[str, str]) -> Iterator[Callable[[LockHolder], TableLock]]:
    """Locks on one table from the factory; every lock made is released at the end of the test."""
    made: list[TableLock] = []

    def make(holder: LockHolder) -> TableLock:
        lock = lock_for(storage, Config(lock_config), holder, PATIENT, "table")
        made.append(lock)
        return lock

    yield make
    for lock in made:
        lock.release()


def worker_env() -> dict[str, str]:
    # cowrite is not installed into the virtualenv: the worker imports it from the checkout.
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


# -- exclusion -------------------------------------------------------------------------------------


@every_provider
def test_contenders_never_overlap_and_lose_no_increment(
    provider: str,
    storage_uri: str,
    storage_options: dict[str, Any],
    lock_config: dict[str, str],
    tmp_path: Path,
) -> None:
    counter, log = tmp_path / "counter", tmp_path / "log"
    counter.write_text("0")
    log.write_text("")
    spec = {
        "uri": storage_uri,
        "options": storage_options,
        "config": lock_config,
        "sections": SECTIONS,
        "counter": str(counter),
        "log": str(log),
        # The filesystem lock's contenders also collect garbage, as a daemon would, racing the others:
        # stale views happen for real, and S3 listings stay short.
        "gc_keep": 2 if provider == "filesystem" else None,
    }
    if provider == "in-process" or storage_uri.startswith("memory://"):
        # These locks (and memory://) live inside one process; threads are the only contenders they have.
        failures: list[BaseException] = []

        def contend() -> None:
            try:
                lock_worker.run_sections(spec)
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        threads = [threading.Thread(target=contend) for _ in range(CONTENDERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures
    else:
        processes = [
            subprocess.Popen(
                [sys.executable, str(WORKER), "sections", json.dumps(spec)],
                env=worker_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(CONTENDERS)
        ]
        try:
            errors = [process.communicate(timeout=60)[1].decode() for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=10)
        assert [process.returncode for process in processes] == [0] * CONTENDERS, errors

    assert int(counter.read_text()) == CONTENDERS * SECTIONS
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * CONTENDERS * SECTIONS
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter.startswith("enter ") and leave == "exit " + enter.removeprefix("enter "), (enter, leave)
    assert len({line.split()[1] for line in lines}) == CONTENDERS


@every_provider
def test_acquire_times_out_naming_the_holder(
    provider: str, make_lock: Callable[[LockHolder], TableLock]
) -> None:
    holder = make_lock(LockHolder(owner="writer-a", instant=INSTANT))
    holder.acquire(timeout=10)
    contender = make_lock(LockHolder(owner="writer-b"))

    with pytest.raises(LockTimeoutError) as raised:
        contender.acquire(timeout=0.2)
    assert "writer-a" in str(raised.value) and INSTANT in str(raised.value)
    assert "retry" in str(raised.value)
    assert not contender.is_held
    holder.check_held()

    holder.release()
    contender.acquire(timeout=10)
    contender.check_held()


@every_provider
def test_release_is_safe_twice_and_when_not_held(
    provider: str, make_lock: Callable[[LockHolder], TableLock]
) -> None:
    lock = make_lock(LockHolder())
    lock.release()
    with pytest.raises(LeaseLostError):
        lock.check_held()

    with lock:
        assert lock.is_held
        lock.check_held()
    assert not lock.is_held
    lock.release()
    lock.release()
    with pytest.raises(LeaseLostError):
        lock.check_held()

    other = make_lock(LockHolder())
    other.acquire(timeout=10)
    other.release()


# -- the filesystem lock ---------------------------------------------------------------------------


@pytest.fixture
def every_taker_confirms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every taker of the filesystem lock confirms it with a listing, so collectors need not leave young
    locks alone: tests of what collection removes do not wait for lock files to age."""
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 0.0)
    monkeypatch.setattr(lock_files, "COLLECTABLE_AGE", 0.0)


def lock_ids(storage: Storage) -> list[str]:
    return sorted((info.name for info in storage.list(LOCK_DIR)), key=lambda n: (int(n[4:].split(".")[0]), n))


def fs_lock(
    storage: Storage,
    holder: LockHolder | None = None,
    now: Callable[[], float] = time.time,
    policy: HeartbeatPolicy = PATIENT,
) -> FileSystemLock:
    return FileSystemLock(storage, holder or LockHolder(), policy, fast_retry(), now=now)


def test_a_holders_own_release_is_empty_and_reads_as_released_by_it(storage: Storage) -> None:
    before = time.time()
    lock = fs_lock(storage, LockHolder(owner="writer-1"))
    lock.acquire(timeout=5)
    lock.release()
    finish_background()  # on an object store the release is made in the background
    assert storage.read(released_path(1)) == b""  # one exclusive create on the way to the next holder
    release = read_release(storage, 1)
    assert (release["owner"], release["reason"]) == ("writer-1", "released")
    assert before - 2 <= float(release["time"]) <= time.time() + 2  # type: ignore[arg-type]


def test_a_holder_whose_note_exists_is_told_its_turn_ended_with_that_note(storage: Storage) -> None:
    """A release that created the turn's note and then failed leaves the holder asking: the note is
    that turn's release, so the lock is lost to it, and the error names what the note says."""
    lock = fs_lock(storage, LockHolder(owner="writer-1"))
    lock.acquire(timeout=5)
    storage.create_if_absent(note_path(1, "20261128070554629_20261128070554828.commit"), b"")

    with pytest.raises(LeaseLostError, match="noting that its turn published 20261128070554629_"):
        lock.check_held()


@pytest.fixture
def s3_storage(s3_server: S3Server) -> Storage:
    uri = s3_server.new_uri("cowrite-test")
    return Storage.for_uri(uri, **s3_server.storage_options())


def test_the_next_turn_of_a_process_waits_for_its_release_made_in_the_background(
    s3_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store ``release`` returns before its request is answered. The process's next writer
    notes the turn from a listing that still shows that lock held, counts it as free all the same (the
    release is its own), and takes the next turn with one try once the release is there."""
    answer = threading.Event()
    write_release = releases.write_release

    def held_back(*args: Any) -> bool:
        assert answer.wait(timeout=10)
        return write_release(*args)

    monkeypatch.setattr(releases, "write_release", held_back)
    first = fs_lock(s3_storage, LockHolder(owner="first"))
    first.acquire(timeout=5)
    first.release()
    assert not first.is_held and lock_ids(s3_storage) == ["lock1.acquired"]
    following = fs_lock(s3_storage, LockHolder(owner="following"))
    assert following.turn() == 1
    answer.set()
    assert following.acquire_next(1)
    assert following.lock_id == 2
    assert lock_ids(s3_storage) == ["lock1.acquired", "lock1.released", "lock2.acquired"]


def test_a_release_that_failed_in_the_background_is_not_taken_for_one(
    s3_storage: Storage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The process's next writer does not take the turn after a lock whose release failed: that lock is
    still held, and expires as any other."""

    def failing(*args: Any) -> bool:
        raise StorageError("the release's request failed")

    first = fs_lock(s3_storage, LockHolder(owner="first"))
    first.acquire(timeout=5)
    following = fs_lock(s3_storage, LockHolder(owner="following"))
    assert following.turn() == 0
    monkeypatch.setattr(releases, "write_release", failing)
    with caplog.at_level(logging.WARNING, logger="cowrite.storage.together"):
        first.release()
        assert following.turn() == 1
        assert not following.acquire_next(1)
    assert "releasing table lock 1" in caplog.text and "the release's request failed" in caplog.text
    assert lock_ids(s3_storage) == ["lock1.acquired"]
    with pytest.raises(LockTimeoutError, match="held by first"):
        following.acquire(timeout=0.1)


def test_waiters_on_an_object_store_queue_and_take_the_lock_in_their_order(s3_storage: Storage) -> None:
    """A waiter that finds the lock held takes the next place in the queue; once the lock is free, a
    waiter that queued later leaves the next id to the one whose place it is."""
    holder = fs_lock(s3_storage, LockHolder(owner="holder"))
    holder.acquire(timeout=5)
    taken: list[tuple[str, int | None]] = []

    def wait(name: str) -> None:
        lock = fs_lock(s3_storage, LockHolder(owner=name))
        lock.acquire(timeout=20)
        taken.append((name, lock.lock_id))
        time.sleep(0.3)  # held a while: the later waiter finds it held and waits for its own place
        lock.release()

    first = threading.Thread(target=wait, args=("first",))
    first.start()
    wait_until(lambda: s3_storage.exists(queued_path(2)), "the first waiter's place")
    later = threading.Thread(target=wait, args=("later",))
    later.start()
    wait_until(lambda: s3_storage.exists(queued_path(3)), "the later waiter's place")
    holder.release()
    first.join(timeout=30)
    later.join(timeout=30)
    finish_background()
    assert taken == [("first", 2), ("later", 3)]
    assert lock_ids(s3_storage) == [
        "lock1.acquired", "lock1.released",
        "lock2.acquired", "lock2.queued", "lock2.released",
        "lock3.acquired", "lock3.queued", "lock3.released",
    ]  # fmt: skip


def test_a_place_whose_waiter_died_holds_up_the_lock_only_for_a_while(s3_storage: Storage) -> None:
    """Lock 2 is free, and a waiter that died queued for it. The next waiter leaves it free for a
    while, then takes it, and gives up the place it took meanwhile, so nobody waits for that one."""
    assert s3_storage.create_if_absent(acquired_path(1), LockHolder(owner="gone").to_bytes())
    assert s3_storage.create_if_absent(released_path(1), b"")
    assert s3_storage.create_if_absent(queued_path(2), b"")
    lock = fs_lock(s3_storage, LockHolder(owner="next"))
    started = time.monotonic()
    lock.acquire(timeout=20)
    assert lock.lock_id == 2
    assert time.monotonic() - started >= filesystem._LEAVE_AT_LEAST
    finish_background()
    assert lock_ids(s3_storage) == ["lock1.acquired", "lock1.released", "lock2.acquired", "lock2.queued"]


def test_a_waiter_that_gives_up_leaves_no_place_behind(s3_storage: Storage) -> None:
    holder = fs_lock(s3_storage, LockHolder(owner="holder"))
    holder.acquire(timeout=5)
    waiter = fs_lock(s3_storage, LockHolder(owner="waiter"))
    with pytest.raises(LockTimeoutError, match="held by holder"):
        waiter.acquire(timeout=0.5)
    finish_background()
    assert lock_ids(s3_storage) == ["lock1.acquired"]  # its place, lock2.queued, went with it


def test_a_waiter_that_handed_its_commit_over_behind_another_asks_again_two_holds_later(
    s3_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder reads the queue as its turn begins (group commit), so a commit handed over behind another
    waiter's is published at the end of the next turn at the earliest: its waiter first asks again two
    holds after it queued, then every hold. The first in the queue, which takes the next turn, asks every
    hold."""
    hold = 0.05
    monkeypatch.setattr(filesystem, "hold_seconds", lambda uri: hold)
    pauses: dict[str, list[float]] = {}
    wait = NewFiles.wait

    def noted(self: NewFiles, seconds: float) -> None:
        pauses.setdefault(threading.current_thread().name, []).append(seconds)
        wait(self, seconds)

    monkeypatch.setattr(NewFiles, "wait", noted)
    holder = fs_lock(s3_storage, LockHolder(owner="holder"))
    holder.acquire(timeout=5)

    def hand_over(name: str) -> None:
        paced = RetryPolicy(delay=0.0, max_delay=0.0, jitter=0.0, deadline=30.0)  # every pause is the pace
        lock = FileSystemLock(s3_storage, LockHolder(owner=name), PATIENT, paced)
        lock.request = f"the commit of {name}".encode()
        lock.acquire()
        lock.release()

    waiters = [threading.Thread(target=hand_over, args=(name,), name=name) for name in ("first", "later")]
    for waiter, place in zip(waiters, (2, 3), strict=True):
        waiter.start()
        wait_until(lambda place=place: s3_storage.exists(queued_path(place)), f"the place lock{place}.queued")
    wait_until(lambda: len(pauses.get("later", [])) >= 2, "the later waiter's second pause")
    holder.release()
    for waiter in waiters:
        waiter.join(timeout=30)
    finish_background()
    assert pauses["first"][:2] == [hold, hold]
    assert pauses["later"][:2] == [2 * hold, hold]


@pytest.mark.usefixtures("every_taker_confirms")
def test_places_go_with_the_lock_files_of_their_turns(storage: Storage) -> None:
    for lock_id in (1, 2, 3):
        assert storage.create_if_absent(acquired_path(lock_id), LockHolder().to_bytes())
        assert storage.create_if_absent(released_path(lock_id), b"")
        assert storage.create_if_absent(queued_path(lock_id), b"")
    assert storage.create_if_absent(queued_path(4), b"")
    assert lock_files.scan(storage).queued == {1, 2, 3, 4}
    assert collect_garbage(storage, keep=1) == 3  # lock1's files and its place; ids below 3 - 1 go
    assert lock_ids(storage) == [
        "lock2.acquired", "lock2.queued", "lock2.released",
        "lock3.acquired", "lock3.queued", "lock3.released",
        "lock4.queued",
    ]  # fmt: skip


@pytest.mark.usefixtures("every_taker_confirms")
def test_ids_only_grow_and_compare_as_numbers(storage: Storage) -> None:
    # Lexically "lock9" sorts after "lock10"; taking 9 for the highest would re-create lock10 forever.
    for lock_id in (9, 10):
        assert storage.create_if_absent(acquired_path(lock_id), LockHolder().to_bytes())
        assert storage.create_if_absent(released_path(lock_id), b'{"owner": "x", "reason": "released"}')
    lock = fs_lock(storage)
    seen = []
    for _ in range(3):
        lock.acquire(timeout=5)
        seen.append(lock.lock_id)
        lock.release()
        assert lock.lock_id is None
    assert seen == [11, 12, 13]

    assert collect_garbage(storage, keep=0) == 2 * 4
    lock.acquire(timeout=5)
    assert lock.lock_id == 14
    assert lock_ids(storage) == ["lock13.acquired", "lock13.released", "lock14.acquired"]
    current = current_lock(storage)
    assert current is not None and current.lock_id == 14 and current.holder.owner == lock.holder.owner


class Clock:
    """Wall-clock time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


STALENESS = {
    "heartbeat-stale": (INSTANT, True),  # holder works for an instant whose heartbeat stopped
    "no-heartbeat": (INSTANT, False),  # instant without a heartbeat file: judged by the lock file's age
    "no-instant": (None, False),  # holder taking an instant time: judged by the lock file's age
}


@pytest.mark.parametrize("scenario", list(STALENESS))
def test_a_stale_holder_is_expired_and_learns_it(
    storage: Storage, scenario: str, caplog: pytest.LogCaptureFixture
) -> None:
    instant, beating = STALENESS[scenario]
    if beating:
        storage.write(heartbeat_path(INSTANT), b"{}")
    clock = Clock()
    old = fs_lock(storage, LockHolder(owner="old-writer", instant=instant), now=clock)
    old.acquire(timeout=5)
    contender = fs_lock(storage, LockHolder(owner="contender"), now=clock)

    with pytest.raises(LockTimeoutError, match="old-writer"):
        contender.acquire(timeout=0.05)

    clock.offset = PATIENT.tolerance + 5
    contender.acquire(timeout=5)
    assert contender.lock_id == 2
    contender.check_held()
    release = read_release(storage, 1)
    assert (release["owner"], release["reason"]) == ("contender", "expired")
    with pytest.raises(LeaseLostError, match="expired by contender"):
        old.check_held()

    with caplog.at_level(logging.WARNING, logger="cowrite.protocol.locks.filesystem"):
        old.release()
        finish_background()
    assert "already released" in caplog.text
    assert not old.is_held
    contender.check_held()
    contender.release()


def test_a_waiter_judges_a_live_holder_again_only_once_it_could_be_stale(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every try of a waiter lists the lock directory; the lock's age is looked up once (an object store's
    listing tells it), and while the lock is younger than the safety margin (which its holder had left
    when it took it) the holder is neither read nor judged; later its liveness is asked only when its
    age could have reached the tolerance."""
    storage.write(heartbeat_path(INSTANT), b"{}")
    clock = Clock()
    holder = fs_lock(storage, LockHolder(owner="holder", instant=INSTANT), now=clock)
    holder.acquire(timeout=5)
    looked_up: list[str] = []
    tries: list[int] = []
    stat, try_acquire = type(storage).stat, FileSystemLock._try_acquire
    monkeypatch.setattr(type(storage), "stat", lambda self, path: looked_up.append(path) or stat(self, path))
    monkeypatch.setattr(FileSystemLock, "_try_acquire", lambda self: tries.append(1) or try_acquire(self))
    # A number of tries rather than a deadline: a loaded machine may spend any time on one try.
    five_tries = replace(fast_retry(), deadline=None, max_tries=5)
    waiter = FileSystemLock(storage, LockHolder(owner="waiter"), PATIENT, five_tries, now=clock)

    with pytest.raises(LockTimeoutError, match="holder"):
        waiter.acquire()
    assert len(tries) >= 5
    age = [] if storage.round_trips else [acquired_path(1)]  # an object store's listing tells the age
    assert looked_up == age

    clock.offset = PATIENT.margin + storage.clock_resolution  # old enough to be judged: alive
    with pytest.raises(LockTimeoutError, match="holder"):
        waiter.acquire()
    assert sorted(looked_up) == sorted(age * 2 + [heartbeat_path(INSTANT)])

    clock.offset = PATIENT.tolerance + storage.clock_resolution + 1  # the heartbeat is that old now
    waiter.acquire(timeout=5)
    assert waiter.lock_id == 2 and read_release(storage, 1)["reason"] == "expired"
    assert looked_up.count(heartbeat_path(INSTANT)) == 2


def test_a_live_heartbeat_keeps_an_old_lock(tmp_path: Path) -> None:
    storage = Storage.for_uri(str(tmp_path / "table"))
    storage.write(heartbeat_path(INSTANT), b"{}")
    holder = fs_lock(storage, LockHolder(owner="slow-writer", instant=INSTANT))
    holder.acquire(timeout=5)
    long_ago = time.time() - 10 * PATIENT.tolerance
    os.utime(storage.full_path(acquired_path(1)), (long_ago, long_ago))

    with pytest.raises(LockTimeoutError, match="slow-writer"):
        fs_lock(storage).acquire(timeout=0.05)
    assert expire_stale_lock(storage, PATIENT) is None
    holder.check_held()


def test_a_release_wakes_a_waiter_on_local_disk(tmp_path: Path) -> None:
    # The waiter's pauses are far longer than the test may take: only the release can wake it in time.
    storage = Storage.for_uri(str(tmp_path / "table"))
    holder = fs_lock(storage, LockHolder(owner="holder"))
    holder.acquire(timeout=5)
    sleepy = RetryPolicy(delay=120, max_delay=120)
    waiter = FileSystemLock(storage, LockHolder(owner="waiter"), PATIENT, sleepy)
    acquired = threading.Event()
    thread = threading.Thread(target=lambda: (waiter.acquire(timeout=300), acquired.set()), daemon=True)
    thread.start()
    assert not acquired.wait(0.3)  # waiting, asleep until a lock file appears
    holder.release()
    assert acquired.wait(30), "the waiter slept through the release"
    assert waiter.lock_id == 2
    waiter.check_held()
    waiter.release()


def test_the_daemon_expires_only_stale_locks(storage: Storage) -> None:
    clock = Clock()
    assert expire_stale_lock(storage, PATIENT, now=clock) is None
    holder = fs_lock(storage, LockHolder(owner="writer"))
    holder.acquire(timeout=5)
    assert expire_stale_lock(storage, PATIENT, now=clock) is None

    clock.offset = PATIENT.tolerance + 5
    assert expire_stale_lock(storage, PATIENT, now=clock, reaper="daemon-1") == 1
    assert read_release(storage, 1)["owner"] == "daemon-1"
    assert expire_stale_lock(storage, PATIENT, now=clock) is None
    with pytest.raises(LeaseLostError, match="daemon-1"):
        holder.check_held()


def test_a_killed_holder_is_recovered_after_the_tolerance(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    policy = HeartbeatPolicy(interval=0.2, tolerable_misses=2)
    spec = {
        "uri": uri,
        "config": {keys.LOCK_PROVIDER.key: "filesystem"},
        "heartbeat": [policy.interval, policy.tolerable_misses],
        "instant": INSTANT,
    }
    process = subprocess.Popen(
        [sys.executable, str(WORKER), "hold", json.dumps(spec)], env=worker_env(), stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().decode().strip() == "acquired 1"
        storage = Storage.for_uri(uri)
        contender = fs_lock(storage, LockHolder(owner="contender"), policy=policy)
        with pytest.raises(LockTimeoutError, match=INSTANT):
            contender.acquire(timeout=0.1)  # alive: its heartbeat is renewed every 0.2 s

        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        killed = time.monotonic()
        contender.acquire(timeout=10)
        assert time.monotonic() - killed < policy.tolerance + 2
        assert contender.lock_id == 2
        assert read_release(storage, 1)["reason"] == "expired"
        contender.release()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


@pytest.mark.usefixtures("every_taker_confirms")
def test_a_lock_taken_from_a_stale_view_is_not_held_and_its_files_go(
    storage: Storage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    writer = fs_lock(storage)
    for _ in range(3):
        writer.acquire(timeout=5)
        writer.release()
    finish_background()
    stale_view = storage.watched_names(LOCK_DIR)  # a contender's listing showing lock3 released
    for _ in range(8):
        writer.acquire(timeout=5)
        writer.release()
    holder = fs_lock(storage, LockHolder(owner="real-holder"))
    holder.acquire(timeout=5)
    assert holder.lock_id == 12
    # lock8's holder collected ids 1..4 (in the background on an object store), this ids 5..9: lock4.acquired
    # can be created again
    wait_until(lambda: "lock4.acquired" not in lock_ids(storage), "lock8's holder to collect lock4")
    assert collect_garbage(storage, keep=2) == 2 * 5

    # The contender's first listing is the stale one; every later one is fresh.
    real_scan = filesystem.scan
    views = iter([lock_files.files_named(stale_view)])
    monkeypatch.setattr(
        filesystem, "scan", lambda storage, *fresh: next(views, None) or real_scan(storage, *fresh)
    )
    contender = fs_lock(storage, LockHolder(owner="stale-contender"))
    with (
        caplog.at_level(logging.INFO, logger="cowrite.protocol.locks.filesystem"),
        pytest.raises(LockTimeoutError, match="real-holder"),
    ):
        contender.acquire(timeout=0.1)
    assert not contender.is_held
    assert "lock4 on" in caplog.text and "stale view (lock12 exists)" in caplog.text
    # released, then collected (in the background on an object store): nobody else would collect it
    stale = {"lock4.acquired", "lock4.released"}
    wait_until(lambda: not stale & set(lock_ids(storage)), "lock4's files to go")
    holder.check_held()
    current = current_lock(storage)
    assert current is not None and current.lock_id == 12 and current.holder.owner == holder.holder.owner

    holder.release()
    contender.acquire(timeout=5)
    assert contender.lock_id == 13
    contender.release()


def test_a_taker_whose_listing_is_fresh_holds_the_lock_without_listing_again(
    s3_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store, a lock taken from a listing that began less than FRESH_VIEW before the create
    returned is held at once: one listing and one create. A turn noted by an older listing is not taken
    with one try (the create would need a listing to confirm it): the taker lists first. (Nothing collects
    here, so FRESH_VIEW is set as the test needs, whatever the machine's speed.)"""
    first = fs_lock(s3_storage)
    first.acquire(timeout=5)
    first.release()
    finish_background()
    listings: list[str] = []
    listed = s3_storage.list
    monkeypatch.setattr(s3_storage, "list", lambda path: listings.append(path) or listed(path))
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 60.0)

    taker = fs_lock(s3_storage, LockHolder(owner="taker"))
    taker.acquire(timeout=5)
    assert (taker.lock_id, listings) == (2, [LOCK_DIR])
    taker.check_held()
    taker.release()
    finish_background()

    late = fs_lock(s3_storage, LockHolder(owner="late"))
    turn = late.turn()
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 0.0)  # that listing is old now
    assert not late.acquire_next(turn) and lock_ids(s3_storage) == [
        "lock1.acquired", "lock1.released", "lock2.acquired", "lock2.released"
    ]  # fmt: skip
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 60.0)
    listings.clear()
    late.acquire(timeout=5)
    assert (late.lock_id, listings) == (3, [LOCK_DIR])
    late.release()
    finish_background()


def test_a_process_takes_its_next_turn_from_its_last_one_without_listing(
    s3_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store the create of a process's last turn showed that no later turn existed, and
    collectors leave a later one alone longer than FRESH_VIEW: so while that create began less than half
    FRESH_VIEW ago, the process notes its next turn and takes it with no listing. Every fourth turn (the
    one that collects old lock files) is taken from a listing, which leaves it to a waiter queued for it;
    a waiter queued for another is overtaken. A turn someone else took meanwhile is not taken twice."""
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 60.0)  # fresh, however slow the machine
    listings: list[str] = []
    listed = s3_storage.list
    monkeypatch.setattr(s3_storage, "list", lambda path: listings.append(path) or listed(path))
    for waiting in (2, 4):  # places of waiters that died in the queue
        assert s3_storage.create_if_absent(queued_path(waiting), b"")

    def next_turn(owner: str) -> tuple[int | None, bool, bool]:
        lock = fs_lock(s3_storage, LockHolder(owner=owner))
        listings.clear()
        one_try = lock.acquire_next(lock.turn())
        if not one_try:
            lock.acquire(timeout=5)
        took = (lock.lock_id, one_try, bool(listings))
        lock.release()
        return took

    taken = [next_turn(f"writer-{n}") for n in range(5)]
    # (id, taken with one try, listed): the first turn and the fourth list, and the fourth is left a while
    assert taken == [(1, True, True), (2, True, False), (3, True, False), (4, False, True), (5, True, False)]
    finish_background()
    assert s3_storage.create_if_absent(acquired_path(6), LockHolder(owner="rival").to_bytes())
    lock = fs_lock(s3_storage, LockHolder(owner="overtaken"))
    assert lock.turn() == 5 and not lock.acquire_next(5) and lock.lock_id is None
    assert s3_storage.create_if_absent(released_path(6), b"")
    lock.acquire(timeout=5)
    assert lock.lock_id == 7
    lock.release()
    finish_background()
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 0.2)
    time.sleep(0.1)  # the last turn began half FRESH_VIEW ago or more: the next one is listed
    listings.clear()
    assert fs_lock(s3_storage).turn() == 7 and listings == [LOCK_DIR]


def test_a_process_notes_its_turn_from_its_own_recent_listing_of_the_lock_directory(
    s3_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose commit a holder published listed the lock directory as it waited: while that listing
    began less than half FRESH_VIEW ago, and after the process's own last turn, its next turn is noted from
    it, with no listing. Older than the process's own last turn, it is not: that turn's create showed
    more."""
    monkeypatch.setattr(filesystem, "FRESH_VIEW", 60.0)  # fresh, however slow the machine
    for rival in (1, 2):  # turns of another process
        assert s3_storage.create_if_absent(acquired_path(rival), LockHolder(owner="rival").to_bytes())
        assert s3_storage.create_if_absent(released_path(rival), b"")
    listings: list[str] = []
    listed = s3_storage.list
    monkeypatch.setattr(s3_storage, "list", lambda path: listings.append(path) or listed(path))
    assert scan(s3_storage).highest == 2  # a waiter's listing
    listings.clear()

    lock = fs_lock(s3_storage, LockHolder(owner="next-write"))
    assert (lock.turn(), listings) == (2, [])
    assert lock.acquire_next(2) and lock.lock_id == 3
    lock.release()
    finish_background()
    listings.clear()
    # its own turn 3 is the newest view, but the turn after it collects old lock files, so it is listed;
    # the waiter's listing came before turn 3 and is not taken for one
    assert fs_lock(s3_storage).turn() == 3 and listings == [LOCK_DIR]


def test_collectors_leave_the_files_of_young_locks_on_an_object_store(
    s3_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Takers with a fresh listing do not confirm their locks, so a process collects a lock only once its
    listings have shown it for COLLECTABLE_AGE: until then, its id cannot be taken again."""
    lock = fs_lock(s3_storage)
    for _ in range(3):
        lock.acquire(timeout=5)
        lock.release()
    finish_background()
    monkeypatch.setattr(lock_files, "COLLECTABLE_AGE", 60.0)  # young, however slow the machine
    assert collect_garbage(s3_storage, keep=0) == 0
    monkeypatch.setattr(lock_files, "COLLECTABLE_AGE", 0.5)
    time.sleep(0.6)
    lock.acquire(timeout=5)
    assert collect_garbage(s3_storage, keep=0) == 2 * 3
    assert lock_ids(s3_storage) == ["lock4.acquired"]
    lock.release()
    finish_background()


@pytest.mark.usefixtures("every_taker_confirms")
def test_a_forged_low_lock_does_not_count(storage: Storage) -> None:
    writer = fs_lock(storage)
    for _ in range(5):
        writer.acquire(timeout=5)
        writer.release()
    collect_garbage(storage, keep=1)
    assert storage.create_if_absent(acquired_path(1), LockHolder(owner="forger").to_bytes())

    contender = fs_lock(storage, LockHolder(owner="contender"))
    contender.acquire(timeout=5)
    assert contender.lock_id == 6
    contender.release()


@pytest.mark.usefixtures("every_taker_confirms")
def test_garbage_collection_keeps_the_highest_ids(storage: Storage) -> None:
    assert collect_garbage(storage) == 0
    lock = fs_lock(storage)
    for _ in range(3):  # fewer turns than holders collect after
        lock.acquire(timeout=5)
        lock.release()
    lock.acquire(timeout=5)  # 4, held
    assert collect_garbage(storage, keep=2) == 2 * 1
    assert lock_ids(storage)[0] == "lock2.acquired"
    assert collect_garbage(storage, keep=2) == 0
    assert collect_garbage(storage, keep=0) == 2 * 2
    assert lock_ids(storage) == ["lock4.acquired"]
    lock.check_held()
    with pytest.raises(ValueError):
        collect_garbage(storage, keep=-1)


def test_a_corrupt_lock_payload_does_not_wedge_acquire(
    storage: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    assert storage.create_if_absent(acquired_path(1), b"\x00 not json")
    with pytest.raises(CorruptTimelineError, match="lock1.acquired"):
        current_lock(storage)

    clock = Clock()
    contender = fs_lock(storage, LockHolder(owner="contender"), now=clock)
    with caplog.at_level(logging.WARNING, logger="cowrite.protocol.locks.filesystem"):
        with pytest.raises(LockTimeoutError, match="unreadable"):
            contender.acquire(timeout=0.05)  # fresh: treated as a holder without an instant
    assert "lock1.acquired" in caplog.text

    clock.offset = PATIENT.tolerance + 5
    contender.acquire(timeout=5)
    assert contender.lock_id == 2
    assert read_release(storage, 1)["reason"] == "expired"
    contender.release()


# -- ZooKeeper -------------------------------------------------------------------------------------


def zk_lock(server: ZooKeeperServer, path: str, owner: str) -> ZooKeeperLock:
    return ZooKeeperLock(
        server.hosts, path, LockHolder(owner=owner), fast_retry(), session_timeout=10, connection_timeout=10
    )


def test_zookeeper_session_loss_loses_the_lock(zookeeper_server: ZooKeeperServer) -> None:
    path = f"/cowrite-test/locks/{uuid.uuid4().hex}"
    holder = zk_lock(zookeeper_server, path, "holder")
    contender = zk_lock(zookeeper_server, path, "contender")
    try:
        holder.acquire(timeout=10)
        holder.check_held()
        assert holder.client is not None

        # Closing the session from a second connection is how ZooKeeper expires a session on purpose.
        thief = KazooClient(hosts=zookeeper_server.hosts, client_id=holder.client.client_id)
        thief.start(timeout=10)
        thief.stop()
        thief.close()

        deadline = time.monotonic() + 10
        while holder.is_held and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(LeaseLostError, match="holder"):
            holder.check_held()
        contender.acquire(timeout=10)
        contender.check_held()
        holder.release()
        holder.release()
        contender.check_held()
    finally:
        holder.release()
        contender.release()


def test_zookeeper_lock_waits_for_a_curator_contender(zookeeper_server: ZooKeeperServer) -> None:
    # Hudi's ZookeeperBasedLockProvider (Curator's InterProcessMutex) names its nodes _c_<uuid>-lock-<seq>.
    path = f"/cowrite-test/locks/{uuid.uuid4().hex}"
    java_writer = KazooClient(hosts=zookeeper_server.hosts)
    java_writer.start(timeout=10)
    lock = zk_lock(zookeeper_server, path, "python-writer")
    try:
        node = java_writer.create(
            f"{path}/_c_{uuid.uuid4()}-lock-", b"10.0.0.7", ephemeral=True, sequence=True, makepath=True
        )
        with pytest.raises(LockTimeoutError, match="10.0.0.7"):
            lock.acquire(timeout=0.2)
        java_writer.delete(node)
        lock.acquire(timeout=10)
        lock.check_held()
    finally:
        lock.release()
        java_writer.stop()
        java_writer.close()


def test_zookeeper_unreachable_times_out_naming_the_hosts() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        hosts = f"127.0.0.1:{probe.getsockname()[1]}"
        lock = ZooKeeperLock(hosts, "/cowrite-test/t", LockHolder(), fast_retry(), connection_timeout=0.3)
        with pytest.raises(LockTimeoutError, match=re.escape(hosts)):
            lock.acquire(timeout=5)
    assert not lock.is_held
    lock.release()


# -- the factory -----------------------------------------------------------------------------------

HUDI = "org.apache.hudi.client.transaction.lock"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("filesystem", FileSystemLock),
        (f"{HUDI}.FileSystemBasedLockProvider", FileSystemLock),
        ("zookeeper", ZooKeeperLock),
        (f"{HUDI}.ZookeeperBasedLockProvider", ZooKeeperLock),
        ("in-process", InProcessLock),
        (f"{HUDI}.InProcessLockProvider", InProcessLock),
    ],
)
def test_factory_knows_providers_and_hudi_class_names(name: str, kind: type[TableLock]) -> None:
    storage = Storage.for_uri("memory://factory-table")
    settings = {keys.LOCK_PROVIDER.key: name, keys.ZK_URL.key: "zk1,zk2:2182", keys.LOCK_WAIT_MS.key: "1500"}
    lock = lock_for(storage, Config(settings), LockHolder(), PATIENT, "orders")
    assert type(lock) is kind
    assert lock.retry.deadline == 1.5
    if isinstance(lock, ZooKeeperLock):
        assert lock.hosts == "zk1:2181,zk2:2182"
        assert lock.path == "/cowrite/locks/orders"
    if isinstance(lock, InProcessLock):
        assert lock.key == storage.uri


def test_factory_rejects_unknown_providers_listing_the_choices() -> None:
    hive = "org.apache.hudi.hive.transaction.lock.HiveMetastoreBasedLockProvider"
    config = Config({keys.LOCK_PROVIDER.key: hive})
    with pytest.raises(ConfigError) as raised:
        lock_for(Storage.for_uri("memory://t"), config, LockHolder(), PATIENT, "t")
    for choice in ("filesystem", "zookeeper", "in-process", f"{HUDI}.ZookeeperBasedLockProvider"):
        assert choice in str(raised.value)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({keys.ZK_URL.key: ""}, "names no ZooKeeper host"),
        ({keys.ZK_URL.key: "zk1:port"}, "bad port"),
        ({keys.ZK_URL.key: "zk1", keys.ZK_BASE_PATH.key: "locks"}, "absolute"),
        ({keys.ZK_URL.key: "zk1", keys.ZK_PORT.key: "many"}, "invalid value"),
        ({keys.ZK_URL.key: "zk1", keys.LOCK_WAIT_MS.key: "-1"}, "must not be negative"),
    ],
)
def test_factory_rejects_malformed_zookeeper_settings(settings: dict[str, str], problem: str) -> None:
    config = Config({keys.LOCK_PROVIDER.key: "zookeeper", **settings})
    with pytest.raises(ConfigError, match=problem):
        lock_for(Storage.for_uri("memory://t"), config, LockHolder(), PATIENT, "t")


def test_zookeeper_hosts_take_the_default_port_where_missing() -> None:
    assert zookeeper_hosts("a, b:2182 ,c", 2181) == "a:2181,b:2182,c:2181"
    assert zookeeper_hosts("[::1]:2190,::1", 2181) == "[::1]:2190,[::1]:2181"


def test_factory_without_kazoo_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cowrite.protocol.locks.zookeeper", None)
    config = Config({keys.LOCK_PROVIDER.key: "zookeeper", keys.ZK_URL.key: "zk1"})
    with pytest.raises(ConfigError, match=r"pip install cowrite\[zookeeper\]"):
        lock_for(Storage.for_uri("memory://t"), config, LockHolder(), PATIENT, "t")


def test_a_turn_that_noted_what_it_published_ends_with_the_note(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The note is the release: one file, made once the completed file it names exists, that waiters
    read as the end of the turn and holders collect with the turn's other files."""
    monkeypatch.setattr(lock_files, "COLLECTABLE_AGE", 0.0)
    published = "20261126000000001_20261126000000002.commit"
    first = fs_lock(storage, LockHolder(owner="writer-1"))
    first.acquire(timeout=5)
    first.note_published(published)
    assert lock_ids(storage) == ["lock1.acquired"]  # noted when it is released
    waiter = fs_lock(storage)
    with pytest.raises(LockTimeoutError):
        waiter.acquire(timeout=0.2)
    first.release()
    finish_background()
    assert lock_ids(storage) == ["lock1.acquired", f"lock1.published.{published}"]
    assert not scan(storage).is_held(1) and scan(storage).published == {1: (published,)}
    waiter.acquire(timeout=5)
    assert waiter.lock_id == 2 and waiter.published_since(0) == [published]
    waiter.release()
    finish_background()
    note = f"lock1.published.{published}"
    assert lock_ids(storage) == ["lock1.acquired", note, "lock2.acquired", "lock2.released"]
    assert collectable(storage, scan(storage), 2) == ([acquired_path(1)], [f"{LOCK_DIR}/{note}"])


@pytest.mark.usefixtures("every_taker_confirms")
def test_a_waiter_keeps_the_notes_it_saw_after_their_lock_files_were_collected(storage: Storage) -> None:
    """Holders collect old lock files every few turns. A writer that saw a turn's note on one of its tries
    while it waited still knows, once it holds the lock, what that turn published: nine turns went by
    here, and the files of the first four were gone before it took the lock."""

    def published(n: int) -> str:
        return f"{20261126000000000 + 2 * n}_{20261126000000001 + 2 * n}.commit"

    def turn_of(n: int) -> FileSystemLock:
        lock = fs_lock(storage, LockHolder(owner=f"writer-{n}"))
        lock.acquire(timeout=5)
        lock.note_published(published(n))
        return lock

    holding = turn_of(1)
    waiter = fs_lock(storage)
    noted = waiter.turn()
    assert noted == 0  # lock1 is held
    holding.release()
    holding = turn_of(2)

    # On each of the waiter's tries that finds the lock held (and a note), the others take some turns:
    # 3-4, 5-6, then 7-9 (lock8's holder collects ids 1..4); on the fourth, the last holder goes.
    batches = iter([range(3, 5), range(5, 7), range(7, 10)])

    def others_take_turns(notes: object, waiting: bool) -> None:
        nonlocal holding
        batch = next(batches, None)
        if batch is None:
            holding.release()
        for n in batch or ():
            holding.release()
            holding = turn_of(n)

    waiter.on_published = others_take_turns
    waiter.acquire(timeout=10)
    assert waiter.lock_id == 10
    collected = {
        name for i in range(1, 5) for name in (f"lock{i}.acquired", f"lock{i}.published.{published(i)}")
    }
    wait_until(lambda: not collected & set(lock_ids(storage)), "the files of ids 1-4 to go")
    assert waiter.published_since(noted) == [published(n) for n in range(1, 10)]
    waiter.release()


def test_the_turns_since_a_noted_one_tell_what_they_published(storage: Storage) -> None:
    """Lock ids number the turns. A writer that noted a turn learns, once it holds the lock, what every
    turn since published — if each one noted it (a file, or nothing) — and learns nothing (None) as soon
    as one turn did not (a table service's)."""
    published = "20261126000000001_20261126000000002.commit"
    first = fs_lock(storage)
    turn = first.turn()
    assert turn == 0 and first.acquire_next(turn)  # the very next turn, with one try
    assert first.lock_id == 1 and first.published_since(turn) == []
    first.note_published(published)
    first.release()

    noted = fs_lock(storage)
    later = noted.turn()
    assert later == 1 and not fs_lock(storage).acquire_next(later)  # only who noted a free lock tries
    loser = fs_lock(storage)
    loser.acquire(timeout=5)
    loser.note_published(None)  # lost a conflict: published nothing
    loser.release()
    assert not noted.acquire_next(later)  # lock2 was taken meanwhile
    noted.acquire(timeout=5)
    assert noted.lock_id == 3
    assert noted.published_since(turn) == [published] and noted.published_since(later) == []
    noted.release()

    with fs_lock(storage, LockHolder(owner="cleaner")):  # lock4: a service's turn notes nothing
        pass
    last = fs_lock(storage)
    last.acquire(timeout=5)
    assert last.published_since(turn) is None and last.published_since(4) == []
    last.release()
    assert {name for name in storage.names(LOCK_DIR) if ".published." in name} == {
        f"lock1.published.{published}",
        "lock2.published.nothing",
    }


def test_a_turn_that_published_waiters_commits_counts_as_noted_once_all_its_notes_show() -> None:
    """A holder that published, after its own commit, those of waiters queued behind it (group commit)
    notes each; its own note, which releases the lock, says how many others there are. A listing that
    shows fewer counts the turn as ended but not noted (later holders list the timeline)."""
    own = "20261129000000001_20261129000000005.commit"
    first, second = "20261129000000002_20261129000000006.commit", "20261129000000003_20261129000000007.commit"
    names = {"lock3.acquired", f"lock3.published+2.{own}", f"lock3.grouped.{second}"}
    partial_view = lock_files.files_named(frozenset(names))
    assert partial_view.released == {3} and partial_view.published == {} and not partial_view.is_held(3)
    whole = lock_files.files_named(frozenset(names | {f"lock3.grouped.{first}"}))
    assert whole.published == {3: (own, first, second)}
    assert whole.noting("20261129000000002") == first and whole.noting("20261129000000004") is None
    notes = {f"{LOCK_DIR}/{name}" for name in names - {"lock3.acquired"}} | {
        f"{LOCK_DIR}/lock3.grouped.{first}"
    }
    acquired, others = lock_files.collectable(Storage.for_uri("memory://groups"), whole, 4)
    assert acquired == [f"{LOCK_DIR}/lock3.acquired"] and set(others) == notes


def test_a_waiters_note_begun_beside_its_commit_counts_only_once_the_turn_is_noted(storage: Storage) -> None:
    """A holder begins each waiter's note beside the create of that waiter's completed file, so a note may
    show before the file exists, or stay behind when the create failed. Such a note tells nobody anything
    until the turn's own note, made once every file exists, shows and counts it; a turn released without
    that note published nothing anyone may rely on."""
    own, first = "20261201000000001_20261201000000005.commit", "20261201000000002_20261201000000006.commit"
    failed = fs_lock(storage, LockHolder(owner="writer-1"))
    failed.acquire(timeout=5)
    failed.note_grouped(first)
    finish_background()
    seen = lock_files.files_named(frozenset(storage.names(LOCK_DIR)))
    assert f"lock1.grouped.{first}" in storage.names(LOCK_DIR)
    assert seen.is_held(1) and seen.published == {} and seen.noting("20261201000000002") is None
    failed.release()  # its create failed: the turn ends without a note
    finish_background()
    seen = lock_files.files_named(frozenset(storage.names(LOCK_DIR)))
    assert seen.released == {1} and seen.published == {} and seen.noting("20261201000000002") is None

    holder = fs_lock(storage, LockHolder(owner="writer-3"))
    holder.acquire(timeout=5)
    holder.note_grouped(first)
    holder.note_published(own, [first])
    holder.release()
    finish_background()
    seen = lock_files.files_named(frozenset(storage.names(LOCK_DIR)))
    assert seen.published == {2: (own, first)} and seen.noting("20261201000000002") == first
    later = fs_lock(storage)
    later.acquire(timeout=5)
    assert later.published_since(0) is None and later.published_since(1) == [own, first]
    later.release()
    finish_background()
