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

**Fault injection** (``--pause-at STEP``) observes the protocol's steps (:mod:`cowrite.steps`) in this
process: at STEP the writer writes ``--ready-file`` (JSON: pid, step, instant) and then waits until
``--go-file`` exists (forever when none is given: the test kills it there). Steps, in protocol order (on
S3 a process writing alone goes ahead of the listing after its claim: from ``claimed`` on, its base file is
written and it may hold the lock):

============  ====================================================================================
claimed       holding the table lock to begin: ``.requested`` just created, no heartbeat yet
              (``Step.CLAIMED``)
requested     ``.requested`` exists, heartbeat running; nothing planned on local disk, on S3 the plan may be
              written: the local engine writes it beside the listing after its claim (``Step.REQUESTED``)
planned       ``.inflight`` planned, no base file written, lock not held (``Step.PLANNED``)
mid-write     ``.inflight`` planned, the first base file written, the others not (needs 2+ groups)
written       every base file written, commit not started; on local disk the lock is not held, on S3 it
              may be: the writer tries for it beside its last file (``Step.WRITTEN``)
locked        holding the table lock for the commit (``Step.LOCKED``)
published     the completed instant exists, the lock is still held (``Step.PUBLISHED``)
============  ====================================================================================

Between locked and published, ``recording-schema`` (``Step.RECORDING_SCHEMA``) is reached only by a commit
whose schema change readers that go by instant times would miss: its completed instant exists, and an
empty commit records the schema next.

``--fail-at lock-rescan`` injects a storage failure instead of a pause: the listing a filesystem lock makes
right after creating its ``lock<id>.acquired`` raises :class:`~cowrite.errors.StorageError` (once).

``--tries-file PATH --tries N`` touches PATH once this process has tried to take the filesystem lock N times
(so a test can wait for a long wait to have happened, instead of sleeping).

``--commit-log`` gets one JSON line per published instant, appended while the table lock is still held,
so the order of its lines is the order in which commits happened, across all processes.
``--turn-dir/--turn/--turns`` make several writers commit in a fixed round-robin order: each plans its
write freely, then waits for its turn file before writing its files and committing (the lock is not held
yet, whatever the storage), and passes the turn on afterwards.
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

from cowrite import steps
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
from cowrite.format.table import Table
from cowrite.local.writer import LocalWriter, Operation
from cowrite.protocol.locks import filesystem
from cowrite.protocol.transaction import WriteOptions
from cowrite.shutdown import exit_now
from cowrite.startup import refuse_pandas
from cowrite.steps import PAUSE_TIMED_OUT, Pause, Step
from cowrite.storage.backend import Storage

FAILURES = ("lock-rescan",)
EXIT_PAUSE_TIMEOUT = PAUSE_TIMED_OUT

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


def observe_steps(pause: Pause, turns: Turns, commit_log: Path | None) -> None:
    """Pause, take turns and log commits at the protocol steps (:mod:`cowrite.steps`) of this process."""

    def observer(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        pause(step, instant, details)
        if step is Step.PLANNED:
            turns.wait()
        elif step in (Step.PUBLISHED, Step.GROUPED) and commit_log is not None and not details.get("grouped"):
            # by the holder that published it, under the lock: the order of the lines is the commit order
            lock_id = getattr(details["lock"], "lock_id", None)
            entry = {"completion": details["completion"], "lock_id": lock_id, "wall": time.time()}
            append_line(commit_log, {"pid": os.getpid(), "instant": instant, **entry})

    steps.observe_forever(observer)


def inject_failure(failure: str, storage_class: type[Storage]) -> None:
    """Make the listing right after this process creates a lock file fail once (``lock-rescan``)."""
    assert failure == "lock-rescan"
    create, scan = storage_class.create_if_absent, filesystem.scan
    armed = {"now": False, "spent": False}

    def create_if_absent(self: Storage, path: str, data: bytes) -> bool:
        created = create(self, path, data)
        if created and path.startswith(filesystem.LOCK_DIR) and path.endswith(".acquired"):
            armed["now"] = not armed["spent"]
        return created

    def failing_scan(storage: Storage, fresh_for: float = 0.0) -> Any:
        if armed["now"]:
            armed["now"], armed["spent"] = False, True
            raise StorageError(f"injected: listing {storage.full_path(filesystem.LOCK_DIR)} failed")
        return scan(storage, fresh_for)

    storage_class.create_if_absent = create_if_absent  # type: ignore[method-assign]
    filesystem.scan = failing_scan


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
    parser.add_argument("--operation", default="upsert", choices=[o.value for o in Operation])
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--batch", help="JSON rows spec (see the module docstring)")
    data.add_argument("--batch-file", type=Path, help="a parquet file with the rows")
    parser.add_argument("--rounds", type=int, default=1, help="commit this many instants, one after another")
    parser.add_argument("--lock-provider", help="hoodie.write.lock.provider (default: the table's setting)")
    parser.add_argument("-o", "--option", action="append", default=[], help="write setting KEY=VALUE")
    parser.add_argument("--storage-options", default="{}", help="JSON fsspec options (S3 endpoint, keys)")
    parser.add_argument("--clock-skew", type=float, default=0.0, help="seconds added to the writer's clock")
    parser.add_argument("--pause-at", choices=[step.value for step in Step])
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
    commits: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"pid": os.getpid(), "commits": commits, "error": None}
    step = Step(args.pause_at) if args.pause_at else None
    pause = Pause(step, args.go_file, args.ready_file, args.pause_timeout)
    turns = Turns(args.turn_dir, args.turn, args.turns, args.pause_timeout)
    observe_steps(pause, turns, args.commit_log)
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
    refuse_pandas()  # as the cowrite command does: a writer without Spark starts sooner
    logging.basicConfig(level=logging.WARNING, format="%(process)d %(name)s %(levelname)s %(message)s")
    return run(parse_args(argv))


if __name__ == "__main__":
    exit_now(main())
