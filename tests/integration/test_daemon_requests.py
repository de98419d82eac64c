"""What a poll of an S3 table costs the daemon, counted request by request at a proxy in a process of its
own between the daemon and the S3 server (``bench.proxy.ProxyProcess``): what changed, never the history.

The tables' history is written straight to the S3 server, past the proxy; writers commit the same way.
Each poll runs in this process (``TableService.poll``), which reaches S3 through the AWS variables, as a
deployed daemon does.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry
from support.request_counts import ProxyProcess, what
from support.servers import S3Server
from support.tables import rows

from cowrite.daemon import service as daemon_service
from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.metrics import DaemonMetrics
from cowrite.daemon.service import TableService
from cowrite.engine.schema import avro_schema
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, State, from_millis
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.protocol.txn import CommittedTxns

INTERVAL_MS = 1000  # the tables' heartbeat interval: how often an idle poll also looks at the locks


class Clock:
    """The daemon's ``time`` module, with a monotonic clock that moves only when told: whether a poll looks
    at the lock directory depends on the time since the last look, and a slow machine must not decide it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def history(s3_server: S3Server, table: Table, commits: int) -> None:
    """``commits`` completed commits, a day old, stored straight into the S3 server in one request
    (completed files only: what the timeline shows of an instant once it completed). Each records the
    schema of the rows the tests write and the applications' versions (none), as a commit of cowrite's
    does: a writer reads the newest commit for them and looks back no further."""
    start = int((time.time() - 86_400) * 1000)
    root = table.uri.removeprefix(f"s3://{s3_server.bucket}/")
    schema = avro_schema(rows(["k0"]).schema, table.name)
    files = {}
    for n in range(commits):
        requested, completed = from_millis(start + 10 * n), from_millis(start + 10 * n + 5)
        path = f"p0/f{n}-0_0-0-0_{requested}.parquet"
        stat = WriteStat(f"f{n}-0", path, "p0", "null", 1, 1, 0, 0, 10)
        metadata = CommitMetadata("insert", (stat,), schema=schema, extra=CommittedTxns().extra(None))
        instant = Instant(requested, Action.COMMIT, State.COMPLETED, completed)
        files[f"{root}/{table.instant_path(instant)}"] = metadata.to_bytes(Action.COMMIT)
    s3_server.load(s3_server.bucket, files)


def served(
    s3_server: S3Server,
    proxy: ProxyProcess,
    monkeypatch: pytest.MonkeyPatch,
    commits: int,
    clock: Clock | None = None,
) -> tuple[Table, TableService]:
    """A table with ``commits`` of history, and a table service that reaches it through the proxy, polled
    until it has looked at everything once; its clock is ``clock``, which stands still unless moved."""
    clock = clock or Clock()
    table = Table.create(
        s3_server.new_uri("requests"),
        name="t",
        record_key_fields=["id"],
        partition_fields=["part"],
        storage_options=s3_server.storage_options(),
    )
    history(s3_server, table, commits)
    for name, value in {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(daemon_service, "time", clock)
    config = DaemonConfig(
        tables=(TableEntry(table.uri, settings={keys.HEARTBEAT_INTERVAL_MS.key: str(INTERVAL_MS)}),), port=0
    )
    service = TableService(config.tables[0], config, DaemonMetrics(CollectorRegistry(), lambda: []))
    service.poll()
    service.poll()
    assert service.status.up, service.status.error
    return table, service


def poll(service: TableService, proxy: ProxyProcess) -> Counter[tuple[str, str]]:
    """The requests one poll made."""
    proxy.reset()
    service.poll()
    assert service.status.up, service.status.error
    return Counter(what(r) for r in proxy.reset())


def test_a_poll_costs_what_changed_whatever_the_history(
    s3_server: S3Server, proxy: ProxyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    after_commits: dict[int, list[Counter[tuple[str, str]]]] = {}
    for length in (100, 1000):
        table, service = served(s3_server, proxy, monkeypatch, length)
        for _ in range(5):  # idle: one listing of the timeline's tail
            assert poll(service, proxy) == {("LIST", "timeline"): 1}
        costs = []
        for k in (1, 3):
            for n in range(k):
                LocalWriter(table).insert(rows([f"k{n}"], part=f"p{n}"))
            costs.append(poll(service, proxy))
            assert poll(service, proxy) == {("LIST", "timeline"): 1}  # and idle again
        after_commits[length] = costs
        assert service.overlay is not None
        assert service.overlay.watermark == table.timeline().latest_completion_time
    # k commits: the timeline listed twice (the second look finds what completed before the first look's
    # newest), the lock directory once, the archive's new files, a read of each commit and of each lock
    # holder, one segment of the END_COMMIT_TIME log
    assert (
        after_commits[100]
        == after_commits[1000]
        == [
            {
                ("LIST", "timeline"): 2,
                ("LIST", "locks"): 1,
                ("LIST", "archive"): 1,
                ("GET", "timeline"): k,
                ("GET", "locks"): k,
                ("PUT", "overlay"): 1,
            }
            for k in (1, 3)
        ]
    )


def test_a_pending_write_costs_its_locks_and_heartbeats_once_per_poll(
    s3_server: S3Server, proxy: ProxyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, service = served(s3_server, proxy, monkeypatch, 10)
    pending = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    assert pending.heartbeat is not None
    pending.heartbeat.renew()
    # it appeared: the heartbeat read once (did its writer give up?), the log told the fence
    assert poll(service, proxy) == {
        ("LIST", "timeline"): 1,
        ("LIST", "locks"): 1,
        ("LIST", ".heartbeat"): 1,
        ("GET", ".heartbeat"): 1,
        ("PUT", "overlay"): 1,
    }
    assert service.state.fence == pending.instant_time
    for _ in range(3):  # while it is pending: someone may wait for the lock, and its lease counts
        assert poll(service, proxy) == {
            ("LIST", "timeline"): 1,
            ("LIST", "locks"): 1,
            ("LIST", ".heartbeat"): 1,
        }
    pending.heartbeat.stop()


def test_an_idle_table_looks_at_its_locks_once_per_heartbeat_interval(
    s3_server: S3Server, proxy: ProxyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody holds or waits for the lock, so it is looked at seldom: a holder that died then is expired
    an interval later than it could be, and a contender would expire it at once anyway."""
    clock = Clock()
    _, service = served(s3_server, proxy, monkeypatch, 10, clock)
    assert poll(service, proxy) == {("LIST", "timeline"): 1}
    clock.now += INTERVAL_MS / 1000 - 0.001
    assert poll(service, proxy) == {("LIST", "timeline"): 1}
    clock.now += 0.001
    assert poll(service, proxy) == {("LIST", "timeline"): 1, ("LIST", "locks"): 1}
    assert poll(service, proxy) == {("LIST", "timeline"): 1}
