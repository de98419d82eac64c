"""The daemon in a process of its own, for scenarios that kill it with SIGKILL mid-run.

``python bench/chaos/daemon_proc.py CONFIG.json``: the same :class:`~cowrite.daemon.service.Daemon` the
``cowrite daemon`` command runs, built from JSON so the harness can keep every lock file (``locks_kept``)
as evidence for the checker. SIGTERM drains and exits 0, also while it starts: run as a script (not with
``-m``, which would import the harness first), it catches the signal before importing the daemon.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cowrite import shutdown
from cowrite.startup import refuse_pandas

if TYPE_CHECKING:
    from cowrite.daemon.config import DaemonConfig


def config_from(spec: dict[str, Any]) -> DaemonConfig:
    from cowrite.daemon.config import DaemonConfig, TableEntry

    return DaemonConfig(
        tables=(TableEntry(spec["uri"], spec.get("name"), spec.get("settings", {})),),
        port=0,
        poll_interval=spec.get("poll", 0.1),
        clean_interval=spec.get("clean", 0.5),
        commits_retained=spec.get("commits_retained"),
        locks_kept=spec.get("locks_kept", 100_000),
    )


def main() -> int:
    stop = shutdown.catch()
    refuse_pandas()  # as ``cowrite daemon`` does
    from cowrite.daemon.service import Daemon

    logging.basicConfig(level=logging.WARNING, format="%(process)d %(name)s %(levelname)s %(message)s")
    daemon = Daemon(config_from(json.loads(Path(sys.argv[1]).read_text())))
    if not stop.is_set():  # asked to stop while starting: there is nothing to drain
        daemon.start(serve_http=False)
        Path(sys.argv[1] + ".started").touch()
    stop.wait()
    daemon.stop()
    return 0


if __name__ == "__main__":
    shutdown.exit_now(main())
