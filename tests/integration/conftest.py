"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon import Processes
from support.request_counts import ProxyProcess
from support.servers import S3Server


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Writer, lock-holder and daemon processes a test starts; every one still running is killed after it."""
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.cleanup()


@pytest.fixture(scope="module")
def proxy(s3_server: S3Server) -> Iterator[ProxyProcess]:
    """The S3 server behind a proxy that counts and traces every request (no delay)."""
    with ProxyProcess(s3_server.endpoint_url, delay=0.0) as running:
        yield running
