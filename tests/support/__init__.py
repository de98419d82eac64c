"""What the tests share: servers, harness processes, hudi-rs reads, table fixtures.

``TESTS`` is the tests' root (on ``PYTHONPATH`` for harness processes: ``python -m support.<module>``);
``ROOT`` is the repository (``bench/``, the chart, the Dockerfile).
"""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
