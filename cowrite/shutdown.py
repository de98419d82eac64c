"""Stop requests (SIGTERM, SIGINT) for long-running processes, caught from their first moment.

An orchestrator stops processes that may still be starting: a Kubernetes rollout sends SIGTERM to a pod
whose daemon is still importing its modules. A process that installs its handler only once it is ready
dies of that signal (exit 143) instead of draining. So entry points call :func:`catch` before importing
anything slow, and the command, once started, waits on the event it returns: already set if the request
came early, in which case there is nothing to drain and the process exits 0.

This module imports nothing of cowrite and nothing slow; it holds the one process-wide stop event.
"""

from __future__ import annotations

import signal
import threading

requested = threading.Event()


def catch() -> threading.Event:
    """Turn SIGTERM and SIGINT into :data:`requested` from now on (idempotent; main thread only)."""
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: requested.set())
    return requested
