"""Helpers of the daemon tests (``tests/test_daemon.py``): tables on each backend, in-process daemons,
writer and daemon processes, and waiting for conditions with a bounded deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.service import Daemon
from cowrite.format import config as keys
from cowrite.format.fs_view import list_base_files
from cowrite.format.table import Table
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.locks.lock_files import read_release
from cowrite.protocol.transaction import WriteOptions
from cowrite.storage.backend import Storage
from support import TESTS, wait_until

from . import hudi_rs, writer_process

WORKER = Path(writer_process.__file__)

POLL = 0.1  # the daemon's poll interval in these tests (S3: 0.25 s; moto answers one request at a time)
WAIT = 30.0  # bound of any single wait; a healthy run needs a small fraction of it
QUICK_LOCK = {
    keys.LOCK_RETRY_WAIT_MS.key: "5",
    keys.LOCK_MAX_RETRY_WAIT_MS.key: "50",
}


# -- tables ------------------------------------------------------------------------------------------


@dataclass
class Target:
    """A table on one backend, and how this process, writer processes and hudi-rs reach it."""

    uri: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # AWS variables for processes (and the daemon)
    # Writers in the test process renew beside daemons and servers on two cores: at 200 ms a renewal late
    # by 0.3 s lost a healthy writer its lease. A tolerance of 1 s keeps the waits for expiry short.
    interval_ms: int = 500
    misses: int = 2
    slack: float = 1.0  # what a loaded machine may add to a deadline, on top of the protocol's own bound
    poll: float = POLL

    @property
    def settings(self) -> dict[str, str]:
        return {
            keys.HEARTBEAT_INTERVAL_MS.key: str(self.interval_ms),
            keys.HEARTBEAT_TOLERABLE_MISSES.key: str(self.misses),
            # The default margin (one interval) leaves a healthy writer with 2 misses no slack: just before
            # each renewal its lease is interval - (renewal time) long, and a commit then is refused.
            keys.LEASE_SAFETY_MARGIN_MS.key: str(self.interval_ms // 2),
            **QUICK_LOCK,
        }

    @property
    def cli_options(self) -> list[str]:
        """:attr:`settings` as options of ``cowrite`` and of the writer processes (``-o KEY=VALUE``)."""
        return [arg for key, value in self.settings.items() for arg in ("-o", f"{key}={value}")]

    @property
    def policy(self) -> HeartbeatPolicy:
        return HeartbeatPolicy(self.interval_ms / 1000, self.misses)

    @property
    def tolerance(self) -> float:
        return self.policy.tolerance

    def create(self) -> Table:
        return Table.create(
            self.uri,
            name="orders",
            record_key_fields=["id"],
            partition_fields=["part"],
            ordering_fields=["ts"],
            storage_options=self.storage_options,
        )

    def table(self) -> Table:
        table = Table.open(Storage.for_uri(self.uri, **self.storage_options))
        return Table(table.storage, table.config.with_values(self.settings))

    def serving(self, **settings: Any) -> Any:
        return serving(self.entry(), poll=self.poll, **settings)

    def entry(self, **kwargs: Any) -> TableEntry:
        return TableEntry(self.uri, settings=self.settings, **kwargs)




def writer(table: Table) -> LocalWriter:
    return LocalWriter(table, WriteOptions(config=table.config))


Row = tuple[str, str, str, str]  # id, part, value, _hoodie_commit_time


def snapshot(target: Target) -> list[Row]:
    """The snapshot as cowrite reads it, checked to equal what hudi-rs reads (where it can: not memory)."""
    mine = read.snapshot(target.table(), with_meta=True)
    found = sorted(
        zip(
            *(mine.column(c).to_pylist() for c in ("id", "part", "value", "_hoodie_commit_time")), strict=True
        )
    )
    if target.uri.startswith("memory://"):
        return found
    theirs = hudi_rs.snapshot(target.uri, target.storage_options, with_meta=True)
    assert sorted((r["id"], r["part"], r["value"], r["_hoodie_commit_time"]) for r in theirs) == found
    return found


def data_files(table: Table) -> set[str]:
    return {b.path for b in list_base_files(table)}


# -- waiting and daemons -----------------------------------------------------------------------------


@contextmanager
def serving(
    *entries: TableEntry, http: bool = False, poll: float = POLL, **settings: Any
) -> Iterator[Daemon]:
    """An in-process daemon on a fresh registry, every table polled once, stopped (drained) at the end.

    Waiting for the first poll matters: what that poll finds is history, not counted as events, so a
    write made before it would be missed by the counters a test then reads.
    """
    config = DaemonConfig(tables=entries, port=0, poll_interval=poll, **settings)
    daemon = Daemon(config, registry=CollectorRegistry())
    daemon.start(serve_http=http)
    try:
        wait_until(lambda: daemon.ready, "the first poll of every table")
        yield daemon
    finally:
        daemon.stop()


def sample(daemon: Daemon, name: str, **labels: str) -> float | None:
    return daemon.registry.get_sample_value(name, labels)


def count(daemon: Daemon, name: str, **labels: str) -> float:
    return sample(daemon, name, **labels) or 0.0


def polls_later(daemon: Daemon, polls: int) -> None:
    """Wait until every table was polled ``polls`` more times.

    A poll's counters and gauges are complete only when it ends, after the effects it counts are on
    storage: a test that saw an effect waits here (``polls=1`` ends the poll that made it) before it
    reads what the daemon counted.
    """
    start = [service.polls for service in daemon.services]
    wait_until(
        lambda: all(s.polls >= n + polls for s, n in zip(daemon.services, start, strict=True)),
        f"{polls} more polls",
    )


# -- processes ---------------------------------------------------------------------------------------


@dataclass
class Processes:
    """Processes one test started; whatever still runs at the end is killed."""

    directory: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, command: list[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        with open(self.directory / f"{name}.stderr", "wb") as stderr:
            process = subprocess.Popen(
                command,
                env={**os.environ, **env, "PYTHONPATH": str(TESTS)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self.started.append(process)
        return process

    def stderr(self, name: str) -> str:
        return (self.directory / f"{name}.stderr").read_text(errors="replace")

    def writer(
        self,
        target: Target,
        groups: list[dict[str, Any]] | Path,
        name: str,
        pause_at: str,
        release_by_file: bool = False,
        more: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """A writer process (``writer_process``) of ``groups`` (a JSON spec, or a parquet file of rows)
        that pauses at ``pause_at``; ``more``: further options of it."""
        batch = ["--batch-file", str(groups)] if isinstance(groups, Path) else ["--batch", json.dumps(groups)]
        command = [
            sys.executable,
            str(WORKER),
            target.uri,
            *batch,
            "--lock-provider",
            "filesystem",
            "--storage-options",
            json.dumps(target.storage_options),
            "--pause-at",
            pause_at,
            "--ready-file",
            str(self.directory / f"{name}.ready"),
            "--pause-timeout",
            str(2 * WAIT),
            "--result",
            str(self.directory / f"{name}.result"),
        ]
        command += target.cli_options
        if release_by_file:
            command += ["--go-file", str(self.directory / f"{name}.go")]
        return self.start([*command, *more], target.env, name)

    def paused(self, process: subprocess.Popen[bytes], name: str) -> dict[str, Any]:
        """Wait for a writer to reach its pause; its pid, step and instant."""
        ready = self.directory / f"{name}.ready"

        def arrived() -> bool:
            assert process.poll() is None, f"{name} exited {process.returncode}:\n{self.stderr(name)}"
            return ready.exists()

        wait_until(arrived, f"{name} to pause")
        return dict(json.loads(ready.read_text()))

    def cleanup(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=WAIT)


def kill(process: subprocess.Popen[bytes]) -> float:
    """kill -9; the moment it died."""
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=WAIT)
    assert process.returncode == -signal.SIGKILL
    return time.monotonic()


def released(storage: Storage, lock_id: int) -> dict[str, object] | None:
    try:
        return read_release(storage, lock_id)
    except FileNotFoundError:
        return None


def get(port: int, path: str, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, body, kind = response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        status, body, kind = error.code, error.read(), error.headers["Content-Type"]
        error.close()
    return status, (json.loads(body) if kind == "application/json" else body.decode())


def port_of(daemon: Daemon) -> int:
    return int(daemon.http.server_address[1])  # type: ignore[attr-defined]


def daemon_config(tmp_path: Path, tables: list[dict[str, Any]]) -> Path:
    lines = ["[server]", "port = 0", "[follow]", f"poll_interval_seconds = {POLL}", ""]
    for table in tables:
        lines.append("[[tables]]")
        lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in table.items()]
        lines.append("")
    path = tmp_path / f"daemon-{uuid.uuid4().hex[:6]}.toml"
    path.write_text("\n".join(lines))
    return path


class DaemonProcess:
    """``python -m cowrite daemon --config ...``: its JSON log lines and its HTTP port (from the log)."""

    def __init__(
        self, processes: Processes, config: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        self.processes, self.name = processes, name
        self.process = processes.start(
            [sys.executable, "-m", "cowrite", "daemon", "--config", str(config)], env or {}, name
        )

    def logs(self) -> list[dict[str, Any]]:
        """Every line on stderr, each parsed as a JSON object (a line that is not one fails the test)."""
        return [json.loads(line) for line in self.processes.stderr(self.name).splitlines() if line.strip()]

    @property
    def port(self) -> int:
        def announced() -> int | None:
            assert self.process.poll() is None, self.processes.stderr(self.name)
            for line in self.logs():
                found = re.fullmatch(r"http on 127\.0\.0\.1:(\d+)", line["event"])
                if found:
                    return int(found.group(1))
            return None

        return int(wait_until(announced, f"{self.name} to serve"))

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text = get(self.port, "/metrics")
        assert status == 200
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def terminate(self) -> float:
        """SIGTERM; how long it took to exit (0 is required)."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(WAIT) == 0, self.processes.stderr(self.name)
        return time.monotonic() - started
