"""A lock contender for tests/test_locks.py, run as a separate process (or, for process-local providers,
called in a thread).

``python lock_worker.py sections SPEC``: take the lock ``SPEC["sections"]`` times; in each critical section
read-increment-write the counter file and log ``enter``/``exit`` lines, so the test can prove exclusion.

``python lock_worker.py hold SPEC``: take a filesystem lock for instant ``SPEC["instant"]`` with a running
heartbeat, print ``acquired <id>`` and sleep until killed.

SPEC is JSON: ``uri``, ``options`` (fsspec options), ``config`` (``hoodie.write.lock.*`` settings),
``heartbeat`` ([interval s, tolerable misses]), and the mode's own keys.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from cowrite.format.config import Config
from cowrite.protocol.heartbeat import Heartbeat, HeartbeatPolicy
from cowrite.protocol.locks import LockHolder, TableLock, lock_for
from cowrite.protocol.locks.lock_files import collect_garbage
from cowrite.shutdown import exit_now
from cowrite.startup import refuse_pandas
from cowrite.storage.backend import Storage


def _policy(spec: dict[str, Any]) -> HeartbeatPolicy:
    interval, misses = spec.get("heartbeat", (30.0, 2))
    return HeartbeatPolicy(interval=float(interval), tolerable_misses=int(misses))


def _lock(spec: dict[str, Any], storage: Storage, holder: LockHolder) -> TableLock:
    return lock_for(storage, Config(spec["config"]), holder, _policy(spec), spec.get("table", "table"))


def run_sections(spec: dict[str, Any]) -> None:
    storage = Storage.for_uri(spec["uri"], **spec.get("options", {}))
    lock = _lock(spec, storage, LockHolder())
    counter, log = Path(spec["counter"]), Path(spec["log"])
    for section in range(spec["sections"]):
        lock.acquire()
        try:
            _append(log, f"enter {lock.holder.owner} {section}\n")
            value = int(counter.read_text())
            time.sleep(0.001)  # widen the window a broken lock would let another writer into
            counter.write_text(str(value + 1))
            lock.check_held()
            _append(log, f"exit {lock.holder.owner} {section}\n")
        finally:
            lock.release()
        if spec.get("gc_keep") is not None:
            collect_garbage(storage, keep=spec["gc_keep"])


def _append(path: Path, line: str) -> None:
    # One write on an O_APPEND file: lines of several processes never interleave within a line.
    with open(path, "a") as stream:
        stream.write(line)


def hold(spec: dict[str, Any]) -> None:
    storage = Storage.for_uri(spec["uri"], **spec.get("options", {}))
    holder = LockHolder(instant=spec["instant"])
    Heartbeat(storage, spec["instant"], _policy(spec), holder.owner).start()
    lock = _lock(spec, storage, holder)
    lock.acquire()
    print(f"acquired {getattr(lock, 'lock_id', '?')}", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    refuse_pandas()  # as the cowrite command does: a process without Spark starts sooner
    mode, raw = sys.argv[1], sys.argv[2]
    {"sections": run_sections, "hold": hold}[mode](json.loads(raw))
    exit_now(0)
