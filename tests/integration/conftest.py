"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon import Processes


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Writer, lock-holder and daemon processes a test starts; every one still running is killed after it."""
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.cleanup()
