"""``cowrite daemon`` stopped while it starts: a SIGTERM at any moment after the command began drains and
exits 0, as its help promises (an orchestrator stops pods that are still starting)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon import WAIT, Target, rows, wait_until, writer

COWRITE = str(Path(sys.executable).parent / "cowrite")  # the installed command, as users start it


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (the kernel's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("after", [0.0, 0.2, 0.5, 1.0, "serving"])
def test_sigterm_while_the_daemon_starts_drains_and_exits_0(tmp_path: Path, after: float | str) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    writer(target.table()).insert(rows(["k1"]))
    started = time.monotonic()
    with open(tmp_path / "stderr", "wb") as stderr:
        daemon = subprocess.Popen(
            [COWRITE, "daemon", target.uri, "--port", "0", "--poll-interval", "0.1"], stderr=stderr
        )
    try:
        # The earliest moment cowrite can act on a signal is once its entry point runs; before that, the
        # interpreter itself is starting and the kernel's default action applies.
        wait_until(lambda: daemon.poll() is not None or catches_sigterm(daemon.pid), "the handler")
        if after == "serving":  # started: its first poll is running or done
            wait_until(lambda: "serving 1 tables" in (tmp_path / "stderr").read_text(), "serving")
        else:
            assert isinstance(after, float)
            time.sleep(max(0.0, started + after - time.monotonic()))
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(WAIT)
    finally:
        daemon.kill()
    err = (tmp_path / "stderr").read_text()
    assert code == 0, err
    assert "Traceback" not in err
    assert json.loads(err.splitlines()[-1])["event"] == "stopped"
