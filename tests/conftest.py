"""Shared fixtures: real servers for the session, and one fresh table root per test on every backend."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import settings
from support.servers import S3Server, SparkCluster, ZooKeeperServer
from support.spark import local_session

from cowrite.storage.backend import Storage

BACKENDS = ["local", "memory", "s3"]

# The fuzz tests check what a parser accepts, not how fast it is: a busy machine must not fail them.
settings.register_profile("cowrite", deadline=None)
settings.load_profile("cowrite")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """Moto's S3 server with one bucket, ``s3_server.bucket``."""
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """A Spark standalone cluster (a master and a two-core worker) whose worker has no AWS variables."""
    with SparkCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper server; connect to ``zookeeper_server.hosts``."""
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(params=BACKENDS)
def storage_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A table root no other test uses, on each backend in turn; nothing exists there yet."""
    name = f"cowrite-test-{uuid.uuid4().hex}"
    if request.param == "local":
        yield str(tmp_path / name)
    elif request.param == "memory":
        uri = f"memory://{name}"
        yield uri
        memory = fsspec.filesystem("memory")
        if memory.exists(uri):
            memory.rm(uri, recursive=True)
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        yield f"s3://{server.bucket}/{name}"


@pytest.fixture
def storage_options(request: pytest.FixtureRequest, storage_uri: str) -> dict[str, Any]:
    """fsspec options for ``storage_uri``: the S3 server's endpoint and keys, nothing for the others."""
    if storage_uri.startswith("s3://"):
        server: S3Server = request.getfixturevalue("s3_server")
        return server.storage_options()
    return {}


@pytest.fixture
def storage(storage_uri: str, storage_options: dict[str, Any]) -> Storage:
    return Storage.for_uri(storage_uri, **storage_options)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole test run (starting one takes 5-12 s), stopped at the end.

    Executors use this virtualenv's Python (pyarrow, cowrite) and bind the loopback interface only.
    """
    session = local_session(2, "1g")
    yield session
    session.stop()

