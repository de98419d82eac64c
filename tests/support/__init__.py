"""What the tests share: servers, harness processes, hudi-rs reads, table fixtures.

``TESTS`` is the tests' root (on ``PYTHONPATH`` for harness processes: ``python -m support.<module>``);
``ROOT`` is the repository (``bench/``, the chart, the Dockerfile).
"""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """What ``condition`` returns once it is true, asked every 10 ms; :class:`AssertionError` naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
    return result

