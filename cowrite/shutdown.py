"""How a cowrite process stops: stop requests (SIGTERM, SIGINT) caught from its first moment, and its end.

An orchestrator stops processes that may still be starting: a Kubernetes rollout sends SIGTERM to a pod
whose daemon is still importing its modules. A process that installs its handler only once it is ready
dies of that signal (exit 143) instead of draining. So entry points call :func:`catch` before importing
anything slow, and the command, once started, waits on the event it returns: already set if the request
came early, in which case there is nothing to drain and the process exits 0.

A process whose work is done ends with :func:`exit_now`, without the interpreter's teardown. pyarrow's
native thread pools can abort that teardown (``terminate called without an active exception``,
apache/arrow#34314): a process that had committed would exit -6 instead of 0, now and then.

This module imports nothing of cowrite and nothing slow when it is imported; it holds the one
process-wide stop event.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import NoReturn

requested = threading.Event()


def catch() -> threading.Event:
    """Turn SIGTERM and SIGINT into :data:`requested` from now on (idempotent; main thread only)."""
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: requested.set())
    return requested


def exit_now(code: int) -> NoReturn:
    """End this process with exit code ``code`` once what it has done is safe: the requests it made in the
    background answered (a lock's release on an object store), its log handlers closed, its output
    flushed; then exit without the interpreter's teardown (no ``atexit`` handlers, no finalizers).

    For the ends of programs (the ``cowrite`` command, harness processes), never for a library call: the
    caller must have stopped what it started (heartbeats, Spark sessions) before."""
    from cowrite.storage.together import finish_background

    finish_background()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
