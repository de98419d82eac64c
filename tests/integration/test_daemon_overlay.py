"""The END_COMMIT_TIME log across daemon processes: killed with SIGKILL at any moment while writers
commit, a daemon restarted from its log loses nothing and logs nothing twice; a damaged log is rebuilt from
the timeline with one warning; the single file of earlier versions is replaced.

Daemons are ``python -m cowrite daemon`` processes on local tables; writers commit from this process.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.daemon import POLL, WAIT, DaemonProcess, Processes, Target, kill, wait_until, writer
from support.tables import rows

from cowrite.errors import CorruptTimelineError
from cowrite.format.overlay import LEGACY_OVERLAY_PATH, OVERLAY_DIR, Kind, LogFile, head, read_since
from cowrite.format.table import Table

REBUILDING = "rebuilding the END_COMMIT_TIME overlay"


def config(tmp_path: Path, target: Target, snapshot_every: int) -> Path:
    path = tmp_path / f"daemon-{time.monotonic_ns()}.toml"
    settings = "".join(f'"{k}" = "{v}"\n' for k, v in target.settings.items())
    path.write_text(
        f"[server]\nport = 0\n[follow]\npoll_interval_seconds = {POLL}\n"
        f"[overlay]\nsnapshot_every = {snapshot_every}\n"
        f'[[tables]]\nuri = "{target.uri}"\nname = "orders"\n{settings}'
    )
    return path


def caught_up(table: Table) -> bool:
    """Whether the log's watermark is the timeline's newest completion (not while it is damaged)."""
    try:
        found = head(table.storage)
    except CorruptTimelineError:
        return False
    return found is not None and found.watermark == table.timeline().latest_completion_time


def logged_exactly_the_timeline(table: Table) -> None:
    """Every data commit of the timeline in the log once, in completion order, and nothing else."""
    read = read_since(table.storage, None)
    assert read is not None
    assert [(e.requested_time, e.completion_time) for e in read.entries] == [
        (i.requested_time, i.completion_time) for i in table.timeline().data_commits().in_completion_order()
    ]
    for entry in read.entries:
        instant = table.timeline().get(entry.requested_time)
        assert instant is not None
        stats = table.commit_metadata(instant).write_stats
        assert entry.written == tuple((s.partition_path, s.file_id, s.path) for s in stats)


def log_files(table: Table) -> list[LogFile]:
    return sorted(
        (f for f in map(LogFile.parse, table.storage.names(OVERLAY_DIR)) if f), key=lambda f: f.sequence
    )


def one_start(files: list[LogFile]) -> bool:
    """Whether the log's files are one snapshot and the segments after it."""
    return [f.kind for f in files] == [Kind.SNAPSHOT] + [Kind.SEGMENT] * (len(files) - 1)


def warnings(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return [line for line in daemon.logs() if REBUILDING in str(line["event"])]


def test_a_daemon_killed_while_writers_commit_resumes_its_log_and_loses_nothing(
    tmp_path: Path, processes: Processes
) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    table = target.table()
    writer(table).insert(rows(["k0"]))
    stop = threading.Event()
    committed: list[str] = []

    def commit_steadily() -> None:
        while not stop.is_set():
            n = len(committed) + 1
            committed.append(writer(table).insert(rows([f"k{n}"], part=f"p{n % 5}")).requested_time)
            time.sleep(0.02)

    committer = threading.Thread(target=commit_steadily)
    committer.start()
    chance = random.Random(17)
    daemons, heads = [], []
    try:
        for run in range(4):
            daemon = DaemonProcess(processes, config(tmp_path, target, snapshot_every=4), f"daemon{run}")
            daemons.append(daemon)
            assert daemon.port  # serving
            # a few polls, then killed at a moment of chance: in a poll, an append, a compaction, or idle
            time.sleep(chance.uniform(3 * POLL, 8 * POLL))
            kill(daemon.process)
            heads.append(log_files(table)[-1].sequence)
    finally:
        stop.set()
        committer.join(WAIT)
    last = DaemonProcess(processes, config(tmp_path, target, snapshot_every=4), "last")
    daemons.append(last)
    wait_until(lambda: caught_up(table), "the restarted daemon's log to catch up")
    logged_exactly_the_timeline(table)
    assert len(committed) >= 10
    # each restart continued the log the killed daemon left (sequence numbers never start over), and
    # none found it damaged
    heads.append(log_files(table)[-1].sequence)
    assert heads == sorted(heads) and heads[-1] > heads[0]
    assert all(not warnings(d) for d in daemons)
    assert last.terminate() < 5.0


@pytest.mark.parametrize("damage", ["garbage in a segment", "a segment missing", "the file of old versions"])
def test_a_damaged_log_is_rebuilt_from_the_timeline_with_one_warning(
    tmp_path: Path, processes: Processes, damage: str
) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    table = target.table()
    first = DaemonProcess(processes, config(tmp_path, target, snapshot_every=100), "first")
    for n in range(4):
        writer(table).insert(rows([f"k{n}"], part=f"p{n}"))
        wait_until(lambda: caught_up(table), "the log to catch up")
    assert first.terminate() < 5.0
    files = log_files(table)
    assert one_start(files) and len(files) >= 4
    if damage == "garbage in a segment":
        table.storage.write(files[-1].path, b'{"entries": [{"requested_time": 7}]}')
    elif damage == "a segment missing":
        table.storage.delete(files[1].path)
    else:
        for file in files:
            table.storage.delete(file.path)
        table.storage.write(LEGACY_OVERLAY_PATH, b'{"watermark": null, "fence": null, "entries": []}')
    writer(table).insert(rows(["late"], part="p9"))

    second = DaemonProcess(processes, config(tmp_path, target, snapshot_every=100), "second")

    # the new snapshot is written first, and the files before it are deleted after it
    wait_until(lambda: caught_up(table) and one_start(log_files(table)), "the rebuilt log alone")
    logged_exactly_the_timeline(table)
    rebuilt = log_files(table)
    assert not table.storage.exists(LEGACY_OVERLAY_PATH)
    assert second.terminate() < 5.0
    told = warnings(second)
    if damage == "the file of old versions":  # nothing was damaged: there was no log yet
        assert told == [] and rebuilt[0].sequence == 0
    else:  # a new start after every file there was, which are gone
        assert [line["level"] for line in told] == ["warning"]
        assert rebuilt[0].sequence == files[-1].sequence + 1
