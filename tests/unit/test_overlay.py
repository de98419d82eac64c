"""Incremental consumers across interleaved writers: every committed record exactly once, in every pull mode.

Writers here commit out of requested-time order: a slow writer begins first, writes its files at once, and
commits only when the test releases it, after writers that began later. Consumers pull in the three modes of
:func:`cowrite.local.read.pull` — by completion time from the timeline, through the daemon's END_COMMIT_TIME
overlay, and by requested time fenced by the oldest pending write — at every point of the schedule. Each
pull must return exactly the rows its commits wrote (copied rows keep their older commit time and are not
returned again), no commit may be returned twice, and the union of all pulls must equal the snapshot.
A consumer that checkpoints by requested time without the fence is the control: it loses the slow commits.
"""

from __future__ import annotations

import json
import random
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from support.daemon import WAIT, wait_until

from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.service import Daemon
from cowrite.format.instant import Instant
from cowrite.format.overlay import head, read_since
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.local import read
from cowrite.local.read import PullMode
from cowrite.local.writer import LocalWriter
from cowrite.steps import Step, observe

MODES = list(PullMode)


# -- writers -----------------------------------------------------------------------------------------


def batch(part: str, ids: list[str]) -> pa.Table:
    return pa.table({"id": ids, "part": [part] * len(ids), "value": [f"{part}:{i}" for i in ids]})


class SlowWriters:
    """Writers in threads that plan their write at once, and write and commit it when released.

    Each waits for its gate once its plan exists (:attr:`at_step` observes ``Step.PLANNED`` in the slow
    writers' threads only), before any file and holding no lock (on S3 the last file is written beside
    taking the lock); its heartbeat keeps running meanwhile, as a long backfill's would.
    """

    def __init__(self) -> None:
        self.gates: dict[int, tuple[threading.Event, list[str]]] = {}

    def at_step(self, step: Step, instant: str | None, details: dict[str, Any]) -> None:
        gate = self.gates.get(threading.get_ident())
        if step is Step.PLANNED and gate is not None and instant is not None:
            gate[1].append(instant)  # planned, nothing written
            assert gate[0].wait(WAIT), "a slow writer was never released"

    def start(self, table: Table, data: pa.Table) -> Slow:
        slow = Slow(threading.Event())

        def run() -> None:
            self.gates[threading.get_ident()] = (slow.gate, slow.reached)
            try:
                slow.done = LocalWriter(table).insert(data)
            except BaseException as exc:  # re-raised by release()
                slow.error = exc

        slow.thread = threading.Thread(target=run, name="slow-writer")
        slow.thread.start()
        wait_until(lambda: slow.reached or slow.error, "the slow writer to plan its write")
        if slow.error:
            raise slow.error
        return slow


@dataclass
class Slow:
    gate: threading.Event
    reached: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None
    done: Instant | None = None
    error: BaseException | None = None

    @property
    def instant_time(self) -> str:
        return self.reached[0]

    def release(self) -> Instant:
        self.gate.set()
        assert self.thread is not None
        self.thread.join(WAIT)
        if self.error:
            raise self.error
        assert self.done is not None
        return self.done


# -- consumers ---------------------------------------------------------------------------------------


@dataclass
class Consumer:
    """An incremental consumer in one mode: its checkpoint and every pull it made."""

    mode: PullMode
    checkpoint: str | None = None
    commits: list[str] = field(default_factory=list)  # requested times, in the order pulled
    rows: list[tuple[str, str]] = field(default_factory=list)  # (id, _hoodie_commit_time)

    def pull(self, table: Table, written: dict[str, set[str]]) -> None:
        got = read.pull(table, self.checkpoint, self.mode, with_meta=True)
        pairs = (
            list(
                zip(
                    got.rows.column("id").to_pylist(),
                    got.rows.column("_hoodie_commit_time").to_pylist(),
                    strict=True,
                )
            )
            if got.rows.num_rows
            else []
        )
        # exactly the rows the pulled commits wrote: none of theirs missing, no copied older row
        assert sorted(pairs) == sorted((key, c) for c in got.commits for key in written[c]), self.mode
        self.commits += got.commits
        self.rows += pairs
        self.checkpoint = got.checkpoint


@dataclass
class RequestedTimeConsumer:
    """The control: checkpoints by requested time, with no fence (what a single-writer reader would do)."""

    checkpoint: str | None = None
    commits: list[str] = field(default_factory=list)

    def pull(self, table: Table) -> None:
        new = [
            i.requested_time
            for i in table.timeline().data_commits()
            if self.checkpoint is None or i.requested_time > self.checkpoint
        ]
        self.commits += new
        self.checkpoint = max(new, default=self.checkpoint)


@dataclass
class Scenario:
    table: Table
    daemon: Daemon
    written: dict[str, set[str]] = field(default_factory=dict)  # requested time -> keys it wrote
    consumers: list[Consumer] = field(default_factory=lambda: [Consumer(mode) for mode in MODES])
    control: RequestedTimeConsumer = field(default_factory=RequestedTimeConsumer)

    def commit(self, part: str, ids: list[str]) -> Instant:
        done = LocalWriter(self.table).insert(batch(part, ids))
        self.written[done.requested_time] = set(ids)
        return done

    def finish(self, slow: Slow, ids: list[str]) -> Instant:
        done = slow.release()
        self.written[done.requested_time] = set(ids)
        return done

    def pull(self, consumers: list[Consumer] | None = None) -> None:
        for consumer in consumers or self.consumers:
            consumer.pull(self.table, self.written)
        self.control.pull(self.table)

    def caught_up(self) -> None:
        """Wait until the daemon's overlay shows the whole timeline."""
        latest = self.table.timeline().latest_completion_time
        wait_until(
            lambda: (found := head(self.table.storage)) is not None and found.watermark == latest,
            "the overlay to catch up",
        )

    def check(self) -> None:
        """Every consumer saw every commit and every record exactly once; the union is the snapshot."""
        self.caught_up()
        self.pull()
        snapshot = read.snapshot(self.table, with_meta=True)
        expected = sorted(
            zip(
                snapshot.column("id").to_pylist(),
                snapshot.column("_hoodie_commit_time").to_pylist(),
                strict=True,
            )
        )
        assert expected == sorted((key, c) for c, keys in self.written.items() for key in keys)
        for consumer in self.consumers:
            assert Counter(consumer.commits) == Counter(set(self.written)), consumer.mode  # each once
            assert sorted(consumer.rows) == expected, consumer.mode  # no duplicates, no misses
        overlay = read_since(self.table.storage, None)
        timeline = self.table.timeline()
        assert overlay is not None
        assert [(e.requested_time, e.completion_time) for e in overlay.entries] == [
            (i.requested_time, i.completion_time) for i in timeline.data_commits().in_completion_order()
        ]
        assert overlay.watermark == timeline.latest_completion_time
        for entry in overlay.entries:
            instant = timeline.get(entry.requested_time)
            assert instant is not None
            stats = self.table.commit_metadata(instant).write_stats
            assert entry.written == tuple((s.partition_path, s.file_id, s.path) for s in stats)


@pytest.fixture
def table(
    storage_uri: str,
    storage_options: dict[str, Any],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> Table:
    if storage_uri.startswith("s3://"):  # the daemon finds S3 through the AWS variables, as deployed
        for name, value in request.getfixturevalue("s3_server").env().items():
            monkeypatch.setenv(name, value)
    return Table.create(
        storage_uri,
        name="events",
        record_key_fields=["id"],
        partition_fields=["part"],
        storage_options=storage_options,
    )


@pytest.fixture
def scenario(table: Table) -> Iterator[Scenario]:
    daemon = Daemon(
        DaemonConfig(tables=(TableEntry(table.uri),), port=0, poll_interval=0.1), registry=CollectorRegistry()
    )
    daemon.start(serve_http=True)
    try:
        wait_until(lambda: head(table.storage) is not None, "the first overlay")
        yield Scenario(table, daemon)
    finally:
        daemon.stop()


# -- scenarios ---------------------------------------------------------------------------------------


@pytest.fixture
def slow_writers() -> Iterator[SlowWriters]:
    writers = SlowWriters()
    with observe(writers.at_step):
        yield writers


def test_slow_writers_that_commit_last_are_pulled_once_in_every_mode(
    scenario: Scenario, slow_writers: SlowWriters
) -> None:
    table = scenario.table
    seed = scenario.commit("a", ["a1", "a2"])
    scenario.pull()
    first_slow = slow_writers.start(table, batch("s", ["s1", "s2"]))
    fast = scenario.commit("b", ["b1"])
    scenario.pull()
    fenced = next(c for c in scenario.consumers if c.mode is PullMode.FENCE)
    assert fenced.commits == [seed.requested_time]  # nothing past the pending write's requested time
    timed = next(c for c in scenario.consumers if c.mode is PullMode.COMPLETION_TIME)
    assert timed.commits == [seed.requested_time, fast.requested_time]

    copy = scenario.commit("a", ["a3"])  # into the seed's file group: a1, a2 are copied with the seed's time
    second_slow = slow_writers.start(table, batch("t", ["t1"]))
    scenario.caught_up()
    scenario.pull()
    late = scenario.finish(first_slow, ["s1", "s2"])
    assert late.requested_time < fast.requested_time < copy.requested_time < (late.completion_time or "")
    scenario.commit("b", ["b2"])
    scenario.pull()
    scenario.finish(second_slow, ["t1"])
    scenario.commit("s", ["s3"])  # into the first slow writer's file group
    scenario.check()
    # the control: checkpointing by requested time, it moved past both slow writers while they were pending
    assert set(scenario.written) - set(scenario.control.commits) == {
        first_slow.instant_time,
        second_slow.instant_time,
    }


@pytest.mark.parametrize(
    ("storage_uri", "seed"),
    [("local", 7), ("local", 11), ("local", 23), ("memory", 7), ("memory", 11), ("memory", 23)],
    indirect=["storage_uri"],  # S3 (moto answers one request at a time) runs the scripted schedule above
)
def test_random_interleavings_lose_and_repeat_nothing(
    scenario: Scenario, slow_writers: SlowWriters, seed: int
) -> None:
    chance = random.Random(seed)
    parts = ["p0", "p1", "p2", "p3", "p4"]
    busy: dict[str, tuple[Slow, list[str]]] = {}  # partition -> its pending slow writer (disjoint groups)
    serial = 0
    for _ in range(24):
        free = [p for p in parts if p not in busy]
        step = chance.choice(["begin", "release", "commit", "pull", "pull"])
        serial += 1
        ids = [f"k{serial}-{n}" for n in range(chance.randint(1, 3))]
        if step == "begin" and free:
            part = chance.choice(free)
            busy[part] = (slow_writers.start(scenario.table, batch(part, ids)), ids)
        elif step == "release" and busy:
            part = chance.choice(sorted(busy))
            slow, keys = busy.pop(part)
            scenario.finish(slow, keys)
        elif step == "commit" and free:
            scenario.commit(chance.choice(free), ids)
        else:
            scenario.pull([c for c in scenario.consumers if chance.random() < 0.7])
    for part in sorted(busy):
        slow, keys = busy.pop(part)
        scenario.finish(slow, keys)
    scenario.check()
    completed = scenario.table.timeline().data_commits()
    assert [i.requested_time for i in completed.in_completion_order()] != [
        i.requested_time for i in completed
    ]


@pytest.mark.parametrize("storage_uri", ["local"], indirect=True)  # HTTP does not depend on the backend
def test_the_overlay_is_served_over_http(scenario: Scenario) -> None:
    first = scenario.commit("a", ["a1"])
    second = scenario.commit("b", ["b1"])
    scenario.caught_up()
    port = scenario.daemon.http.server_address[1]  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}/api/tables/events/overlay?since={first.completion_time}"
    with urllib.request.urlopen(url, timeout=10) as response:
        served = json.loads(response.read())
    [stat] = scenario.table.commit_metadata(second).write_stats
    assert served == {
        "watermark": second.completion_time,
        "entries": [
            {
                "requested_time": second.requested_time,
                "completion_time": second.completion_time,
                "action": "commit",
                "written": [["b", stat.file_id, stat.path]],
                "replaced": [],
            }
        ],
    }


@pytest.mark.parametrize("mode", [PullMode.COMPLETION_TIME, PullMode.FENCE])
def test_a_listing_that_misses_an_earlier_commit_does_not_move_the_checkpoint_past_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, mode: PullMode
) -> None:
    """A listing taken while commits land can show a later commit without an earlier one (readdir,
    paged S3 listings). The pull looks twice, so the checkpoint never passes the missing commit."""
    table = Table.create(str(tmp_path / "t"), name="t", record_key_fields=["id"], partition_fields=["p"])
    writer = LocalWriter(table)
    first = writer.insert(pa.table({"id": ["a"], "p": ["x"]}))
    second = writer.insert(pa.table({"id": ["b"], "p": ["y"]}))
    full = table.timeline()
    torn = Timeline(i for i in full if i.requested_time != first.requested_time)
    looks = iter([torn, full])
    monkeypatch.setattr(table, "timeline", lambda: next(looks))
    pulled = read.pull(table, None, mode)
    assert pulled.commits == (first.requested_time, second.requested_time)
    assert sorted(pulled.rows.column("id").to_pylist()) == ["a", "b"]


def test_a_fenced_pull_stops_at_the_newest_commit_its_first_look_showed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fenced pull reads no commit requested after the newest completed instant of its first look: every
    instant requested before that one was claimed before the look ended, so the second look shows it and
    the fence holds back what follows it while it is pending; after it, a claim of an earlier time may
    still come. Such a commit is the next pull's."""
    table = Table.create(str(tmp_path / "t"), name="t", record_key_fields=["id"], partition_fields=["p"])
    writer = LocalWriter(table)
    first = writer.insert(pa.table({"id": ["a"], "p": ["x"]}))
    first_look = table.timeline()
    second = writer.insert(pa.table({"id": ["b"], "p": ["y"]}))
    looks = iter([first_look, table.timeline()])
    with monkeypatch.context() as patched:
        patched.setattr(table, "timeline", lambda: next(looks))
        pulled = read.pull(table, None, PullMode.FENCE)
    assert (pulled.commits, pulled.checkpoint) == ((first.requested_time,), first.requested_time)
    assert pulled.rows.column("id").to_pylist() == ["a"]
    later = read.pull(table, pulled.checkpoint, PullMode.FENCE)
    assert (later.commits, later.checkpoint) == ((second.requested_time,), second.requested_time)
    assert later.rows.column("id").to_pylist() == ["b"]
