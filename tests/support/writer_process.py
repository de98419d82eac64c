"""A cowrite writer in a process of its own, for the multi-process tests (``tests/test_concurrency.py``).

Run it from ``tests/`` as ``python -m support.writer_process URI --batch JSON [options]`` or directly as
``python tests/support/writer_process.py ...``. It writes the batch with
:class:`~cowrite.local.writer.LocalWriter` (one instant per round) and exits with the code of the CLI:
0 committed, 1 other error, 2 usage, 3 write conflict, 4 lock timeout, 5 lease lost, 6 commit state unknown,
and 9 when a pause ran out of time (the test that should have killed or released it is gone).

``--batch`` is JSON: a list of ``{"partition": str, "keys": [str, ...], "value": str, "ts": int}`` (or one
such object); each key becomes a row ``id=key, part=partition, ts, value``. With ``--rounds N`` the writer
commits N instants one after another, the keys of round ``r`` suffixed ``-r<r>``. ``--batch-file`` takes a
parquet file instead (every round writes it unchanged).

**Fault injection** (``--pause-at STEP``) wraps cowrite's functions *inside this process only*; production
code has no hooks. At STEP the writer writes ``--ready-file`` (JSON: pid, step, instant) and then waits
until ``--go-file`` exists (forever when none is given: the test kills it there). Steps, in protocol order:

============  ====================================================================================
claimed       holding the table lock to begin: ``.requested`` just created, no heartbeat yet
              (return of Table.claim_instant)
requested     ``.requested`` exists, heartbeat running, nothing planned (entry of Transaction.plan)
mid-write     ``.inflight`` planned, the first base file written, the others not (needs 2+ groups)
written       every base file written, commit not started, lock not held (entry of Transaction.commit)
locked        holding the table lock for the commit (entry of Transaction._publish)
published     the completed instant exists, the lock is still held (return of Transaction._publish)
============  ====================================================================================

``--fail-at lock-rescan`` injects a storage failure instead of a pause: the listing a filesystem lock makes
right after creating its ``lock<id>.acquired`` raises :class:`~cowrite.errors.StorageError` (once).

``--tries-file PATH --tries N`` touches PATH once this process has tried to take the filesystem lock N times
(so a test can wait for a long wait to have happened, instead of sleeping).

``--commit-log`` gets one JSON line per published instant, appended while the table lock is still held,
so the order of its lines is the order in which commits happened, across all processes.
``--turn-dir/--turn/--turns`` make several writers commit in a fixed round-robin order: each writes its
data freely, then waits for its turn file before committing and passes the turn on afterwards.
``--result`` receives a JSON summary when the process ends (not when it is killed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cowrite.cli import EXIT_CONFLICT, EXIT_ERROR, EXIT_LEASE_LOST, EXIT_LOCK_TIMEOUT, EXIT_UNKNOWN
from cowrite.errors import (
    CommitStateUnknownError,
    CowriteError,
    LeaseLostError,
    LockTimeoutError,
    StorageError,
    WriteConflictError,
)
from cowrite.format import config as keys
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.local import writer as local
from cowrite.local.writer import LocalWriter
from cowrite.protocol.locks import filesystem
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.storage.backend import Storage

STEPS = ("claimed", "requested", "mid-write", "written", "locked", "published")
FAILURES = ("lock-rescan",)
EXIT_PAUSE_TIMEOUT = 9

_EXIT_CODES: list[tuple[type[CowriteError], int]] = [
    (WriteConflictError, EXIT_CONFLICT),
    (LockTimeoutError, EXIT_LOCK_TIMEOUT),
    (LeaseLostError, EXIT_LEASE_LOST),
    (CommitStateUnknownError, EXIT_UNKNOWN),
]


def exit_code(exc: BaseException) -> int:
    return next((code for kind, code in _EXIT_CODES if isinstance(exc, kind)), EXIT_ERROR)


def write_atomically(path: Path, text: str) -> None:
    """Readers polling for ``path`` never see it half written."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def append_line(path: Path, payload: dict[str, Any]) -> None:
    # One write() on an O_APPEND file: lines of several processes never interleave.
    with open(path, "a") as stream:
        stream.write(json.dumps(payload, sort_keys=True) + "\n")


def wait_for(path: Path, timeout: float) -> None:
    """Poll until ``path`` exists; exit with EXIT_PAUSE_TIMEOUT if it does not appear in time."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            print(f"writer_process: {path} did not appear within {timeout} s", file=sys.stderr, flush=True)
            os._exit(EXIT_PAUSE_TIMEOUT)
        time.sleep(0.005)


class Pause:
    """Stops the writer once, at one step, until the test releases it (or kills it)."""

    def __init__(self, step: str | None, ready: Path | None, go: Path | None, timeout: float) -> None:
        self.step, self.ready, self.go, self.timeout = step, ready, go, timeout
        self.done = False

    def at(self, step: str, instant: str) -> None:
        if step != self.step or self.done:
            return
        self.done = True
        if self.ready is not None:
            write_atomically(self.ready, json.dumps({"pid": os.getpid(), "step": step, "instant": instant}))
        if self.go is None:
            time.sleep(self.timeout)
            os._exit(EXIT_PAUSE_TIMEOUT)
        wait_for(self.go, self.timeout)


class Turns:
    """A fixed commit order among ``count`` writers: writer ``index`` commits at turn index + k * count."""

    def __init__(self, directory: Path | None, index: int, count: int, timeout: float) -> None:
        self.directory, self.index, self.count, self.timeout = directory, index, count, timeout
        self.round = 0

    def _path(self, number: int) -> Path:
        assert self.directory is not None
        return self.directory / f"turn-{number}"

    def wait(self) -> None:
        if self.directory is not None:
            wait_for(self._path(self.round * self.count + self.index), self.timeout)

    def pass_on(self) -> None:
        if self.directory is not None:
            self._path(self.round * self.count + self.index + 1).touch()
            self.round += 1


def install_hooks(pause: Pause, turns: Turns, commit_log: Path | None, began: list[str]) -> None:
    """Wrap cowrite's protocol steps in this process; see the module docstring for the steps."""
    original_claim = Table.claim_instant
    original_begin = Transaction._begin
    original_plan = Transaction.plan
    original_commit = Transaction.commit
    original_publish = Transaction._publish
    original_write = local.write_file_group

    def claim_instant(self: Table, *args: Any, **kwargs: Any) -> Instant:
        instant = original_claim(self, *args, **kwargs)
        pause.at("claimed", instant.requested_time)
        return instant

    def _begin(self: Transaction) -> None:
        original_begin(self)
        began.append(self.instant_time)

    def plan(self: Transaction, *args: Any, **kwargs: Any) -> None:
        pause.at("requested", self.instant_time)
        original_plan(self, *args, **kwargs)

    def write_file_group(*args: Any, **kwargs: Any) -> Any:
        stat = original_write(*args, **kwargs)
        pause.at("mid-write", str(args[2] if len(args) > 2 else kwargs["instant"]))
        return stat

    def commit(self: Transaction, metadata: Any, *args: Any, **kwargs: Any) -> Instant:
        pause.at("written", self.instant_time)
        turns.wait()
        return original_commit(self, metadata, *args, **kwargs)

    def _publish(self: Transaction, metadata: Any, *args: Any, **kwargs: Any) -> Instant:
        pause.at("locked", self.instant_time)
        done = original_publish(self, metadata, *args, **kwargs)
        if commit_log is not None:
            append_line(
                commit_log,
                {
                    "pid": os.getpid(),
                    "instant": done.requested_time,
                    "completion": done.completion_time,
                    "lock_id": getattr(self.lock, "lock_id", None),
                    "wall": time.time(),
                },
            )
        pause.at("published", self.instant_time)
        return done

    Table.claim_instant = claim_instant  # type: ignore[method-assign]
    Transaction._begin = _begin  # type: ignore[method-assign]
    Transaction.plan = plan  # type: ignore[method-assign]
    Transaction.commit = commit  # type: ignore[method-assign]
    Transaction._publish = _publish  # type: ignore[method-assign]
    local.write_file_group = write_file_group


def inject_failure(failure: str, storage_class: type[Storage]) -> None:
    """Make the listing right after this process creates a lock file fail once (``lock-rescan``)."""
    assert failure == "lock-rescan"
    create, scan = storage_class.create_if_absent, filesystem._scan
    armed = {"now": False, "spent": False}

    def create_if_absent(self: Storage, path: str, data: bytes) -> bool:
        created = create(self, path, data)
        if created and path.startswith(filesystem.LOCK_DIR) and path.endswith(".acquired"):
            armed["now"] = not armed["spent"]
        return created

    def failing_scan(storage: Storage) -> Any:
        if armed["now"]:
            armed["now"], armed["spent"] = False, True
            raise StorageError(f"injected: listing {storage.full_path(filesystem.LOCK_DIR)} failed")
        return scan(storage)

    storage_class.create_if_absent = create_if_absent  # type: ignore[method-assign]
    filesystem._scan = failing_scan


def report_lock_tries(count: int, path: Path) -> None:
    """Touch ``path`` at the ``count``-th try to take a filesystem lock in this process."""
    try_acquire = filesystem.FileSystemLock._try_acquire
    tries = {"n": 0}

    def counted(self: filesystem.FileSystemLock) -> Any:
        tries["n"] += 1
        if tries["n"] == count:
            path.touch()
        return try_acquire(self)

    filesystem.FileSystemLock._try_acquire = counted  # type: ignore[method-assign]


def batch_table(spec: Any, round_number: int, rounds: int) -> pa.Table:
    groups = spec if isinstance(spec, list) else [spec]
    ids, parts, ts, values = [], [], [], []
    for group in groups:
        for key in group["keys"]:
            ids.append(f"{key}-r{round_number}" if rounds > 1 else str(key))
            parts.append(group["partition"])
            ts.append(int(group.get("ts", 0)))
            values.append(str(group["value"]))
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "part": pa.array(parts, pa.string()),
            "ts": pa.array(ts, pa.int64()),
            "value": pa.array(values, pa.string()),
        }
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="writer_process", description=__doc__.split("\n\n")[0])
    parser.add_argument("uri", help="table base path (local path, s3://...)")
    parser.add_argument("--operation", default="upsert", choices=[o.value for o in local.Operation])
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--batch", help="JSON rows spec (see the module docstring)")
    data.add_argument("--batch-file", type=Path, help="a parquet file with the rows")
    parser.add_argument("--rounds", type=int, default=1, help="commit this many instants, one after another")
    parser.add_argument("--lock-provider", help="hoodie.write.lock.provider (default: the table's setting)")
    parser.add_argument("-o", "--option", action="append", default=[], help="write setting KEY=VALUE")
    parser.add_argument("--storage-options", default="{}", help="JSON fsspec options (S3 endpoint, keys)")
    parser.add_argument("--clock-skew", type=float, default=0.0, help="seconds added to the writer's clock")
    parser.add_argument("--pause-at", choices=STEPS)
    parser.add_argument("--fail-at", choices=FAILURES, help="inject a storage failure (see the docstring)")
    parser.add_argument("--ready-file", type=Path, help="written when the pause begins")
    parser.add_argument("--go-file", type=Path, help="the pause ends when this file exists")
    parser.add_argument("--pause-timeout", type=float, default=60.0, help="exit 9 after pausing this long")
    parser.add_argument("--loaded-file", type=Path, help="touched once imports and the table are loaded")
    parser.add_argument("--start-file", type=Path, help="wait for this file before writing anything")
    parser.add_argument("--tries-file", type=Path, help="touched after --tries tries to take the lock")
    parser.add_argument("--tries", type=int, default=0)
    parser.add_argument("--commit-log", type=Path, help="append a JSON line per commit, under the lock")
    parser.add_argument("--turn-dir", type=Path, help="round-robin commit order: directory of turn files")
    parser.add_argument("--turn", type=int, default=0, help="this writer's place in the round-robin")
    parser.add_argument("--turns", type=int, default=1, help="number of writers in the round-robin")
    parser.add_argument("--result", type=Path, help="JSON summary written at exit")
    args = parser.parse_args(argv)
    if args.pause_at == "mid-write" and args.operation == "delete":
        parser.error("--pause-at mid-write needs a write that creates base files")
    return args


def settings(args: argparse.Namespace) -> dict[str, str]:
    values = {}
    for pair in args.option:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"writer_process: {pair!r} is not KEY=VALUE")
        values[name.strip()] = value.strip()
    if args.lock_provider:
        values[keys.LOCK_PROVIDER.key] = args.lock_provider
    return values


def run(args: argparse.Namespace) -> int:
    began: list[str] = []
    commits: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"pid": os.getpid(), "began": began, "commits": commits, "error": None}
    pause = Pause(args.pause_at, args.ready_file, args.go_file, args.pause_timeout)
    turns = Turns(args.turn_dir, args.turn, args.turns, args.pause_timeout)
    install_hooks(pause, turns, args.commit_log, began)
    code = 0
    try:
        table = Table.load(args.uri, **json.loads(args.storage_options))
        if args.fail_at is not None:
            inject_failure(args.fail_at, type(table.storage))
        if args.tries_file is not None:
            report_lock_tries(args.tries, args.tries_file)
        skew = args.clock_skew
        clock: Callable[[], float] = (lambda: time.time() + skew) if skew else time.time
        config = table.config.with_values(settings(args))
        writer = LocalWriter(table, WriteOptions(config=config, clock=clock))
        if args.loaded_file is not None:
            args.loaded_file.touch()
        if args.start_file is not None:
            wait_for(args.start_file, args.pause_timeout)
        for round_number in range(args.rounds):
            if args.batch_file is not None:
                data = pq.read_table(args.batch_file)
            else:
                data = batch_table(json.loads(args.batch), round_number, args.rounds)
            started = time.monotonic()
            try:
                instant = writer.write(data, args.operation)
            finally:
                turns.pass_on()
            commits.append(
                {
                    "instant": instant.requested_time,
                    "completion": instant.completion_time,
                    "seconds": time.monotonic() - started,
                    "rows": data.num_rows,
                }
            )
    except CowriteError as exc:
        code = exit_code(exc)
        summary["error"] = {
            "type": type(exc).__name__,
            "message": str(exc),
            **({"instant": exc.instant, "winner": exc.winner, "file_groups": exc.file_groups}
               if isinstance(exc, WriteConflictError) else {}),
        }
        print(f"writer_process: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    except Exception as exc:
        code = EXIT_ERROR
        summary["error"] = {"type": type(exc).__name__, "message": str(exc)}
        traceback.print_exc()
    summary["exit"] = code
    if args.result is not None:
        write_atomically(args.result, json.dumps(summary, sort_keys=True))
    return code


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(process)d %(name)s %(levelname)s %(message)s")
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
