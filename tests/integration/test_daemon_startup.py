"""``cowrite daemon`` stopped while it starts: a SIGTERM at any moment after the command began drains and
exits 0, as its help promises (an orchestrator stops pods that are still starting). The chaos harness's
daemon process keeps the same promise, or the harness would report the daemon's death as a violation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.daemon import (
    WAIT,
    Target,
    wait_until,
    writer,
)
from support.tables import rows

COWRITE = str(Path(sys.executable).parent / "cowrite")  # the installed command, as users start it


def interpreter_up(process: subprocess.Popen[Any]) -> bool:
    """Whether the Python interpreter of ``process`` has initialised: it handles SIGINT then (the kernel's
    SigCgt mask shows it). Before that moment no Python code can act on a signal; what is measured is
    the time from it."""
    if process.poll() is not None:
        return True
    status = Path(f"/proc/{process.pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(mask & (1 << (signal.SIGINT - 1)))


def _harness_daemon(tmp_path: Path, uri: str) -> list[str]:
    spec = tmp_path / "daemon.json"
    spec.write_text(json.dumps({"uri": uri}))
    return [sys.executable, str(ROOT / "bench" / "chaos" / "daemon_proc.py"), str(spec)]


@pytest.mark.parametrize("after", [0.2, 0.5, 1.0, "serving"])
def test_sigterm_while_the_daemon_starts_drains_and_exits_0(tmp_path: Path, after: float | str) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    writer(target.table()).insert(rows(["k1"]))
    with open(tmp_path / "stderr", "wb") as stderr:
        daemon = subprocess.Popen(
            [COWRITE, "daemon", target.uri, "--port", "0", "--poll-interval", "0.1"], stderr=stderr
        )
    try:
        wait_until(lambda: interpreter_up(daemon), "the interpreter")
        started = time.monotonic()
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


@pytest.mark.parametrize("after", [0.2, 0.5])
def test_the_chaos_harness_daemon_drains_on_sigterm_while_it_starts(tmp_path: Path, after: float) -> None:
    target = Target(str(tmp_path / "orders"))
    target.create()
    daemon = subprocess.Popen(
        _harness_daemon(tmp_path, target.uri),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: interpreter_up(daemon), "the interpreter")
        started = time.monotonic()
        time.sleep(max(0.0, started + after - time.monotonic()))
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=WAIT)
    finally:
        daemon.kill()
    assert daemon.returncode == 0, err
